"""The pool's shared-memory sentinel on real processes and a real /dev/shm file: it removes a noted
segment once its owner's pipe closed and no live process maps it, never while one still does."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid


from nbmpi.workers.launch import shm_sentinel

_MAPPER = """
import mmap, sys, time
f = open(sys.argv[1], "r+b")
m = mmap.mmap(f.fileno(), 4096)
print("mapped", flush=True)
time.sleep(600)
"""


def test_sentinel_waits_for_the_last_mapping_then_removes_the_noted_segment(tmp_path):
    seg = f"/dev/shm/nbmpi-sentinel-test-{uuid.uuid4().hex[:8]}"
    other = f"/dev/shm/nbmpi-sentinel-test-{uuid.uuid4().hex[:8]}"   # not noted: never touched
    status = tmp_path / "status"
    status.mkdir()
    for path in (seg, other):
        with open(path, "wb") as f:
            f.truncate(4096)
    mapper = subprocess.Popen([sys.executable, "-c", _MAPPER, seg], stdout=subprocess.PIPE, text=True)
    sentinel = None
    try:
        assert mapper.stdout.readline().strip() == "mapped"
        sentinel = shm_sentinel.start(str(status))
        assert sentinel is not None
        (status / "rank-0.shm").write_text(seg + "\n")
        time.sleep(2 * shm_sentinel.POLL_S + 0.5)   # it has read the note
        (status / "rank-0.shm").unlink()            # (a restart empties the directory: the note is kept)
        shm_sentinel.end(sentinel, wait=1.0)        # the owner is gone; the mapper still maps the segment
        assert sentinel.proc.poll() is None, "the sentinel ended while the noted segment was still mapped"
        assert os.path.exists(seg), "the sentinel removed a segment a live process maps"
        mapper.send_signal(signal.SIGKILL)
        mapper.wait(timeout=10)
        sentinel.proc.wait(timeout=shm_sentinel.LINGER_S)
        assert not os.path.exists(seg), "the noted segment was left after its last mapping ended"
        assert os.path.exists(other), "the sentinel removed a segment nobody noted"
    finally:
        for proc in (mapper, sentinel.proc if sentinel else None):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        for path in (seg, other):
            if os.path.exists(path):
                os.unlink(path)
