"""Tracing of channel communication under real mpiexec: per-rank records, on/off switch,
one-call gather, send/receive matching, wait attribution, summary, Chrome export, clock
alignment, buffer growth and dropped events. Plus Trace analysis on hand-made events."""
import json
import socket

import numpy as np
import pytest

from conftest import assert_ok
from nbmpi.workers.tracing.analysis import Trace
from nbmpi.workers.tracing.tracer import DIR_NONE, DIR_RECV, DIR_SEND, FIELDS, NF

MAIN = r'''
import json, sys, time
import numpy as np
from nbmpi.workers import ArrayChannel, Trace, gather_trace, get_tracer, world
from nbmpi.workers.tracing import tracer as tracing
from nbmpi.workers.tracing.tracer import DIR_SEND, DIR_RECV, FIELDS, Tracer

comm = world()
rank, size = comm.Get_rank(), comm.Get_size()
out_dir = sys.argv[1]
C = {name: i for i, name in enumerate(FIELDS)}
tr = get_tracer()
KIND = {name: i for i, name in enumerate(tracing.kind_names())}


def check(cond, case, detail=""):
    if not cond:
        raise AssertionError(f"[rank {rank}] {case}: {detail}")


check(tr.enabled, "tracer on by default")
check(tr.comm.Get_size() == size, "tracer on COMM_WORLD")

# -- clock alignment (done by init() in rank_entry): same host clock, so the true offset is 0 and
#    Cristian's estimate must be within its own error bound ---------------------------------------
if rank == 0:
    check(tr.offset_ns == 0 and tr.offset_err_ns == 0, "rank 0 is the reference clock",
          f"{tr.offset_ns} {tr.offset_err_ns}")
else:
    check(tr.offset_err_ns > 0, "clock error estimated", str(tr.offset_err_ns))
    check(abs(tr.offset_ns) <= tr.offset_err_ns + 1000, "offset within its error bound",
          f"offset {tr.offset_ns} ns, error {tr.offset_err_ns} ns")
    check(tr.offset_err_ns < 50_000_000, "clock error small (< 50 ms)", str(tr.offset_err_ns))

start = tr.mark()
ch = ArrayChannel(100, np.float64)          # 800 bytes per whole-buffer message
NB = 800

# -- segment 1: a known point-to-point pattern: 0->1 x2, 1->2 x1, 2->0 x3 ------------------------
seg1 = tr.mark()
if rank == 0:
    ch.put(1); ch.put(1)
    for _ in range(3):
        ch.take(2)
elif rank == 1:
    ch.take(0); ch.take(0)
    ch.put(2)
else:
    ch.take(1)
    for _ in range(3):
        ch.put(0)
ev = tr.events(seg1)
want = {0: [("put", DIR_SEND, 1)] * 2 + [("take", DIR_RECV, 2)] * 3,
        1: [("take", DIR_RECV, 0)] * 2 + [("put", DIR_SEND, 2)],
        2: [("take", DIR_RECV, 1)] + [("put", DIR_SEND, 0)] * 3}[rank]
got = [(tracing.kind_names()[int(e[C["kind"]])], int(e[C["dir"]]), int(e[C["peer"]])) for e in ev]
check(got == want, "per-rank records (kind, dir, peer)", f"got {got}, expected {want}")
check(all(int(e[C["nbytes"]]) == NB for e in ev), "bytes of each record", str(ev[:, C["nbytes"]]))
check(all(int(e[C["chan"]]) == ch.chan_id for e in ev), "channel id of each record", str(ev[:, C["chan"]]))
check(all(e[C["t_end"]] >= e[C["t_start"]] > 0 for e in ev), "record times", str(ev[:, 5:7]))
t1 = gather_trace(root=0, since=seg1)                 # ONE collective call
if rank == 0:
    check(isinstance(t1, Trace), "gather_trace returns a Trace on root", type(t1).__name__)
    s = t1.summary()
    check(s["messages"] == [[0, 2, 0], [0, 0, 1], [3, 0, 0]], "messages matrix", str(s["messages"]))
    check(s["bytes"] == [[0, 2 * NB, 0], [0, 0, NB], [3 * NB, 0, 0]], "bytes matrix", str(s["bytes"]))
    check(s["unmatched"] == 0, "segment 1 all matched", str(s["unmatched"]))
    check(len(t1.flow_pairs) == 6, "6 send/receive pairs", str(t1.flow_pairs))
    check([r["events"] for r in s["ranks"]] == [5, 3, 4], "events per rank", str(s["ranks"]))
    check(s["ranks"][1]["events_by_kind"] == {"put": 1, "take": 2}, "events by kind",
          str(s["ranks"][1]["events_by_kind"]))
    labels = sorted({t1.op_label(i) for i in range(len(t1))})
    check(labels == ["put(dest=0)", "put(dest=1)", "put(dest=2)", "take(src=0)", "take(src=1)", "take(src=2)"],
          "op labels", str(labels))
else:
    check(t1 is None, "gather_trace returns None off root", repr(t1))

# -- segment 2: tracing switched off at run time records nothing -----------------------------------
tr.enabled = False
n_before = tr.n
if rank == 0:
    ch.put(1)
elif rank == 1:
    ch.take(0)
ch.allreduce("sum")
ch.scatter(root=1)
check(tr.n == n_before, "tracer.enabled = False records nothing", f"{tr.n - n_before} events recorded")
tr.enabled = True

# -- segment 3: late sender. rank 0 sleeps 0.3 s before put; rank 1 is already in take ------------
late = ArrayChannel(8, np.float64)
comm.Barrier()
if rank == 0:
    time.sleep(0.3)
    late.put(1)
elif rank == 1:
    late.take(0)

# -- segment 4: every collective, 3 ranks (uneven trees) -------------------------------------------
ch.buffer[...] = rank
ch.reduce("sum", root=0)
ch.reduce("max", root=2)
ch.bcast(root=1)
ch.allreduce("prod")
ch.scatter(root=2)
ch.gather(root=0, axis=0)
ch.scatter(root=0, regions={0: (0, 10), 1: (10, 30), 2: (30, 100)})
ch.gather(root=1, regions=lambda r: (r * 7, r * 7 + 7))

# -- segment 5: the record buffer grows past its capacity, then counts dropped events --------------
saved = tr
small = Tracer(comm, enabled=True, capacity=4, max_events=40)
small.offset_ns, small.offset_err_ns = tr.offset_ns, tr.offset_err_ns
tracing.set_tracer(small)
for _ in range(25):
    if rank == 0:
        ch.put(1)
    elif rank == 1:
        ch.take(0)
if rank in (0, 1):
    # public API only: every record is in the buffer as soon as put/take returned
    check(small.mark() == 25 and len(small.events()) == 25 and small.dropped == 0,
          "buffer grew without loss", f"mark={small.mark()} events={len(small.events())} dropped={small.dropped}")
    kinds = small.events()[:, C["kind"]]
    check(np.all(kinds == KIND["put" if rank == 0 else "take"]), "grown buffer keeps every event", str(kinds))
    check(np.all(small.events()[:, C["t_start"]] > 0), "no zeroed rows after growth")
for _ in range(25):
    if rank == 0:
        ch.put(1)
    elif rank == 1:
        ch.take(0)
if rank in (0, 1):
    check(small.mark() == 40 and len(small.events()) == 40 and small.dropped == 10,
          "beyond max_events: dropped counted",
          f"mark={small.mark()} events={len(small.events())} dropped={small.dropped}")
grown = small.gather(root=0)
if rank == 0:
    check(list(grown.dropped) == [10, 10, 0], "dropped per rank in the Trace", str(grown.dropped))
    check([r["dropped"] for r in grown.summary()["ranks"]] == [10, 10, 0], "dropped in summary")
    check(len(grown) == 80, "gathered events", str(len(grown)))
tracing.set_tracer(saved)

# -- the whole run in one trace ------------------------------------------------------------------
trace = gather_trace(root=0, since=start)
if rank == 0:
    trace.save(f"{out_dir}/trace.npz")
    trace.save_chrome(f"{out_dir}/trace.json")
    meta = dict(late_chan=late.chan_id, ch_chan=ch.chan_id)
    with open(f"{out_dir}/meta.json", "w") as f:
        json.dump(meta, f)
comm.Barrier()
print(f"rank {rank}: tracing OK", flush=True)
'''


