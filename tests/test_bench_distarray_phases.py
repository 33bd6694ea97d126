"""``benchmarks/distarray_phases.py``, the per-rank phase breakdown of one NumPy program: every hooked phase of the
engine is measured (a hook that stops firing shows as a zero here), the derived phases add up, and bad input is
refused with a message that says what to write (structure only; no timing is judged)."""
import json
import os
import subprocess
import sys

from conftest import REPO

TOOL = str(REPO / "benchmarks" / "distarray_phases.py")


def _tool(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def test_phases_of_a_program_on_two_ranks(tmp_path, kernel_cache):
    env = dict(os.environ, NBMPI_DISTARRAY_CACHE=kernel_cache)
    proc = _tool("gauss_elimination", "--size", "n=60", "--quick", "--out-dir", str(tmp_path), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((tmp_path / "distarray_phases_gauss_elimination.json").read_text())
    assert data["ranks"] == 2 and data["sizes"]["n"] == 60 and data["numpy_median_s"] > 0
    assert [len(r) for r in data["runs"]] == [2, 2]               # the first run and one warm run, per rank
    for runs in data["runs"]:
        for ph in runs:
            # every hook fired: the program forces (argmax, back substitution) and fuses, lowers, runs units
            for p in ("program", "recording", "force_points", "agreement_hash", "fusion", "lowering",
                      "execution"):
                assert ph[p] > 0, (p, ph)
            assert all(ph[p] >= 0 for p in ph), ph
            assert abs(ph["recording"] + ph["force_points"] - ph["program"]) < 1e-9
            parts = sum(ph[p] for p in ("agreement_hash", "fusion", "lowering", "dependencies", "execution",
                                        "disposal", "other"))
            assert abs(parts - ph["force_points"]) < 1e-6, ph
            assert ph["waiting"] <= ph["execution"] and ph["gc_recording"] <= ph["recording"]
    assert data["warm_median"] == [runs[1] for runs in data["runs"]]   # one warm run: its median is itself
    md = (tmp_path / "distarray_phases_gauss_elimination.md").read_text()
    assert "| lowering |" in md and "rank 1 first run" in md


def test_bad_input_is_refused_with_what_to_write():
    proc = _tool("no_such_program", "--quick")
    assert proc.returncode != 0 and "the programs are:" in proc.stderr and "lu_decomposition" in proc.stderr
    proc = _tool("gauss_elimination", "--size", "n", "--quick")
    assert proc.returncode != 0 and "write NAME=VALUE" in proc.stderr
