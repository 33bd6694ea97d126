"""The cell round-trip / pool start benchmark command works end to end and evaluates its targets
(structure only: whether a target passes depends on the machine and is judged by the benchmark)."""
import json
import subprocess
import sys

from conftest import REPO


def test_cell_roundtrip_quick_writes_json_and_markdown(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "cell_roundtrip.py"), "--quick", "--reps", "5",
                           "--out-dir", str(tmp_path)], capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((tmp_path / "cell_roundtrip_quick.json").read_text())
    assert set(data["roundtrip_ms"]) == {"px", "distributed"} and data["reps"] == 5
    assert all(v["median"] > 0 for v in data["roundtrip_ms"].values())
    assert set(data["start_s"]) == {"ipyparallel", "start", "restart"} and data["rounds"] == 1
    assert all(len(v["all"]) == 1 and v["median"] > 0 for v in data["start_s"].values())
    assert len(data["targets"]) == 3 and all(t["status"] in ("PASS", "FAIL") for t in data["targets"])
    assert all(t["measured"] > 0 for t in data["targets"])
    md = (tmp_path / "cell_roundtrip_quick.md").read_text()
    assert "%%distributed / %%px" in md and "%distributed restart" in md and "## Targets" in md
