"""Aggregator tests under real mpiexec (2 and 3 ranks).

One MPI program per rank count runs every case and prints one ``CASE`` JSON
line per case from rank 0 (each check is agreed across ranks with an
allreduce, details gathered); the test functions check those lines, so a
failing case is reported by name. Timeouts and the benchmark command run
separately.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO, assert_ok, nbmpi_run

CASES_PROG = r'''
import json, sys, tracemalloc
import numba
import numpy as np
from nbmpi.workers import (AggregationError, AggregationTimeout, Aggregator, gather_trace, get_tracer, world)
from nbmpi.workers.core.runtime import MPI

comm = world()
rank, size = comm.Get_rank(), comm.Get_size()
M = MPI()

def agree(name, ok, **detail):
    """Every rank reports; rank 0 prints whether all passed and each rank's detail."""
    oks = comm.allgather(bool(ok))
    details = comm.allgather(detail)
    if rank == 0:
        print("CASE " + json.dumps(dict(case=name, ok=all(oks), oks=oks, details=details), default=str), flush=True)

HIST = np.dtype([("loc", np.int64)])

@numba.njit
def count(items, table):
    for i in range(items.shape[0]):
        table[items[i]["loc"]] += 1

def updates(r, n, T, seed):
    return np.random.default_rng(seed + r).integers(0, T * size, n)

def serial(n, T, seed, nsingle=0):
    ref = np.zeros(T * size, np.int64)
    for r in range(size):
        g = updates(r, n, T, seed)
        ref += np.bincount(g, minlength=ref.size)
        ref += np.bincount(g[:nsingle], minlength=ref.size)
    return ref[rank::size]

