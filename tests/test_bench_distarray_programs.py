"""The NumPy-programs section of the distributed-arrays benchmark (``benchmarks/distarray.py --programs-only``)
works end to end: every way ran every program (or says why not), the results were checked against NumPy's,
and the targets are computed from the measured numbers (structure and consistency only; speed is judged by
the benchmark itself, never here)."""
import json
import statistics
import subprocess
import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from distarray_programs import PROGRAM_DIR, QUICK_SIZES, FULL_SIZES, program_source  # noqa: E402


def test_every_program_has_a_size_line_the_benchmark_can_set():
    stems = sorted(p.stem for p in PROGRAM_DIR.glob("*.py"))
    assert stems == sorted(FULL_SIZES), "every program needs a benchmark size"
    for name in stems:
        src = program_source(name, "numpy", FULL_SIZES[name])
        line = [ln for ln in src.splitlines() if ln.endswith("# size")][0]
        for key, value in FULL_SIZES[name].items():
            assert f"{value!r}" in line and key in line.split("=")[0], (name, line)
        # only the size line and the import differ from the program as written
        written = (PROGRAM_DIR / f"{name}.py").read_text().splitlines()
        swapped = program_source(name, "nbmpi.workers.distarray", FULL_SIZES[name]).splitlines()
        diff = [(a, b) for a, b in zip(written, swapped) if a != b]
        assert len(written) == len(swapped) and 1 <= len(diff) <= 2, (name, diff)


def test_programs_quick_runs_three_ways_and_derives_targets(tmp_path, kernel_cache):
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "distarray.py"), "--programs-only", "--quick",
                           "--out-dir", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((tmp_path / "distarray_programs_quick.json").read_text())
    prog = data["programs"]
    assert sorted(prog["numpy"]) == sorted(QUICK_SIZES)
    assert prog["launch_exit_codes"] == [0, 0]
    for name in QUICK_SIZES:
        np_row, cold, reused = prog["numpy"][name], prog["nbmpi"][name], prog["nbmpi_reused_cache"][name]
        assert np_row["median_s"] == statistics.median(np_row["rounds_s"]) > 0
        assert "error" not in cold, cold
        assert cold["first_s"] > 0 and cold["median_s"] == statistics.median(cold["rounds_s"]) > 0
        assert reused["first_s"] > 0 and "rounds_s" not in reused           # the second launch: first runs only
        assert prog["checks"][name]["equal"], (name, prog["checks"][name])
        # the second launch found the kernels the first compiled: it compiled none of its own
        assert reused["stats_rank0"]["kernels_compiled"] == 0, reused["stats_rank0"]
        dk = prog["dask"][name]
        assert ("median_s" in dk and dk["median_s"] > 0) or dk["error"], dk
    # dask.array has no mgrid: the program is reported n/a with the reason, not rewritten
    assert "mgrid" in prog["dask"]["xray"].get("error", ""), prog["dask"]["xray"]
    targets = {t["target"]: t for t in data["targets"]}
    ratios = [prog["nbmpi"][n]["median_s"] / prog["numpy"][n]["median_s"] for n in QUICK_SIZES]
    worst = [t for n, t in targets.items() if "worst program" in n and "NumPy" in n][0]
    assert abs(worst["measured"] - max(ratios)) <= 1e-12 * max(ratios)
    med = [t for n, t in targets.items() if n.startswith("programs: median")][0]
    assert abs(med["measured"] - statistics.median(ratios)) <= 1e-12 * max(ratios)
    for t in data["targets"]:
        ok = t["measured"] >= t["limit"] if t["direction"] == ">=" else t["measured"] <= t["limit"]
        assert t["status"] == ("PASS" if ok else "FAIL"), t
    md = (tmp_path / "distarray_programs_quick.md").read_text()
    assert "## NumPy programs" in md and "xray" in md and "n/a: AttributeError" in md
    # the machine's parallel capacity, measured before and after the programs, derived from its own times
    for when in ("start", "end"):
        cap = data["run"][f"parallel_capacity_{when}"]
        assert len(cap["at_once"]) == 2
        for kind in ("python", "memory"):
            times = [b[f"{kind}_s"] for b in cap["at_once"]]
            assert cap["alone"][f"{kind}_s"] > 0 and min(times) > 0
            assert abs(cap[f"{kind}_capacity"] - 2 * cap["alone"][f"{kind}_s"] / (sum(times) / 2)) < 1e-9
            assert f"{cap[kind + '_capacity']:.2f} for" in md