@pytest.fixture(scope="module")
def traced_run(tmp_path_factory):
    """Run MAIN once on 3 ranks; returns (proc, Trace, chrome dict, meta)."""
    from conftest import nbmpi_run

    tmp = tmp_path_factory.mktemp("trace")
    proc = nbmpi_run(tmp, MAIN, n=3, timeout=120, args=(str(tmp),))
    assert_ok(proc)
    trace = Trace.load(str(tmp / "trace.npz"))
    chrome = json.loads((tmp / "trace.json").read_text())
    meta = json.loads((tmp / "meta.json").read_text())
    return proc, trace, chrome, meta


def test_per_rank_records_gather_growth_and_clocks(traced_run):
    """In-program checks: records (kind/dir/peer/bytes/chan), exact traffic matrices, tracing off,
    gather on root only, buffer growth and dropped counts, clock offsets within their error."""
    proc = traced_run[0]
    for r in range(3):
        assert f"rank {r}: tracing OK" in proc.stdout, proc.stdout + proc.stderr


def test_every_send_matched_and_late_sender_wait(traced_run):
    _, trace, _, meta = traced_run
    s = trace.summary()
    assert s["unmatched"] == 0, f"{s['unmatched']} events without a partner"
    kinds = trace.col("kind")
    d = trace.col("dir")
    by_kind = {trace.kind_name(int(k)) for k in np.unique(kinds)}
    assert {"put", "take", "reduce", "bcast", "scatter", "gather"} <= by_kind, by_kind
    # every send has exactly one receive (flow pair) and vice versa
    n_send, n_recv = int((d == DIR_SEND).sum()), int((d == DIR_RECV).sum())
    assert n_send == n_recv == len(trace.flow_pairs), (n_send, n_recv, len(trace.flow_pairs))
    pairs = trace.flow_pairs
    assert len(set(pairs[:, 0].tolist())) == len(pairs) and len(set(pairs[:, 1].tolist())) == len(pairs)
    for si, ri in pairs.tolist():
        assert trace.ranks[si] == trace.col("peer")[ri] and trace.ranks[ri] == trace.col("peer")[si]
        assert trace.col("kind")[si] in (trace.col("kind")[ri], trace.kinds.index("put"))
        assert trace.col("nbytes")[si] == trace.col("nbytes")[ri]
    # collectives per kind: reduce/bcast trees move n-1 whole buffers each call
    chan = trace.col("chan")
    mine = chan == meta["ch_chan"]
    for kind, calls in (("reduce", 2 + 1), ("bcast", 1 + 1)):     # allreduce = reduce + bcast
        k = trace.kinds.index(kind)
        sends = mine & (kinds == k) & (d == DIR_SEND)
        assert int(sends.sum()) == calls * 2, (kind, int(sends.sum()))
        assert set(trace.col("nbytes")[sends].tolist()) == {800}
    # late sender: rank 1's take waited the 0.3 s rank 0 slept, rank 0's put did not wait
    late = chan == meta["late_chan"]
    take = np.nonzero(late & (trace.ranks == 1) & (d == DIR_RECV))[0]
    put = np.nonzero(late & (trace.ranks == 0) & (d == DIR_SEND))[0]
    assert len(take) == 1 and len(put) == 1
    wait = trace.col("wait")
    assert wait[take[0]] >= 0.25e9, f"take waited {wait[take[0]] / 1e9:.3f} s, expected >= 0.25 s"
    assert wait[put[0]] <= 0.01e9, f"put waited {wait[put[0]] / 1e9:.3f} s, expected ~0"
    assert trace.op_label(int(take[0])) == "take(src=0)"


