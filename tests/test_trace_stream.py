"""Streamed per-rank traces under real mpiexec (`nbmpi run` with NBMPI_TRACE_OUT, as controller jobs
run): a rank's live file says what it is blocked in while it is blocked, the joined stream equals the
gathered trace at the end, and a failed job still leaves its streamed events."""
import json

from conftest import assert_ok
from nbmpi.workers.tracing.stream import live_path, read_job_trace

HANG_THEN_GO = r'''
import json, os, sys, time
import numpy as np
from nbmpi.workers import ArrayChannel, world
r = world().Get_rank()
out = os.environ["NBMPI_TRACE_OUT"]
ch = ArrayChannel((10,), np.float64)
for i in range(50):
    if r == 0:
        ch.put(1); ch.take(1)
    else:
        ch.take(0); ch.put(0)
if r == 0:
    # rank 1 is now blocked in take(src=0): wait until its streamed live state says so, then release it
    deadline = time.monotonic() + 60
    while True:
        try:
            with open(os.path.join(out, "rank-1.live.json")) as f:
                st = json.load(f)
        except (FileNotFoundError, ValueError):
            st = None
        if st and st["waiting"] and st["waiting"]["op"] == "take(src=0)":
            break
        assert time.monotonic() < deadline, st
        time.sleep(0.02)
    print("SEEN " + json.dumps(st), flush=True)
    ch.put(1)
else:
    ch.take(0)
if r == 1 and len(sys.argv) > 1:
    raise SystemExit(3)
'''


def test_live_wait_then_stream_equals_gathered_trace(run_mpi, tmp_path):
    out = tmp_path / "trace"
    proc = run_mpi(HANG_THEN_GO, n=2, env={"NBMPI_TRACE_OUT": str(out), "NBMPI_TRACE_STREAM_INTERVAL": "0.05"})
    assert_ok(proc)
    seen = json.loads(proc.stdout.split("SEEN ", 1)[1].splitlines()[0])
    assert seen["waiting"]["op"] == "take(src=0)" and seen["waiting"]["peer"] == 0 and not seen["done"]
    assert seen["rows"] >= 98 and seen["now_ns"] >= seen["waiting"]["since_ns"] >= seen["start_ns"]
    jt = read_job_trace(out, 2)
    assert jt.done and jt.waits() == [] and all(s["waiting"] is None for s in jt.live)
    summary = json.loads((out / "summary.json").read_text())          # the gathered trace at exit
    assert [r["events"] for r in summary["ranks"]] == [int((jt.trace.ranks == r).sum()) for r in range(2)]
    assert summary["messages"] == jt.trace.summary()["messages"] and summary["bytes"][0][1] == 51 * 80
    assert jt.trace.unmatched == 0 and len(jt.trace.flow_pairs) == 101
    chrome = json.loads((out / "trace.json").read_text())
    assert sum(1 for e in chrome["traceEvents"] if e.get("flow_out")) == len(jt.trace.flow_pairs)
    assert read_job_trace(tmp_path / "nothing", 2) is None


def test_failed_rank_still_leaves_its_stream(run_mpi, tmp_path):
    out = tmp_path / "trace"
    proc = run_mpi(HANG_THEN_GO, n=2, env={"NBMPI_TRACE_OUT": str(out)}, args=("fail",))
    assert proc.returncode == 3, proc.stderr
    assert not (out / "trace.json").exists()                            # not gathered: a rank failed
    jt = read_job_trace(out, 2)
    assert json.loads(live_path(out, 1).read_text())["done"]
    assert int((jt.trace.ranks == 1).sum()) == 101 and len(jt.trace.flow_pairs) == 101
