"""The ping-pong benchmark command works end to end (structure only; speed is judged by the
benchmark itself, never here)."""
import json
import subprocess
import sys

from conftest import REPO


def test_pingpong_quick_writes_json_and_markdown(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "pingpong.py"), "--quick",
                           "--sizes", "8,65536", "--out-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((tmp_path / "pingpong_quick.json").read_text())
    assert data["sizes"] == [8, 65536]
    assert set(data["methods"]) == {"raw", "channel", "channel_notrace", "channel_mpi", "pickle", "dask", "memcpy"}
    for row in data["rows"]:
        for m in data["methods"]:
            assert row[f"{m}_latency_us"] > 0, (m, row)
            assert row[f"{m}_ratio_to_raw"] > 0
    names = [t["target"] for t in data["targets"]]
    assert any("8 B latency" in n for n in names) and any("64 KiB" in n for n in names)
    assert all(t["status"] in ("PASS", "FAIL") for t in data["targets"])
    md = (tmp_path / "pingpong_quick.md").read_text()
    assert "| size |" in md and "## Targets" in md