# ---------------------------------------------------------------- 1. exact histogram
T = 97
table = np.zeros(T, np.int64)
agg = Aggregator(HIST, count, table, buffer_items=50, timeout=30, name="hist")
g = updates(rank, 20000, T, 7)
items = np.empty(g.size, HIST); items["loc"] = g // size
agg.push_many(g % size, items)
for x in g[:300]:                       # the plain-Python path: tuples and structured scalars
    agg.push(int(x % size), (int(x // size),))
agg.flush()
st = agg.stats()
agree("histogram_exact", np.array_equal(table, serial(20000, T, 7, 300)),
      handled=int(table.sum()), stats={k: st[k] for k in ("items_pushed", "buffers_full", "buffers_flush",
                                                             "messages_sent", "mean_fill", "bytes_sent")})
# second epoch on the same aggregator: flush is a phase boundary
table[:] = 0
agg.push_many(g % size, items)
agg.flush()
agree("histogram_second_epoch", np.array_equal(table, serial(20000, T, 7)), flushes=agg.stats()["flushes"])
s = agg.stats()
moved = comm.allreduce(np.array([s["bytes_sent"], s["bytes_received"], s["messages_sent"], s["messages_received"]]))
agree("stats_consistent", s["items_pushed"] == 2 * 20000 + 300 and s["rows_dispatched"] == s["items_pushed"]
      and s["buffers_full"] > 0 and s["buffers_flush"] > 0 and 0 < s["mean_fill"] <= 1
      and s["bytes_sent"] % HIST.itemsize == 0 and s["bytes_sent"] <= s["rows_dispatched"] * HIST.itemsize
      and moved[0] == moved[1] and moved[2] == moved[3], stats=s)
# hot-path variants give the same counts: non-persistent sends (too many pool buffers x ranks for
# persistent requests) and a state object replaced after construction (handler dispatched, not its entry point)
import nbmpi.workers.aggregation.aggregator as aggmod
saved, aggmod._MAX_PERSISTENT = aggmod._MAX_PERSISTENT, 0
t1 = np.zeros(T, np.int64)
a1 = Aggregator(HIST, count, t1, buffer_items=50, timeout=30, name="no-persistent")
aggmod._MAX_PERSISTENT = saved
a1.push_many(g % size, items)
a1.close()
t2, t3 = np.zeros(T, np.int64), np.zeros(T, np.int64)
a2 = Aggregator(HIST, count, t2, buffer_items=50, timeout=30, name="state-replaced")
a2.state = t3
comm.Barrier()   # every rank replaced it before any buffer arrives
a2.push_many(g % size, items)
a2.close()
ref = serial(20000, T, 7)
agree("hot_path_variants", np.array_equal(t1, ref) and np.array_equal(t3, ref) and not t2.any(),
      t1=int(t1.sum()), t2=int(t2.sum()), t3=int(t3.sum()), ref=int(ref.sum()))
# push_many with inputs of different kinds on one aggregator (its compiled bucketing entry points are
# cached per kind): read-only arrays, int32 destinations, a strided view of items, then the first kind again
t4 = np.zeros(T, np.int64)
a4 = Aggregator(HIST, count, t4, buffer_items=50, timeout=30, name="input-kinds")
d64 = (g % size).astype(np.int64)
ro_d, ro_items = d64.copy(), items.copy()
ro_d.flags.writeable = False
ro_items.flags.writeable = False
wide = np.empty(2 * g.size, HIST)
wide["loc"][::2] = items["loc"]
for dd, it in ((d64, items), (ro_d, ro_items), (d64.astype(np.int32), items), (d64, wide[::2]), (d64, items)):
    a4.push_many(dd, it)
a4.close()
agree("push_many_input_kinds", np.array_equal(t4, 5 * ref), t4=int(t4.sum()), ref=5 * int(ref.sum()))

# ---------------------------------------------------------------- 2. handler-generated traffic, A -> B -> C
CDT = np.dtype([("key", np.int64)])
BDT = np.dtype([("key", np.int64), ("hops", np.int64)])
ADT = np.dtype([("key", np.int64)])
K = 31

@numba.njit
def c_handler(items, counts):
    for i in range(items.shape[0]):
        counts[items[i]["key"]] += 1

@numba.njit
def b_handler(items, nranks, src, od, oi):
    for i in range(items.shape[0]):
        key = items[i]["key"]
        od[i] = (key * 7 + items[i]["hops"]) % nranks
        oi[i]["key"] = key
    return items.shape[0]

@numba.njit
def a_handler(items, nranks, src, od, oi):
    n = 0
    for i in range(items.shape[0]):
        key = items[i]["key"]
        for k in range(2):              # fan-out: two B items per A item
            od[n] = (key + k + src) % nranks
            oi[n]["key"] = key
            oi[n]["hops"] = k + 1
            n += 1
    return n

counts = np.zeros(K, np.int64)
C = Aggregator(CDT, c_handler, counts, buffer_items=3, timeout=30, name="C")
B = Aggregator(BDT, b_handler, size, buffer_items=2, reply=C, timeout=30, name="B")
A = Aggregator(ADT, a_handler, size, buffer_items=5, reply=B, replies_per_item=2, timeout=30, name="A")
rng = np.random.default_rng(100 + rank)
keys = rng.integers(0, K, 3000)
ai = np.empty(keys.size, ADT); ai["key"] = keys
A.push_many(rng.integers(0, size, keys.size), ai)
A.flush()                                # must also drain B and C
local = counts.copy()                    # read before any other communication
total = np.zeros(K, np.int64)
comm.Allreduce(local, total)
expect = np.zeros(K, np.int64)
for r in range(size):
    expect += 2 * np.bincount(np.random.default_rng(100 + r).integers(0, K, 3000), minlength=K)
agree("termination_handler_traffic", np.array_equal(total, expect),
      handled_here=int(local.sum()), waves=A.stats()["waves"],
      b_msgs=B.stats()["messages_sent"], c_msgs=C.stats()["messages_sent"])
# nothing is left anywhere after the flush
agree("nothing_left_after_flush", not (A._busy() or B._busy() or C._busy()) and
      all(int(a._pos.max()) == -1 for a in (A, B, C)))
A.close(); B.close(); C.close()

# ---------------------------------------------------------------- 3. index-gather
REQ = np.dtype([("idx", np.int64), ("slot", np.int64)])
REP = np.dtype([("slot", np.int64), ("val", np.float64)])

@numba.njit
def on_request(items, state, src, od, oi):
    values, lo = state
    for k in range(items.shape[0]):
        od[k] = src
        oi[k]["slot"] = items[k]["slot"]
        oi[k]["val"] = values[items[k]["idx"] - lo]
    return items.shape[0]

@numba.njit
def on_reply(items, out):
    for k in range(items.shape[0]):
        out[items[k]["slot"]] = items[k]["val"]

NL = 1000 + 10 * rank                   # uneven blocks
sizes = comm.allgather(NL)
starts = np.concatenate([[0], np.cumsum(sizes)])
values = np.sqrt(np.arange(starts[rank], starts[rank + 1], dtype=np.float64)) + 0.5
want = np.random.default_rng(200 + rank).integers(0, starts[-1], 5000)
owner = np.searchsorted(starts, want, side="right") - 1
out = np.full(want.size, np.nan)
rep = Aggregator(REP, on_reply, out, buffer_items=7, timeout=30, name="reply")
req = Aggregator(REQ, on_request, (values, int(starts[rank])), buffer_items=11, reply=rep, timeout=30, name="request")
ri = np.empty(want.size, REQ); ri["idx"] = want; ri["slot"] = np.arange(want.size)
req.push_many(owner, ri)
req.flush()
agree("index_gather", np.array_equal(out, np.sqrt(want.astype(np.float64)) + 0.5),
      missing=int(np.isnan(out).sum()))
req.close(); rep.close()

# ---------------------------------------------------------------- 4/5. all-to-all, tiny buffers, bounded memory
T2 = 13
t2 = np.zeros(T2, np.int64)
tiny = Aggregator(HIST, count, t2, buffer_items=2, pool_buffers=size + 1, recv_buffers=1, timeout=30, name="tiny")
n4 = 30000
d4 = (np.arange(n4, dtype=np.int64) + rank) % size          # round robin to every rank, self included
i4 = np.empty(n4, HIST); i4["loc"] = np.arange(n4) % T2
get_tracer().enabled = False     # the trace's own record buffer grows per event; measure the aggregator alone
tracemalloc.start()
base = tracemalloc.get_traced_memory()[0]
tiny.push_many(d4, i4)
tiny.flush()
peak = tracemalloc.get_traced_memory()[1] - base
tracemalloc.stop()
get_tracer().enabled = True
expect4 = np.zeros(T2, np.int64)
for r in range(size):
    dr = (np.arange(n4) + r) % size
    expect4 += np.bincount((np.arange(n4) % T2)[dr == rank], minlength=T2)
s4 = tiny.stats()
agree("all_to_all_tiny_buffers", np.array_equal(t2, expect4) and s4["buffers_full"] >= n4 // 2 - size,
      messages_sent=s4["messages_sent"], buffers_full=s4["buffers_full"], waves=s4["waves"])
agree("bounded_memory",
      s4["max_buffers_in_use"] <= s4["pool_buffers"] and s4["max_inflight"] <= s4["pool_buffers"]
      and s4["buffer_bytes"] == (size + 1 + (1 if size > 1 else 0)) * 2 * HIST.itemsize
      and peak < 256 * 1024,
      max_in_use=s4["max_buffers_in_use"], max_inflight=s4["max_inflight"], pool=s4["pool_buffers"],
      traced_peak_bytes=peak, input_bytes=int(i4.nbytes + d4.nbytes))
tiny.close()

# ---------------------------------------------------------------- trace: one arrow per buffer
tr = get_tracer()
mark = tr.mark()
t3 = np.zeros(T, np.int64)
ta = Aggregator(HIST, count, t3, buffer_items=64, timeout=30, name="traced")
ta.push_many(g % size, items)
ta.flush()
sent = comm.allreduce(ta.stats()["messages_sent"])
trace = gather_trace(since=mark)
if rank == 0:
    kinds = trace.kinds
    kind = trace.col("kind")
    d = trace.col("dir")
    buf_kind = kinds.index("agg_buffer")
    sends = np.flatnonzero((kind == buf_kind) & (d == 1))
    recvs = np.flatnonzero((kind == buf_kind) & (d == 2))
    pairs = trace.flow_pairs
    agg_pairs = pairs[np.isin(pairs[:, 0], sends)]
    same_count = bool(np.all(trace.col("count")[agg_pairs[:, 0]] == trace.col("count")[agg_pairs[:, 1]]))
    flushes = int(np.sum(kind == kinds.index("agg_flush")))
    ok = (len(sends) == sent == len(recvs) == len(agg_pairs) and same_count and flushes == size
          and int(trace.col("count")[sends].sum()) == int(trace.col("nbytes")[sends].sum()) // HIST.itemsize)
    detail = dict(sends=len(sends), recvs=len(recvs), matched=len(agg_pairs), sent_stat=sent, flushes=flushes)
else:
    ok, detail = True, {}
agree("trace_one_arrow_per_buffer", comm.bcast(ok), **detail)
ta.close()

def error_of(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001
        return type(exc).__name__, str(exc)
    return None, ""

# ---------------------------------------------------------------- reply cycle: request -> reply -> ack
QDT = np.dtype([("kind", np.int64), ("idx", np.int64), ("slot", np.int64)])   # kind 0 request, 1 ack
PDT = np.dtype([("slot", np.int64), ("val", np.int64), ("idx", np.int64)])

@numba.njit
def on_q(items, state, src, od, oi):
    acks, nl = state
    n = 0
    for k in range(items.shape[0]):
        if items[k]["kind"] == 0:                 # a request: reply with the value to the requester
            od[n] = src
            oi[n]["slot"] = items[k]["slot"]
            oi[n]["val"] = items[k]["idx"] * 3 + 1
            oi[n]["idx"] = items[k]["idx"]
            n += 1
        else:                                     # an ack of a reply: count it at the owner
            acks[items[k]["idx"] % nl] += 1
    return n

@numba.njit
def on_p(items, state, src, od, oi):
    got, size = state
    for k in range(items.shape[0]):           # store the reply, ack it back into the request aggregator
        got[items[k]["slot"]] = items[k]["val"]
        od[k] = src
        oi[k]["kind"] = 1
        oi[k]["idx"] = items[k]["idx"]
        oi[k]["slot"] = -1
    return items.shape[0]

NQ, NLQ = 4000, 50
acks = np.zeros(NLQ, np.int64)
got = np.full(NQ, -1, np.int64)
Q = Aggregator(QDT, on_q, (acks, NLQ), buffer_items=3, pool_buffers=size + 1, recv_buffers=1, reply_dtype=PDT,
               timeout=30, name="Q")
P = Aggregator(PDT, on_p, (got, size), buffer_items=2, pool_buffers=size + 1, recv_buffers=1, reply=Q,
               timeout=30, name="P")
Q.set_reply(P)                              # closes the cycle Q -> P -> Q
qwant = np.random.default_rng(300 + rank).integers(0, NLQ * size, NQ)
qi = np.empty(NQ, QDT); qi["kind"] = 0; qi["idx"] = qwant; qi["slot"] = np.arange(NQ)
Q.push_many(qwant // NLQ, qi)
Q.flush()
acks_total = comm.allreduce(int(acks.sum()))
expect_acks = np.zeros(NLQ, np.int64)
for r in range(size):
    w = np.random.default_rng(300 + r).integers(0, NLQ * size, NQ)
    expect_acks += np.bincount(w[w // NLQ == rank] % NLQ, minlength=NLQ)
agree("reply_cycle_request_reply_ack", np.array_equal(got, qwant * 3 + 1) and np.array_equal(acks, expect_acks)
      and acks_total == NQ * size and not (Q._busy() or P._busy()),
      missing=int((got < 0).sum()), acks=int(acks.sum()), waves=Q.stats()["waves"],
      overflow=(Q.stats()["max_overflow_rows"], P.stats()["max_overflow_rows"]))
Q.close(); P.close()                         # closing one member of a cycle first is fine

# ---------------------------------------------------------------- reply cycle of one (handler -> own aggregator)
HDT = np.dtype([("key", np.int64), ("ttl", np.int64)])
KH = 17

@numba.njit
def hop(items, state, src, od, oi):
    seen, nranks = state
    n = 0
    for k in range(items.shape[0]):
        key, ttl = items[k]["key"], items[k]["ttl"]
        seen[key] += 1
        if ttl > 0:
            od[n] = (key + ttl) % nranks
            oi[n]["key"] = key
            oi[n]["ttl"] = ttl - 1
            n += 1
    return n

seen = np.zeros(KH, np.int64)
H = Aggregator(HDT, hop, (seen, size), buffer_items=4, reply_dtype=HDT, timeout=30, name="hops")
H.set_reply(H)
hr = np.random.default_rng(400 + rank)
hk = hr.integers(0, KH, 500); ht = hr.integers(0, 6, 500)
hi = np.empty(500, HDT); hi["key"] = hk; hi["ttl"] = ht
H.push_many(hr.integers(0, size, 500), hi)
H.flush()
seen_total = np.zeros(KH, np.int64)
comm.Allreduce(seen.copy(), seen_total)
expect_seen = np.zeros(KH, np.int64)
for r in range(size):
    rr = np.random.default_rng(400 + r)
    k_, t_ = rr.integers(0, KH, 500), rr.integers(0, 6, 500)
    expect_seen += np.bincount(k_, weights=t_ + 1, minlength=KH).astype(np.int64)
agree("reply_cycle_self_loop", np.array_equal(seen_total, expect_seen), handled=int(seen.sum()))
H.close()

# ---------------------------------------------------------------- a handler that raises breaks the aggregator, clearly
@numba.njit
def picky(items, table):
    for i in range(items.shape[0]):
        if items[i]["loc"] < 0:
            raise ValueError("negative loc")
        table[items[i]["loc"]] += 1

t6 = np.zeros(4, np.int64)
bad = Aggregator(HIST, picky, t6, buffer_items=4, timeout=30, name="picky")
bad.push(rank, (-1,))                        # to itself: each rank's own handler raises, no rank waits on another
first = error_of(lambda: bad.flush())
then = [error_of(lambda: bad.push(rank, (1,))), error_of(lambda: bad.flush())]
agree("handler_error_breaks_clearly", first[0] == "ValueError" and all(
      e == "AggregationError" and "unusable because its handler raised ValueError" in m and "create a new one" in m
      for e, m in then), first=first, then=then)
bad.close()                                  # local release of a broken aggregator

# ---------------------------------------------------------------- errors

t5 = np.zeros(T, np.int64)
e = Aggregator(HIST, count, t5, buffer_items=8, timeout=30, name="errs")
OTHER = np.dtype([("loc", np.int32)])
checks = {
    "push_dest_too_big": error_of(lambda: e.push(size, (1,))),
    "push_dest_negative": error_of(lambda: e.push(-1, (1,))),
    "push_many_dest_out": error_of(lambda: e.push_many(np.array([0, size + 2]), np.zeros(2, HIST))),
    "push_wrong_dtype_scalar": error_of(lambda: e.push(0, np.zeros(1, OTHER)[0])),
    "push_not_an_item": error_of(lambda: e.push(0, 5)),
    "push_many_wrong_dtype": error_of(lambda: e.push_many(np.zeros(3, np.int64), np.zeros(3, np.int64))),
    "push_many_length_mismatch": error_of(lambda: e.push_many(np.zeros(2, np.int64), np.zeros(3, HIST))),
}
e.flush()
still_works = int(t5.sum()) == 0
e.close()
checks["push_after_close"] = error_of(lambda: e.push(0, (1,)))
checks["push_many_after_close"] = error_of(lambda: e.push_many(np.zeros(1, np.int64), np.zeros(1, HIST)))
checks["flush_after_close"] = error_of(lambda: e.flush())

def plain(items, table):
    pass

checks["handler_not_compiled"] = error_of(lambda: Aggregator(HIST, plain, t5))

@numba.njit
def wrong_field(items, table):
    for i in range(items.shape[0]):
        table[items[i]["nope"]] += 1

checks["handler_typing_error"] = error_of(lambda: Aggregator(HIST, wrong_field, t5))
checks["not_structured"] = error_of(lambda: Aggregator(np.int64, count, t5))
plain_agg = Aggregator(HIST, count, t5, buffer_items=8, timeout=30, name="plain")
later = Aggregator(QDT, on_q, (acks, NLQ), buffer_items=8, reply_dtype=PDT, timeout=30, name="later")
checks["set_reply_without_reply_dtype"] = error_of(lambda: plain_agg.set_reply(later))
checks["set_reply_wrong_dtype"] = error_of(lambda: later.set_reply(plain_agg))
checks["flush_before_set_reply"] = error_of(lambda: later.flush())
plain_agg.close(); later._discard()
expect_words = {
    "push_dest_too_big": [f"rank {rank}", f"destination rank {size}", "push"],
    "push_dest_negative": [f"rank {rank}", "destination rank -1"],
    "push_many_dest_out": ["push_many", f"destination rank {size + 2}", f"0..{size - 1}"],
    "push_wrong_dtype_scalar": ["dtype", "<i4", "expected"],
    "push_not_an_item": ["int", "tuple"],
    "push_many_wrong_dtype": ["push_many", "int64", "expected"],
    "push_many_length_mismatch": ["2 dests for 3 items"],
    "push_after_close": ["after close()", "push"],
    "push_many_after_close": ["after close()", "push_many"],
    "flush_after_close": ["after close()", "flush"],
    "handler_not_compiled": ["numba.njit", "not compiled"],
    "handler_typing_error": ["cannot run as handler(items, state)", "nope"],
    "not_structured": ["structured dtype"],
    "set_reply_without_reply_dtype": ["set_reply", "plain", "reply_dtype"],
    "set_reply_wrong_dtype": ["set_reply", "item_dtype", "reply_dtype"],
    "flush_before_set_reply": ["set_reply() was not called", "later"],
}
for name, (etype, msg) in checks.items():
    ok = etype == "AggregationError" and all(w in msg for w in expect_words[name])
    agree("error_" + name, ok, etype=etype, msg=msg)
agree("errors_leave_aggregator_usable", still_works)
print(f"rank {rank} done", flush=True)
'''

TIMEOUT_PROG = r'''
import time
import numba
import numpy as np
from nbmpi.workers import AggregationTimeout, Aggregator, world

comm = world()
rank = comm.Get_rank()
DT = np.dtype([("loc", np.int64)])

@numba.njit
def count(items, table):
    for i in range(items.shape[0]):
        table[items[i]["loc"]] += 1

table = np.zeros(4, np.int64)
agg = Aggregator(DT, count, table, buffer_items=4, timeout=1.0)
if rank == 0:
    try:
        agg.flush()            # rank 1 is late: the counting wave cannot complete
        print("NO TIMEOUT", flush=True)
    except AggregationTimeout as exc:
        print("TIMEOUT " + str(exc), flush=True)
    agg.push(1, (1,))          # still usable: these items belong to the resumed flush
    agg.push(0, (2,))
    agg.flush(timeout=30)      # resumes the pending counting wave, rank 1 joins it
else:
    time.sleep(2.0)
    agg.flush(timeout=30)      # one flush: covers rank 0's items pushed after its timeout
print(f"RESULT {rank} {table.tolist()}", flush=True)
agg.push(1 - rank, (3,))       # and the next epoch works as usual
agg.flush(timeout=30)
print(f"NEXT {rank} {table.tolist()} flushes={agg.stats()['flushes']} timeouts={agg.stats()['flush_timeouts']}",
      flush=True)
agg.close()

# a push_many that times out waiting for a free send buffer (rank 1 does not progress): it says how many
# items it placed, and pushing the rest continues without loss or duplicates
t2 = np.zeros(8, np.int64)
small = Aggregator(DT, count, t2, buffer_items=2, pool_buffers=3, recv_buffers=1, timeout=1.0, name="small")
if rank == 0:
    n = 200
    its = np.zeros(n, DT)
    its["loc"] = np.arange(n) % 8
    try:
        small.push_many(np.ones(n, np.int64), its)
        print("NO PUSH TIMEOUT", flush=True)
    except AggregationTimeout as exc:
        k = exc.items_placed
        print(f"PUSH TIMEOUT placed={k} " + str(exc), flush=True)
        small.push_many(np.ones(n - k, np.int64), its[k:])
    small.flush(timeout=30)
else:
    time.sleep(2.0)
    small.flush(timeout=30)
print(f"SMALL {rank} {t2.tolist()}", flush=True)
small.close()
'''


@pytest.fixture(scope="module", params=[2, 3], ids=["2ranks", "3ranks"])
def cases(request, tmp_path_factory):
    n = request.param
    proc = nbmpi_run(tmp_path_factory.mktemp(f"agg{n}"), CASES_PROG, n=n, timeout=120)
    assert_ok(proc)
    out = {}
    for line in proc.stdout.splitlines():
        at = line.find("CASE {")
        if at >= 0:
            # the ranks' stdout is merged by mpiexec, so another rank's text may stand before or
            # after a record on the same line: parse the first JSON object after the marker
            rec, _ = json.JSONDecoder().raw_decode(line[at + 5:])
            out[rec["case"]] = rec
    assert f"rank {n - 1} done" in proc.stdout
    return out


def check(cases, name):
    assert name in cases, f"case {name} did not report; got {sorted(cases)}"
    rec = cases[name]
    assert rec["ok"], json.dumps(rec, indent=1)
    return rec


def test_histogram_counts_exact(cases):
    check(cases, "histogram_exact")
    check(cases, "histogram_second_epoch")


def test_send_paths_and_replaced_state_count_exactly(cases):
    check(cases, "hot_path_variants")


def test_push_many_inputs_of_every_kind_count_exactly(cases):
    check(cases, "push_many_input_kinds")


def test_stats_are_consistent(cases):
    rec = check(cases, "stats_consistent")
    s = rec["details"][0]["stats"]
    assert {"items_pushed", "buffers_full", "buffers_flush", "bytes_sent", "bytes_received", "mean_fill",
            "messages_sent", "local_buffers"} <= set(s)


def test_termination_with_handler_generated_traffic(cases):
    rec = check(cases, "termination_handler_traffic")
    assert all(d["waves"] >= 2 for d in rec["details"])  # two equal counting waves are required
    check(cases, "nothing_left_after_flush")


def test_index_gather_matches_serial_answer(cases):
    check(cases, "index_gather")


def test_reply_cycle_request_reply_ack(cases):
    """Q's handler replies into P, P's handler acks back into Q: a cycle, tiny buffers, exact results."""
    check(cases, "reply_cycle_request_reply_ack")


def test_reply_cycle_self_loop(cases):
    check(cases, "reply_cycle_self_loop")


def test_handler_error_breaks_aggregator_clearly(cases):
    check(cases, "handler_error_breaks_clearly")


def test_all_to_all_tiny_buffers_no_deadlock(cases):
    rec = check(cases, "all_to_all_tiny_buffers")
    assert all(d["messages_sent"] > 1000 for d in rec["details"])


def test_bounded_memory(cases):
    check(cases, "bounded_memory")


def test_one_trace_arrow_per_buffer(cases):
    check(cases, "trace_one_arrow_per_buffer")


@pytest.mark.parametrize("name", [
    "push_dest_too_big", "push_dest_negative", "push_many_dest_out", "push_wrong_dtype_scalar", "push_not_an_item",
    "push_many_wrong_dtype", "push_many_length_mismatch", "push_after_close", "push_many_after_close",
    "flush_after_close", "handler_not_compiled", "handler_typing_error", "not_structured",
    "set_reply_without_reply_dtype", "set_reply_wrong_dtype", "flush_before_set_reply"])
def test_errors(cases, name):
    check(cases, "error_" + name)


def test_errors_leave_aggregator_usable(cases):
    check(cases, "errors_leave_aggregator_usable")


def test_timeouts_name_rank_and_operation_and_leave_aggregator_usable(run_mpi):
    """A flush that times out names rank and operation; the aggregator stays usable and the next
    flush() resumes the same flush, covering items pushed in between. A push_many that times out
    reports how many items it placed; pushing the rest continues exactly."""
    proc = run_mpi(TIMEOUT_PROG, n=2, timeout=60)
    out = proc.stdout + proc.stderr
    assert_ok(proc)
    assert "TIMEOUT rank 0: flush on Aggregator timed out" in proc.stdout, out
    assert "stays usable: call flush() again to resume" in proc.stdout, out
    assert "RESULT 0 [0, 0, 1, 0]" in proc.stdout and "RESULT 1 [0, 1, 0, 0]" in proc.stdout, out
    assert "NEXT 0 [0, 0, 1, 1] flushes=2 timeouts=1" in proc.stdout, out
    assert "NEXT 1 [0, 1, 0, 1] flushes=2 timeouts=0" in proc.stdout, out
    # push_many timeout: partial placement reported, the rest pushed afterwards, exact counts
    assert "PUSH TIMEOUT placed=" in proc.stdout and "push_many(dests[" in proc.stdout, out
    assert "SMALL 0 [0, 0, 0, 0, 0, 0, 0, 0]" in proc.stdout, out
    assert "SMALL 1 [25, 25, 25, 25, 25, 25, 25, 25]" in proc.stdout, out


def test_benchmark_quick_writes_json(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "aggregation.py"), "--quick",
                           "--out-dir", str(tmp_path)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((tmp_path / "aggregation_quick.json").read_text())
    assert data["nranks"] == 2 and data["quick"] is True
    hm = data["histogram"]["methods"]
    assert set(hm) == {"naive", "alltoallv", "aggregator"}
    for m in hm.values():
        assert m["updates_per_s_per_rank"] > 0 and m["verified"] is True
        assert m["ratio_to_naive"] > 0 and m["ratio_to_alltoallv"] > 0
    assert set(data["index_gather"]["methods"]) == {"naive", "aggregator"}
    assert all(m["verified"] is True for m in data["index_gather"]["methods"].values())
    assert [r["buffer_items"] for r in data["histogram"]["sweep"]] == data["config"]["sweep"]
    assert all(t["status"] in ("PASS", "FAIL") for t in data["targets"])
    names = " ".join(t["target"] for t in data["targets"])
    assert "naive" in names and "alltoallv" in names and "index-gather" in names
    # every sweep size is checked from its own measured ratio (issue 18 point 7)
    by_name = {t["target"]: t for t in data["targets"]}
    for r in data["histogram"]["sweep"]:
        t = by_name[f"histogram aggregator / alltoallv beside it, buffer {r['buffer_items']} items (sweep)"]
        assert t["measured"] == r["ratio_to_alltoallv"] == r["updates_per_s_per_rank"] / r[
            "alltoallv_updates_per_s_per_rank"]
        assert t["limit"] == 1.0 and t["status"] == ("PASS" if t["measured"] >= 1.0 else "FAIL")
    assert data["machine"]["commit"] and "loadavg" in data["machine"]
    md = (tmp_path / "aggregation_quick.md").read_text()
    assert "## Histogram" in md and "## Index-gather" in md and "## Targets" in md and "at commit `" in md