def test_summary_fractions_and_clock_error(traced_run):
    _, trace, _, _ = traced_run
    s = trace.summary()
    assert s["nranks"] == 3 and len(s["ranks"]) == 3
    for r in s["ranks"]:
        total = r["compute_frac"] + r["comm_frac"] + r["wait_frac"]
        assert abs(total - 1.0) < 1e-6, (r["rank"], total)
        assert min(r["compute_frac"], r["comm_frac"], r["wait_frac"]) >= 0, r
        assert abs(r["compute_s"] + r["comm_s"] + r["wait_s"] - s["window_s"]) < 1e-6
    assert s["ranks"][1]["wait_s"] >= 0.25, s["ranks"][1]   # the late-sender take
    err = s["clock_error_us"]
    assert err[0] == 0 and all(0 < e < 50_000 for e in err[1:]), err


def test_chrome_export(traced_run):
    _, trace, chrome, _ = traced_run
    events = chrome["traceEvents"]
    assert isinstance(events, list) and chrome["otherData"]["nranks"] == 3
    meta = [e for e in events if e["ph"] == "M"]
    names = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    sort = {e["pid"]: e["args"]["sort_index"] for e in meta if e["name"] == "process_sort_index"}
    here = socket.gethostname()   # every rank ran on this host: its name labels each lane
    assert names == {r: f"rank {r} ({here})" for r in range(3)}, names
    assert sort == {0: 0, 1: 1, 2: 2}, sort
    slices = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in slices} == {0, 1, 2}
    for pid in range(3):
        mine = sorted((e for e in slices if e["pid"] == pid and e["tid"] == 0), key=lambda e: e["ts"])
        assert mine, pid
        for a, b in zip(mine, mine[1:]):
            assert a["dur"] >= 0
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-3, (pid, a, b)
    # timestamps in microseconds: the window spans ~window_s * 1e6 us, the late take waited >= 0.25e6 us
    end = max(e["ts"] + e["dur"] for e in slices)
    window_us = trace.summary()["window_s"] * 1e6
    assert abs(end - window_us) <= 1.0, (end, window_us)
    waits = [e for e in slices if e["pid"] == 1 and e["name"] == "wait: take(src=0)"]
    assert max(e["dur"] for e in waits) >= 0.25e6, waits
    # flows: every flow_out has one flow_in with the same bind_id (and the other way round)
    outs = [e["bind_id"] for e in slices if e.get("flow_out")]
    ins = [e["bind_id"] for e in slices if e.get("flow_in")]
    assert len(outs) == len(set(outs)) and sorted(outs) == sorted(ins), (outs, ins)
    assert len(outs) == len(trace.flow_pairs) > 0
    flow_src = {e["bind_id"]: e for e in slices if e.get("flow_out")}
    for e in slices:
        if e.get("flow_in"):
            src = flow_src[e["bind_id"]]
            assert src["pid"] == e["args"]["peer"] and e["pid"] == src["args"]["peer"], (src, e)


