"""The ping-pong benchmark command works end to end and computes its targets from what it measured
(structure and consistency only; speed is judged by the benchmark itself, never here)."""
import json
import subprocess
import sys

from conftest import REPO


def test_pingpong_quick_runs_separate_launches_and_derives_targets(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "pingpong.py"), "--quick", "--runs", "2",
                           "--sizes", "8,65536", "--no-dask", "--out-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((tmp_path / "pingpong_quick.json").read_text())
    assert data["sizes"] == [8, 65536] and data["runs"] == 2 and len(data["raw_runs"]) == 2
    # every run measured every method at every size, cold and warm
    for run in data["raw_runs"]:
        for m in ("raw", "raw_inplace", "channel", "channel_notrace", "channel_mpi", "raw_used", "channel_used"):
            for s in ("8", "65536"):
                st = run["warm"][m][s]
                assert st["blocks"] >= 2 and 0 < st["min"] <= st["median"] <= st["max"], (m, s, st)
        for s in ("8", "65536"):
            assert all(run["cold"][s][k] > 0 for k in ("first_raw_s", "first_channel_s", "create_raw_s",
                                                          "create_channel_s"))
    warm = data["analysis"]["warm"]["65536"]
    per_run = warm["channel_ratio_to_raw_per_run"]
    assert len(per_run) == 2
    spread = warm["ratio_to_raw"]["channel"]
    assert spread["min"] == min(per_run) and spread["max"] == max(per_run)
    assert spread["min"] <= spread["median"] <= spread["max"]
    # the per-run ratio is the raw median over the channel median of that run's blocks
    for i, run in enumerate(data["raw_runs"]):
        expect = run["warm"]["raw"]["65536"]["median"] / run["warm"]["channel"]["65536"]["median"]
        assert abs(per_run[i] - expect) < 1e-12 * expect
    # the targets are evaluated from those numbers: worst run, PASS iff the limit holds
    targets = {t["target"]: t for t in data["targets"]}
    worst = targets["channel/raw throughput at 64 KiB, worst of 2 runs"]
    assert worst["measured"] == spread["min"] and worst["limit"] == 1.0
    inplace = targets["channel/raw (one buffer) throughput at 64 KiB, worst of 2 runs"]
    assert inplace["measured"] == warm["channel_ratio_to_raw_inplace"]["min"]
    used = targets["channel/raw throughput with the data used at 64 KiB, worst of 2 runs"]
    assert used["measured"] == min(warm["channel_used_ratio_to_raw_used_per_run"])
    for i, run in enumerate(data["raw_runs"]):
        expect = run["warm"]["raw_used"]["65536"]["median"] / run["warm"]["channel_used"]["65536"]["median"]
        assert abs(warm["channel_used_ratio_to_raw_used_per_run"][i] - expect) < 1e-12 * expect
    for t in data["targets"]:
        ok = t["measured"] >= t["limit"] if t["direction"] == ">=" else t["measured"] <= t["limit"]
        assert t["status"] == ("PASS" if ok else "FAIL"), t
    assert any("8 B latency" in n for n in targets)
    assert data["machine"]["commit"] and "loadavg" in data["machine"]
    md = (tmp_path / "pingpong_quick.md").read_text()
    assert "min / median / max over the runs" in md and "## Cold" in md and "## Targets" in md
    assert "at commit `" in md
