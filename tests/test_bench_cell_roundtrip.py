"""The cell round-trip benchmark command works end to end (structure only; the 1.2x target is
judged by the benchmark itself, never here)."""
import json
import subprocess
import sys

from conftest import REPO


def test_cell_roundtrip_quick_writes_json_and_markdown(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "cell_roundtrip.py"), "--quick", "--reps", "5",
                           "--out-dir", str(tmp_path)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((tmp_path / "cell_roundtrip_quick.json").read_text())
    assert set(data["roundtrip_ms"]) == {"px", "distributed"} and data["reps"] == 5
    assert all(v["median"] > 0 for v in data["roundtrip_ms"].values())
    assert data["ratio_distributed_to_px"] > 0 and len(data["pool_start_s"]) == 1
    assert [t["status"] in ("PASS", "FAIL") for t in data["targets"]] == [True]
    md = (tmp_path / "cell_roundtrip_quick.md").read_text()
    assert "%%distributed / %%px" in md and "## Targets" in md