TRACE_OFF = r'''
import numpy as np
from nbmpi.workers import ArrayChannel, gather_trace, get_tracer, world
rank = world().Get_rank()
tr = get_tracer()
assert tr.enabled is False, "NBMPI_TRACE=0 must disable the tracer"
ch = ArrayChannel(10)
if rank == 0:
    ch.put(1)
else:
    ch.take(0)
ch.allreduce("sum"); ch.bcast(1); ch.scatter(0); ch.gather(1)
assert tr.n == 0, f"rank {rank}: {tr.n} events recorded with NBMPI_TRACE=0"
t = gather_trace()
if rank == 0:
    s = t.summary()
    assert len(t) == 0 and s["unmatched"] == 0 and s["messages"] == [[0, 0], [0, 0]], s
    assert [e for e in t.to_chrome()["traceEvents"] if e["ph"] == "X"] == []
else:
    assert t is None
print(f"rank {rank}: trace off OK", flush=True)
'''


def test_tracing_off_by_env(run_mpi):
    proc = run_mpi(TRACE_OFF, n=2, env={"NBMPI_TRACE": "0"})
    assert_ok(proc)
    assert "rank 0: trace off OK" in proc.stdout and "rank 1: trace off OK" in proc.stdout


# -- Trace analysis on hand-made events (no MPI) ------------------------------------------------------
def _ev(kind, d, peer, start, end, seq=-1, chan=1, tag=5, nbytes=8, wait=-1):
    row = dict(kind=kind, dir=d, peer=peer, tag=tag, nbytes=nbytes, t_start=start, t_end=end, wait=wait,
               seq=seq, chan=chan, count=0)
    return [row[f] for f in FIELDS]


