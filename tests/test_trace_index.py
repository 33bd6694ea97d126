"""Traces of finished jobs served from their index by a real `nbmpi serve` (real mpiexec jobs, the real
tracer and streamer): a 4 M-event trace within the memory bound while /api/health keeps answering;
trace files rewritten into garbage give "trace unreadable", never a 500; a hung job's open wait is in
the headline and the per-rank numbers; failed, cancelled and timed-out jobs get a Chrome trace."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from test_server import Server, job_processes, submit, wait_state

#: Each rank records this many events with the real tracer (no MPI traffic: put/take pairs on a fake
#: clock 1 us apart), the real streamer writes them; rank 1 then fails, once rank 0 has streamed all
#: its events and ended (the ranks gather nothing).
BIG_JOB = """
import sys, time
from nbmpi.workers.tracing.tracer import DIR_RECV, DIR_SEND, get_tracer, register_kind
n = int(sys.argv[1])
tr = get_tracer()
r, peer = tr.rank, 1 - tr.rank
put, take = register_kind("put"), register_kind("take")
rec, t = tr.record, time.perf_counter_ns()
for i in range(n // 2):
    b = t + 1000 * i
    if r == 0:
        rec(put, DIR_SEND, peer, 7, 800, b, b + 300, -1, -1, 1)
        rec(take, DIR_RECV, peer, 7, 800, b + 500, b + 900, -1, -1, 1)
    else:
        rec(take, DIR_RECV, peer, 7, 800, b + 100, b + 400, -1, -1, 1)
        rec(put, DIR_SEND, peer, 7, 800, b + 600, b + 700, -1, -1, 1)
print("recorded", tr.n, "dropped", tr.dropped, flush=True)
if r == 1:   # fail only once rank 0 streamed everything and ended (else mpiexec ends it early)
    import json, os
    done = os.path.join(os.environ["NBMPI_TRACE_OUT"], "rank-0.live.json")
    deadline = time.monotonic() + 600
    while not json.load(open(done)).get("done") and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2.0)
sys.exit(5 if r == 1 else 0)
"""
GARBAGE_JOB = """
import os
from nbmpi.workers import ArrayChannel, world
import numpy as np
r = world().Get_rank()
ch = ArrayChannel((10,), np.float64)
(ch.put(1) if r == 0 else ch.take(0))
out = os.environ["NBMPI_TRACE_OUT"]
import time; time.sleep(1.5)                     # the streamer wrote the event
with open(os.path.join(out, f"rank-{r}.events"), "wb") as f:
    f.write(os.urandom(88 * 50 + 13))
with open(os.path.join(out, f"rank-{r}.live.json"), "w") as f:
    f.write('{"rank": ' + str(r) + ', "gar')
os._exit(0)                                      # no clean end: the streamer never rewrites them
"""
HUNG_JOB = """
import time
import numpy as np
from nbmpi.workers import ArrayChannel, world
r = world().Get_rank()
ch = ArrayChannel((10,), np.float64)
ch.put(1) if r == 0 else ch.take(0)              # one message, so the job has events
if r == 1:
    ch.take(0)                                   # rank 0 never sends again
else:
    time.sleep(600)
"""
DEADLOCK_JOB = """
import numpy as np
from nbmpi.workers import ArrayChannel, world
r = world().Get_rank()
ch = ArrayChannel((10,), np.float64)
ch.take(1 - r)                                   # both take first: a deadlock
"""
ENV = {"NBMPI_TRACE_STREAM_INTERVAL": "0.1", "NBMPI_TIMEOUT": "600"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("tix") / "data", max_ranks=2).start()
    yield srv
    srv.stop()
    assert job_processes(srv.data_dir) == []


def _available(c: httpx.Client, jid: int, what: str = "figure", timeout: float = 600, **params) -> dict:
    """The job's figure (or window) once its index is built."""
    deadline = time.monotonic() + timeout
    while True:
        r = c.get(f"/api/v1/dashboard/jobs/{jid}/{what}", params=params)
        assert r.status_code == 200, r.text
        a = r.json()
        if a["available"] or "being indexed" not in (a.get("reason") or ""):
            return a
        assert time.monotonic() < deadline, f"job {jid}'s trace still being indexed after {timeout} s"