def test_trace_attribution_on_known_events():
    kinds = ["put", "take", "barrier"]
    events = [
        _ev(0, DIR_SEND, 1, 100, 400),          # rank 0 put #0: receiver arrived at 300 -> waited 200
        _ev(0, DIR_SEND, 1, 500, 600),          # rank 0 put #1: receiver was first -> 0
        _ev(2, DIR_NONE, -1, 1000, 1500, seq=0),  # rank 0 collective: last arrival at 1400 -> 400
        _ev(1, DIR_RECV, 0, 300, 420),          # rank 1 take #0: sender was first -> 0
        _ev(1, DIR_RECV, 0, 450, 610),          # rank 1 take #1: sender started at 500 -> 50
        _ev(2, DIR_NONE, -1, 1400, 1500, seq=0),  # rank 1 collective: last -> 0
        _ev(1, DIR_RECV, 0, 2000, 2100, chan=9),  # no matching send -> unmatched
    ]
    ranks = [0, 0, 0, 1, 1, 1, 1]
    t = Trace(np.array(events, dtype=np.int64), np.array(ranks), 2, kinds)
    assert t.col("wait").tolist() == [200, 0, 400, 0, 50, 0, 0]
    assert t.unmatched == 1
    assert sorted(map(tuple, t.flow_pairs.tolist())) == [(0, 3), (1, 4)]
    s = t.summary()
    assert s["messages"] == [[0, 2], [0, 0]] and s["bytes"] == [[0, 16], [0, 0]]
    assert s["unmatched"] == 1
    r0 = s["ranks"][0]
    assert r0["wait_s"] == pytest.approx(600e-9) and r0["comm_s"] == pytest.approx((300 + 100 + 500 - 600) * 1e-9)
    assert r0["total_s"] == pytest.approx(2000e-9)
    # states never overlap, cover the window, and compute fills the gaps
    for r in range(2):
        st = [x for x in t.states() if x["rank"] == r]
        assert st[0]["start"] == 0 and st[-1]["end"] == 2000
        for a, b in zip(st, st[1:]):
            assert a["end"] == b["start"], (a, b)
    # overlapping events on one rank (e.g. nested) still give non-overlapping states
    nested = Trace(np.array([_ev(0, DIR_SEND, 1, 0, 100), _ev(0, DIR_SEND, 1, 50, 80)], dtype=np.int64),
                   np.array([0, 0]), 2, kinds)
    st = nested.states()
    for a, b in zip(st, st[1:]):
        if a["rank"] == b["rank"]:
            assert a["end"] <= b["start"], (a, b)


def test_clocks_repaired_within_their_error_and_overlaps_counted_once():
    kinds = ["put", "take"]
    # rank 1's clock reads 30 us late against rank 0: its take seems to end 20 us before rank 0's put started
    events = [_ev(0, DIR_SEND, 1, 100_000, 150_000, seq=0), _ev(1, DIR_RECV, 0, 60_000, 80_000, seq=0),
              _ev(0, DIR_SEND, 1, 200_000, 260_000, seq=1), _ev(1, DIR_RECV, 0, 230_000, 250_000, seq=1)]
    ranks = np.array([0, 1, 0, 1])
    within = Trace(np.array(events, dtype=np.int64), ranks, 2, kinds, clock_error_ns=np.array([0, 40_000]))
    assert within.clock_shift_ns.tolist() == [0, 20_000] and within.clock_violations == 0
    start, end = within.col("t_start"), within.col("t_end")
    assert all(end[r] >= start[s] for s, r in within.flow_pairs.tolist())
    assert within.summary()["clock_violations"] == 0 and within.summary()["clock_shift_us"] == [0.0, 20.0]
    # an error bound of 10 us cannot explain 20 us: shifted as far as allowed, the pair is reported, not hidden
    beyond = Trace(np.array(events, dtype=np.int64), ranks, 2, kinds, clock_error_ns=np.array([0, 10_000]))
    assert beyond.clock_shift_ns.tolist() == [0, 10_000] and beyond.clock_violations == 1
    # a root's two sends in flight together (overlapping slices) count once in its comm time
    root = Trace(np.array([_ev(0, DIR_SEND, 1, 0, 100, seq=0, wait=0), _ev(0, DIR_SEND, 2, 0, 150, seq=0, wait=0)],
                          dtype=np.int64), np.array([0, 0]), 3, kinds)
    assert root.summary()["ranks"][0]["comm_s"] == pytest.approx(150e-9)


def test_trace_empty_and_fields():
    assert NF == len(FIELDS) == 11
    t = Trace(np.zeros((0, NF), dtype=np.int64), np.zeros(0), 3, ["put"])
    s = t.summary()
    assert s["unmatched"] == 0 and s["bytes"] == [[0] * 3] * 3
    assert all(r["compute_frac"] + r["comm_frac"] + r["wait_frac"] == 0 for r in s["ranks"])
    assert [e for e in t.to_chrome()["traceEvents"] if e["ph"] == "X"] == []


@pytest.mark.parametrize("pure", ["0", "1"])
def test_record_is_the_one_way_in_and_keeps_every_field(run_mpi, pure):
    """Tracer.record (the one public recording call) writes each event at once, in call order, with
    every field and the documented defaults; the buffer grows, then counts drops; mark/events/clear
    see exactly what was recorded (public API only, real mpiexec). Both record buffers: the compiled
    one and the pure-Python one (NBMPI_PURE_PYTHON=1)."""
    proc = run_mpi(r'''
import os
from nbmpi.workers import world
from nbmpi.workers.tracing import tracer as tracing
from nbmpi.workers.tracing.tracer import DIR_NONE, DIR_RECV, DIR_SEND, FIELDS, Tracer, register_kind

if os.environ["NBMPI_PURE_PYTHON"] == "1":
    assert Tracer.__mro__[1] is tracing._PyTracerCore, Tracer.__mro__
else:
    from nbmpi.workers.tracing._tracer_core import TracerCore
    assert Tracer.__mro__[1] is TracerCore, Tracer.__mro__

C = {name: i for i, name in enumerate(FIELDS)}
k = register_kind("test_kind")
assert register_kind("test_kind") == k
tr = Tracer(world(), enabled=True, capacity=2, max_events=5)
tr.record(k, DIR_SEND, 0, 11, 8, 10, 11, -1, -1, 5)               # a put-like record (seq by order)
assert tr.mark() == 1 and tr.events()[0].tolist() == [k, DIR_SEND, 0, 11, 8, 10, 11, -1, -1, 5, 0]
tr.record(k, DIR_RECV, 0, 11, 8, 20, 21)                          # defaults: wait -1, seq 0, chan 0, count 0
assert tr.events()[1].tolist() == [k, DIR_RECV, 0, 11, 8, 20, 21, -1, 0, 0, 0], tr.events()[1]
tr.record(k, DIR_NONE, -1, 0, 64, 30, 31, wait=3, seq=7, chan=9, count=4)   # grows past capacity 2
assert tr.events()[2].tolist() == [k, DIR_NONE, -1, 0, 64, 30, 31, 3, 7, 9, 4]
assert tr.events(since=1)[:, C["t_start"]].tolist() == [20, 30]
for t in (40, 50, 60, 70):                                        # max_events 5: two are dropped
    tr.record(k, DIR_NONE, -1, 0, 0, t, t + 1)
assert tr.mark() == 5 and tr.dropped == 2, (tr.mark(), tr.dropped)
assert tr.events()[:, C["t_start"]].tolist() == [10, 20, 30, 40, 50]
tr.clear()
assert tr.mark() == 0 and len(tr.events()) == 0 and tr.dropped == 0
tr.record(k, DIR_SEND, 0, 1, 1, 80, 81)
assert tr.events()[:, C["t_start"]].tolist() == [80]
print("record OK")
''', n=1, env={"NBMPI_PURE_PYTHON": pure})
    assert_ok(proc)
    assert "record OK" in proc.stdout


def test_snapshot_from_another_thread_while_recording(run_mpi):
    """Tracer.snapshot copies complete rows while the owner records and the buffer grows; it
    changes nothing."""
    proc = run_mpi(r'''
import threading
import numpy as np
from nbmpi.workers import world
from nbmpi.workers.tracing.tracer import FIELDS, Tracer

C = {name: i for i, name in enumerate(FIELDS)}
tr = Tracer(world(), enabled=True, capacity=4)
N = 200_000
seen, bad = [0], []
stop = threading.Event()

def reader():
    got = 0
    while not stop.is_set() or got < tr.n:
        rows = tr.snapshot(got)
        if len(rows):
            tags = rows[:, C["tag"]]
            if not np.array_equal(tags, np.arange(got, got + len(rows))) or (rows[:, C["nbytes"]] != 8).any():
                bad.append((got, len(rows)))
            got += len(rows)
    seen[0] = got

t = threading.Thread(target=reader)
t.start()
for i in range(N):
    tr.record(1, 1, 0, i, 8, i, i + 1)
stop.set()
t.join()
assert not bad and seen[0] == N and tr.cap >= N, (bad[:3], seen[0], tr.cap)
tr.record(2, 1, 0, N, 8, 5, 6)
assert tr.snapshot(N)[:, C["tag"]].tolist() == [N]
assert len(tr.snapshot(N + 5)) == 0 and len(tr.snapshot(-3)) == N + 1
print("snapshot OK")
''', n=1)
    assert_ok(proc)
    assert "snapshot OK" in proc.stdout