def _busy(seg: dict) -> float:
    """A time inside the events: the start of the middle one of the figure's pixels that merge several
    intervals (the first such pixel may hold events only at its right end)."""
    lefts = [left for left, n in zip(seg["left"], seg["count"]) if n > 1]
    assert lefts, "the figure merged nothing"
    return sorted(lefts)[len(lefts) // 2]


#: The probe's own process: asks /api/health every 50 ms until stdin closes; prints one line per answer,
#: "STATUS START END" (CLOCK_MONOTONIC seconds, which ``time.perf_counter`` reads in every process on Linux),
#: or "error REPR START END".
_PROBE = r"""
import sys, threading, time
import httpx
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
with httpx.Client(base_url=sys.argv[1], timeout=30) as c:
    while not stop.is_set():
        t = time.clock_gettime(time.CLOCK_MONOTONIC)
        try:
            line = str(c.get("/api/health").status_code)
        except httpx.HTTPError as exc:
            line = "error " + repr(exc).replace(" ", "_")
        print(line, t, time.clock_gettime(time.CLOCK_MONOTONIC), flush=True)
        stop.wait(0.05)
"""


class HealthProbe:
    """Asks /api/health every 50 ms from a process of its own (as a monitoring client would: the threads
    of the process that runs the test or benchmark cannot delay it); after the ``with`` block, keeps each
    answer's status and latency (``samples``), when it came (``times``, ``time.perf_counter`` s) and the
    failed requests (``errors``)."""

    def __init__(self, url: str):
        self.url, self.samples, self.errors, self.times = url, [], [], []
        self._proc = None

    def __enter__(self):
        self._proc = subprocess.Popen([sys.executable, "-c", _PROBE, self.url], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True)
        return self

    def __exit__(self, *exc):
        try:
            out, _ = self._proc.communicate(input="", timeout=60)
        finally:
            if self._proc.poll() is None:
                self._proc.kill()
                self._proc.wait()
        for line in out.splitlines():
            what, start, end = line.rsplit(" ", 2)
            if what.startswith("error "):
                self.errors.append(what[len("error "):])
            else:
                self.samples.append((int(what), float(end) - float(start)))
                self.times.append(float(end))


def test_four_million_events_from_the_index(server):
    events = 4_000_000
    with server.client() as c:
        job = submit(c, BIG_JOB, args=[str(events // 2)], env=ENV)
        job = wait_state(c, job["id"], ("failed", "succeeded"), timeout=600)
        assert job["state"] == "failed" and job["rank_exit_codes"] == [0, 5]
        with HealthProbe(server.url) as probe:
            fig = _available(c, job["id"], width=1200)
            seg = fig["sources"]["nbmpi_segments"]
            busy = _busy(seg)
            windows = [c.get(f"/api/v1/dashboard/jobs/{job['id']}/timeline",
                             params=dict(start=busy, end=busy + span, width=1200)).json() for span in (0.1, 1e-5)]
            rss = psutil.Process(server.proc.pid).memory_info().rss
        assert not probe.errors and probe.samples and all(s == 200 for s, _ in probe.samples)
        assert rss <= 200 * 2**20, f"the controller holds {rss / 2**20:.0f} MB after serving a 4 M-event trace"
        assert fig["available"], fig
        meta, an = fig["meta"], fig["analysis"]
        assert meta["events"] == events and an["events"] == events
        assert [r["events"] for r in an["ranks"]] == [events // 2, events // 2]
        assert meta["merged"] and meta["shown"] <= 2 * 1200 * 2      # at most two rows per lane and pixel
        # each rank records on its own time base, so which rank waits depends on which one started first
        assert 0 < sum(r["wait_s"] for r in an["ranks"])
        assert all(r["wait_by_kind"].keys() <= {"put", "take"} for r in an["ranks"])
        assert an["messages"] == [[0, events // 4], [events // 4, 0]]
        assert fig["item"] and fig["sources"]["nbmpi_matrix"]["messages"] == [0, events // 4, events // 4, 0]
        # a window of 10 us holds a few segments, labelled with their calls (one narrower than its
        # 8 ns pixel, e.g. a wait of a few ns where the ranks' time bases meet, is merged alone)
        tiny = windows[1]
        calls = set(tiny["sources"]["nbmpi_segments"]["call"])
        assert tiny["meta"]["in_window"] < 1000 and {"put(dest=1)", "take(src=1)"} & calls, calls
        assert windows[0]["meta"]["end_s"] == pytest.approx(busy + 0.1) and windows[0]["meta"]["in_window"] > 10**5
        # the whole trace as a file Trace.load reads
        r = c.get(f"/api/v1/dashboard/jobs/{job['id']}/trace.npz")
        assert r.status_code == 200 and len(r.content) > events * 88
        assert psutil.Process(server.proc.pid).memory_info().rss <= 200 * 2**20
        # too many events for a Chrome trace viewer: said plainly, not a 500
        t = c.get(f"/api/v1/jobs/{job['id']}/trace")
        assert t.status_code == 404 and "more than the controller turns into a Chrome trace" in t.json()["detail"], t.text


def test_garbage_trace_files_are_unreadable_not_500(server):
    with server.client() as c:
        job = submit(c, GARBAGE_JOB, env=ENV)
        job = wait_state(c, job["id"], ("failed", "succeeded"), timeout=120)
        for what in ("figure", "timeline"):
            a = _available(c, job["id"], what)
            assert not a["available"] and a["reason"].startswith("trace unreadable: "), a
        for path in ("dashboard/jobs/{}/trace.npz", "jobs/{}/trace", "jobs/{}/summary"):
            r = c.get("/api/v1/" + path.format(job["id"]))
            assert r.status_code == 404 and "trace unreadable" in r.json()["detail"], r.text
        assert c.get("/api/health").status_code == 200


def test_hung_job_counts_its_open_wait_and_keeps_a_trace_when_cancelled(server):
    with server.client() as c:
        job = submit(c, HUNG_JOB, env=ENV)
        jid = job["id"]
        deadline = time.monotonic() + 120
        while True:
            a = c.get(f"/api/v1/dashboard/jobs/{jid}/timeline").json()
            if a.get("waits") and a["waits"][0]["for_s"] >= 3:
                break
            assert time.monotonic() < deadline, a
            time.sleep(0.3)
        r1 = a["analysis"]["ranks"][1]
        assert a["waits"][0]["rank"] == 1 and a["waits"][0]["op"] == "take(src=0)"
        assert r1["wait_frac"] > 0.5 and r1["wait_by_kind"]["take"] >= 2.5          # the open wait, counted
        assert a["analysis"]["open_waits"] == 1
        assert "no rank waits" not in a["sentence"] and "rank 1 waits" in a["sentence"], a["sentence"]
        frac = a["sources"]["nbmpi_fractions"]
        assert frac["wait"][1] > 50 and frac["wait_text"][1] != "wait 0.0%"
        assert c.delete(f"/api/v1/jobs/{jid}").json()["state"] == "cancelled"
        t = c.get(f"/api/v1/jobs/{jid}/trace")
        assert t.status_code == 200, t.text
        names = [e["name"] for e in t.json()["traceEvents"]]
        assert "wait: take(src=0) (still blocked at the end)" in names
        fig = _available(c, jid)
        assert fig["available"] and fig["blocked"][0].startswith("when the job ended, rank 1 has waited")
        assert fig["analysis"]["ranks"][1]["wait_frac"] > 0.5
        assert wait_state(c, jid, ("cancelled",))["trace_available"]


def test_deadlocked_timed_out_job_says_so(server):
    with server.client() as c:
        job = submit(c, DEADLOCK_JOB, env=ENV, timeout=4)
        job = wait_state(c, job["id"], ("timed_out", "failed", "succeeded"), timeout=120)
        assert job["state"] == "timed_out"
        fig = _available(c, job["id"])
        assert fig["available"] and fig["analysis"]["open_waits"] == 2
        assert fig["sentence"].startswith("every rank is blocked"), fig["sentence"]
        assert "no communication was recorded" not in fig["sentence"]
        assert all(r["wait_frac"] > 0.5 for r in fig["analysis"]["ranks"])
        assert any("deadlock" in s for s in fig["blocked"]), fig["blocked"]
        t = c.get(f"/api/v1/jobs/{job['id']}/trace")
        assert t.status_code == 200 and "wait: take(src=1) (still blocked at the end)" in t.text


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=12) | st.dictionaries(st.text(max_size=4), inner, max_size=5)
    | st.dictionaries(st.integers(), inner, max_size=3),
    max_leaves=60)


@settings(max_examples=300, deadline=None)
@given(value=_JSON_VALUES)
def test_dashboard_json_in_pieces_equals_one_call(value):
    """The dashboard's answers are encoded in pieces (so that no C call holds the GIL long); the text is
    exactly what one ``json.dumps`` call makes, for any nesting, with pieces of 3 items."""
    from nbmpi.server.routers import dashboard

    whole = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    piece = dashboard.JSON_PIECE
    try:
        dashboard.JSON_PIECE = 3
        assert dashboard._dumps(value) == whole
    finally:
        dashboard.JSON_PIECE = piece


def _index_builds(trace_dir) -> list:
    """The index build processes (:func:`nbmpi.server.trace_index.build_command`) of ``trace_dir``."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "nbmpi.workers.tracing.index" in cmd and str(trace_dir) in cmd:
            found.append(p)
    return found


def test_stopping_the_service_ends_its_index_build_and_a_restart_builds_it(tmp_path):
    """SIGTERM to ``nbmpi serve`` while it indexes a finished job's trace: the build (a child process in a
    session of its own) ends with the service and leaves no unfinished file behind, the trace is not
    recorded unreadable, and the restarted service builds the index on the first request."""
    from nbmpi.workers.tracing.index import index_dir

    events = 1_000_000
    srv = Server(tmp_path / "data", max_ranks=2).start()
    try:
        with srv.client() as c:
            job = submit(c, BIG_JOB, args=[str(events // 2)], env=ENV)
            job = wait_state(c, job["id"], ("failed", "succeeded"), timeout=600)
        assert job["state"] == "failed" and job["rank_exit_codes"] == [0, 5], job
        trace_dir = srv.data_dir / "jobs" / str(job["id"]) / "trace"
        deadline = time.monotonic() + 60   # the build runs once its unfinished index directory exists
        while not (list(trace_dir.glob(".index.tmp.*")) and _index_builds(trace_dir)):
            assert time.monotonic() < deadline and not index_dir(trace_dir).exists(), \
                "no index build seen while it ran (it must take more than a moment: make the trace bigger)"
            time.sleep(0.02)
        builds = _index_builds(trace_dir)
        srv.stop()
        gone, alive = psutil.wait_procs(builds, timeout=10)
        assert not alive, f"index builds outlived the service: {alive}"
        assert sorted(p.name for p in trace_dir.iterdir() if p.name.startswith(".")) == [], list(trace_dir.iterdir())
        assert not index_dir(trace_dir).exists()   # ended, not recorded unreadable
        srv = Server(tmp_path / "data", max_ranks=2).start()
        with srv.client() as c:
            fig = _available(c, job["id"], width=600)
        assert fig["available"] and fig["meta"]["events"] == events, fig.get("reason")
    finally:
        srv.stop()
