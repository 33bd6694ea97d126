"""ArrayChannel under real mpiexec with 2 and 3 ranks (3 = uneven binomial trees).

Each test runs ONE MPI program that performs many checks; every check raises
an AssertionError naming the case, the rank and what differed, so a failure
points at the broken operation (the program's stderr is in the pytest output).
"""
import pytest

from conftest import assert_ok

# Shared helpers prepended to every MPI program below.
PRELUDE = r'''
import functools, sys, time
import numpy as np
import numba
from nbmpi.workers import ArrayChannel, ChannelError, ChannelTimeout, CommTimeout, world

comm = world()
rank, size = comm.Get_rank(), comm.Get_size()


def check(cond, case, detail=""):
    if not cond:
        raise AssertionError(f"[rank {rank}] {case}: {detail}")


def same(a, b, case):
    check(np.array_equal(np.asarray(a), np.asarray(b)), case, f"got\n{np.asarray(a)!r}\nexpected\n{np.asarray(b)!r}")


def expect_error(case, exc_type, fn, *must_contain):
    """fn() must raise exc_type whose message contains every string of must_contain."""
    try:
        fn()
    except exc_type as exc:
        msg = str(exc)
        for s in must_contain:
            check(s in msg, case, f"message {msg!r} does not contain {s!r}")
        return exc
    except Exception as exc:  # noqa: BLE001
        raise AssertionError(f"[rank {rank}] {case}: expected {exc_type.__name__}, got "
                             f"{type(exc).__name__}: {exc}") from exc
    raise AssertionError(f"[rank {rank}] {case}: expected {exc_type.__name__}, nothing was raised")


class InPlace:
    """Remembers a channel's buffer object and address; check() asserts they never change."""
    def __init__(self, ch):
        self.ch, self.buf, self.ptr = ch, ch.buffer, ch.buffer.ctypes.data

    def check(self, case):
        check(self.ch.buffer is self.buf, case, "ch.buffer was rebound to a new array")
        check(self.ch.buffer.ctypes.data == self.ptr, case, "ch.buffer moved in memory")
'''

OPS = PRELUDE + r'''
@numba.njit
def plus_one(a, b):          # associative and commutative: reduce over n ranks = sum + (n - 1)
    return a + b + 1


NP_OPS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}
CASES = [(np.float64, (7, 5)), (np.int32, (6,)), (np.complex128, (3, 4))]


def init(dtype, shape, r):
    """Deterministic per-rank data every rank can recompute (small values: exact products)."""
    k = np.arange(int(np.prod(shape))).reshape(shape)
    v = ((k * 7 + r * 3) % 5 + 1 + r).astype(dtype)
    if np.dtype(dtype).kind == "c":
        v = v + 1j * ((k + r) % 3).astype(np.float64)
    return v


for dtype, shape in CASES:
    tag = f"{np.dtype(dtype).name}{shape}"
    ch = ArrayChannel(shape, dtype)
    check(ch.buffer.shape == shape and ch.buffer.dtype == np.dtype(dtype), f"{tag} construct",
          f"buffer {ch.buffer.shape} {ch.buffer.dtype}")
    keep = InPlace(ch)
    mine = init(dtype, shape, rank)

    # -- put/take in place: a token travels 0 -> 1 -> ... -> n-1 -> 0, +1 at every hop --------
    for direction in (+1, -1):
        case = f"{tag} put/take ring dir={direction}"
        ch.buffer[...] = mine
        nxt, prv = (rank + direction) % size, (rank - direction) % size
        if rank == 0:
            ch.put(nxt)
            got = ch.take(prv)
            check(got is keep.buf, case, "take() did not return the channel's buffer")
            same(ch.buffer, mine + (size - 1), case)
        else:
            got = ch.take(prv)
            check(got is keep.buf, case, "take() did not return the channel's buffer")
            same(ch.buffer, init(dtype, shape, 0) + (rank if direction > 0 else size - rank) - 1, case)
            ch.buffer[...] += 1            # modify in place, then forward the same buffer
            ch.put(nxt)
        keep.check(case)

    # -- reduce: every op, every root; result only in root's buffer ----------------------------
    ops = ["sum", "prod", "min", "max", plus_one]
    for op in ops:
        if np.dtype(dtype).kind == "c" and op in ("min", "max"):
            continue  # complex is unordered: rejected, see test_channel_errors
        name = op if isinstance(op, str) else "njit plus_one"
        everyone = [init(dtype, shape, r) for r in range(size)]
        if isinstance(op, str):
            expected = functools.reduce(NP_OPS[op], everyone)
        else:
            expected = functools.reduce(np.add, everyone) + (size - 1)
        for root in range(size):
            case = f"{tag} reduce({name}, root={root})"
            ch.buffer[...] = mine
            out = ch.reduce(op, root=root)
            if rank == root:
                check(out is keep.buf, case, "root did not get its own buffer back")
                same(ch.buffer, expected.astype(dtype), case)
            else:
                check(out is None, case, f"non-root returned {type(out).__name__}, expected None")
                same(ch.buffer, mine, case + " (non-root buffer must be unchanged)")
            keep.check(case)
        case = f"{tag} allreduce({name})"
        ch.buffer[...] = mine
        out = ch.allreduce(op)
        check(out is keep.buf, case, "allreduce did not return the buffer")
        same(ch.buffer, expected.astype(dtype), case)
        keep.check(case)

    # -- bcast from every root -------------------------------------------------------------------
    for root in range(size):
        case = f"{tag} bcast(root={root})"
        ch.buffer[...] = mine
        out = ch.bcast(root=root)
        check(out is keep.buf, case, "bcast did not return the buffer")
        same(ch.buffer, init(dtype, shape, root), case)
        keep.check(case)
    ch.close()


# -- scatter / gather on a 2-D float64 buffer (7 x 5), on an int32 and a complex128 buffer -----
def region_sets(shape):
    rows = shape[0]
    sets = {
        "axis=0": dict(axis=0),
        "axis=1 (non-contiguous)": dict(axis=1) if len(shape) > 1 else None,
        "map uneven": dict(regions={r: (b, e) for r, (b, e) in
                                    enumerate([(0, 1), (1, rows - 2), (rows - 2, rows)][:size])}),
        "map ranges+slices": dict(regions={r: (range(0, 2) if r == 0 else slice(2 + 2 * (r - 1), 4 + 2 * (r - 1)))
                                           for r in range(size)}),
        # the seed's dim_map as a callable: rank -> index range (last row uncovered)
        "callable dim_map": dict(regions=lambda r: range(r * 2, r * 2 + 2)),
        # map of boxes (tuple of slices): rank r owns column r of the first two rows
        "map 2-D boxes": dict(regions={r: (slice(0, 2), slice(r, r + 1)) for r in range(size)})
        if len(shape) > 1 else None,
    }
    return {k: v for k, v in sets.items() if v is not None}


for dtype, shape in [(np.float64, (7, 5)), (np.int32, (7,)), (np.complex128, (7, 3))]:
    tag = f"{np.dtype(dtype).name}{shape}"
    ch = ArrayChannel(shape, dtype)
    keep = InPlace(ch)
    for rname, kw in region_sets(shape).items():
        regions = ch.regions(**kw)
        check(sorted(regions) == list(range(size)), f"{tag} regions {rname}", f"keys {sorted(regions)}")
        if rname == "axis=0":
            sizes = [regions[r][0].stop - regions[r][0].start for r in range(size)]
            check(sizes == [len(c) for c in np.array_split(np.arange(shape[0]), size)],
                  f"{tag} regions {rname}", f"split sizes {sizes}")
        roots = range(size) if dtype is np.float64 else [size - 1]
        for root in roots:
            # scatter: root's data lands in each rank's region; everything else untouched
            case = f"{tag} scatter(root={root}, {rname})"
            src = init(dtype, shape, 100 + root)
            before = src if rank == root else np.full(shape, -1 - rank, dtype=dtype)
            ch.buffer[...] = before
            view = ch.scatter(root=root, **kw)
            expected = before.copy()
            expected[regions[rank]] = src[regions[rank]]
            same(ch.buffer, expected, case)
            check(np.shares_memory(view, ch.buffer), case, "returned region is not a view of the buffer")
            same(view, ch.buffer[regions[rank]], case + " (returned view)")
            keep.check(case)
            # gather: root's buffer gets every rank's region of that rank's buffer
            case = f"{tag} gather(root={root}, {rname})"
            ch.buffer[...] = init(dtype, shape, rank)
            out = ch.gather(root=root, **kw)
            if rank == root:
                expected = init(dtype, shape, root)
                for r in range(size):
                    expected[regions[r]] = init(dtype, shape, r)[regions[r]]
                check(out is keep.buf, case, "root did not get its whole buffer back")
            else:
                expected = init(dtype, shape, rank)
            same(ch.buffer, expected, case)
            keep.check(case)
    ch.close()

print(f"rank {rank}: channel ops OK", flush=True)
'''


@pytest.mark.parametrize("n", [2, 3])
def test_channel_ops_in_place(run_mpi, n):
    """put/take, reduce (sum/prod/min/max/njit, every root), allreduce, bcast (every root),
    scatter/gather (axis 0/1, maps, callable, uneven) for float64/int32/complex128 and 2-D
    shapes; the buffer object and its address never change."""
    proc = run_mpi(OPS, n=n, timeout=150)
    assert_ok(proc)
    for r in range(n):
        assert f"rank {r}: channel ops OK" in proc.stdout, proc.stdout + proc.stderr


SUBSET = PRELUDE + r'''
parts = [0, 2]
if rank == 1:
    expect_error("non-participant constructs", ChannelError,
                 lambda: ArrayChannel(4, participants=parts), "rank 1", "not a participant", "[0, 2]")
else:
    ch = ArrayChannel((2, 3), np.int32, participants=parts)
    keep = InPlace(ch)
    other = 2 if rank == 0 else 0
    check(ch.participants == parts, "participants", str(ch.participants))
    # put/take between the two participants
    ch.buffer[...] = rank + 1
    if rank == 0:
        ch.put(2)
        ch.take(2)
        same(ch.buffer, np.full((2, 3), 3 + 1), "subset put/take")
    else:
        ch.take(0)
        same(ch.buffer, np.full((2, 3), 1), "subset take")
        ch.buffer[...] += 3
        ch.put(0)
    # collectives among the participants only
    ch.buffer[...] = rank + 1                      # 1 on rank 0, 3 on rank 2
    ch.reduce("sum", root=2)
    same(ch.buffer, np.full((2, 3), 4 if rank == 2 else 1), "subset reduce root=2")
    ch.buffer[...] = rank + 1
    ch.allreduce("max")
    same(ch.buffer, np.full((2, 3), 3), "subset allreduce max")
    ch.buffer[...] = rank
    ch.bcast(root=2)
    same(ch.buffer, np.full((2, 3), 2), "subset bcast root=2")
    ch.buffer[...] = np.arange(6).reshape(2, 3) * (10 if rank == 0 else -1)
    ch.scatter(root=0, axis=1)           # columns [0:2] -> rank 0, [2:3] -> rank 2
    if rank == 2:
        same(ch.buffer, [[0, -1, 20], [-3, -4, 50]], "subset scatter axis=1")
    ch.buffer[...] = rank
    ch.gather(root=2, regions={0: (0, 1), 2: (1, 2)})
    if rank == 2:
        same(ch.buffer, [[0, 0, 0], [2, 2, 2]], "subset gather map")
    # the non-participant is named in every error
    expect_error("put to non-participant", ChannelError, lambda: ch.put(1),
                 f"rank {rank}", "put(dest=1)", "rank 1 is not a participant")
    expect_error("take from non-participant", ChannelError, lambda: ch.take(1),
                 f"rank {rank}", "take(src=1)", "rank 1 is not a participant")
    expect_error("reduce to non-participant root", ChannelError, lambda: ch.reduce("sum", root=1),
                 f"rank {rank}", "reduce(op=sum, root=1)", "root 1 is not a participant")
    expect_error("bcast from non-participant root", ChannelError, lambda: ch.bcast(root=1),
                 f"rank {rank}", "bcast(root=1)", "root 1")
    expect_error("regions for non-participant", ChannelError,
                 lambda: ch.scatter(root=0, regions={0: (0, 1), 1: (1, 2)}), "scatter(root=0)", "[1]")
    keep.check("subset channel in place")
    ch.close()
from nbmpi.workers import gather_trace
trace = gather_trace(root=0)   # peers are recorded as COMM_WORLD ranks (2, not local index 1)
if rank == 0:
    s = trace.summary()
    check(s["unmatched"] == 0, "subset trace matched", str(s["unmatched"]))
    msgs = np.array(s["messages"])
    check(msgs[:, 1].sum() == 0 and msgs[1, :].sum() == 0, "no traffic to/from rank 1", str(msgs))
    # 0->2: put, reduce(root=2), allreduce's bcast, scatter(root=0), gather(root=2)
    # 2->0: put, allreduce's reduce, bcast(root=2)
    check(msgs[0, 2] == 5 and msgs[2, 0] == 3, "subset traffic 0<->2", str(msgs))
comm.Barrier()
print(f"rank {rank}: subset OK", flush=True)
'''


def test_channel_participants_subset(run_mpi):
    """A channel over ranks [0, 2] of 3: rank 1 may not create it; ops among 0 and 2 work;
    naming rank 1 as peer or root is an error naming it."""
    proc = run_mpi(SUBSET, n=3)
    assert_ok(proc)
    for r in range(3):
        assert f"rank {r}: subset OK" in proc.stdout, proc.stdout + proc.stderr


ERRORS = PRELUDE + r'''
# -- mismatched shape / dtype at construction: every participant raises, naming the differing rank
odd = size - 1
expect_error("shape mismatch", ChannelError,
             lambda: ArrayChannel(5 if rank == odd else 4, np.float64),
             f"rank {rank}:", f"rank {odd} created it with shape (5,)", "shape (4,)", "same shape and dtype")
expect_error("dtype mismatch (float32 vs float64)", ChannelError,
             lambda: ArrayChannel(4, np.float32 if rank == odd else np.float64),
             f"rank {rank}:", f"rank {odd} created it with shape (4,) dtype float32", "dtype float64")
expect_error("dtype mismatch (same itemsize: int64 vs float64)", ChannelError,
             lambda: ArrayChannel(4, np.int64 if rank == odd else np.float64),
             f"rank {odd} created it with shape (4,) dtype int64")
if size == 3:
    expect_error("shape mismatch on rank 0 (majority is the reference)", ChannelError,
                 lambda: ArrayChannel((2, 2) if rank == 0 else (4,)),
                 f"rank {rank}:", "rank 0 created it with shape (2, 2)", "rank(s) [1, 2] with shape (4,)")

ch = ArrayChannel(7, np.float64)
check(ch.timeout == 60.0, "default timeout from NBMPI_TIMEOUT=60", repr(ch.timeout))
ch.buffer[...] = rank
keep = InPlace(ch)
peer = (rank + 1) % size

# -- point to point: self / non-existent rank -------------------------------------------------
expect_error("put to self", ChannelError, lambda: ch.put(rank), f"rank {rank}", f"put(dest={rank})", "itself")
expect_error("take from self", ChannelError, lambda: ch.take(rank), f"rank {rank}", f"take(src={rank})", "itself")
expect_error("put to rank outside the communicator", ChannelError, lambda: ch.put(size + 3),
             f"rank {rank}", f"put(dest={size + 3})", f"rank {size + 3} is not a participant")
expect_error("take from negative rank", ChannelError, lambda: ch.take(-1),
             f"rank {rank}", "take(src=-1)", "rank -1 is not a participant")

# -- reduction ops ------------------------------------------------------------------------------
def plain_python(a, b):
    return a + b

expect_error("unknown op 'avg'", ChannelError, lambda: ch.reduce("avg", root=0),
             f"rank {rank}", "reduce(op=avg, root=0)", "unknown op 'avg'", "'sum'")
expect_error("unknown op in allreduce", ChannelError, lambda: ch.allreduce("avg"),
             f"rank {rank}", "allreduce(op=avg)", "unknown op 'avg'")
expect_error("plain Python function", ChannelError, lambda: ch.reduce(plain_python, root=1),
             f"rank {rank}", "reduce(op=plain_python, root=1)", "numba.njit")
@numba.njit
def not_for_floats(a, b):
    return a + "x"

expect_error("njit op that does not type for the dtype", ChannelError,
             lambda: ch.reduce(not_for_floats, root=0),
             f"rank {rank}", "reduce(op=not_for_floats, root=0)", "cannot combine", "float64")
expect_error("root out of range", ChannelError, lambda: ch.reduce("sum", root=size),
             f"rank {rank}", f"root {size} is not a participant")
cplx = ArrayChannel(3, np.complex128)
expect_error("max of complex", ChannelError, lambda: cplx.allreduce("max"),
             f"rank {rank}", "allreduce(op=max)", "complex")
cplx.close()

# -- scatter/gather regions -------------------------------------------------------------------
regs = {0: (0, 3), 1: (2, 5)}
if size == 3:
    regs[2] = (5, 7)
expect_error("overlapping regions", ChannelError, lambda: ch.scatter(root=0, regions=regs),
             f"rank {rank}", "scatter(root=0)", "ranks 0", "and 1", "overlap")
expect_error("out-of-bounds region", ChannelError,
             lambda: ch.gather(root=1, regions={0: (0, 3), 1: (5, 9)}),
             f"rank {rank}", "gather(root=1)", "region of rank 1", "[5:9]", "out of bounds", "extent 7")
expect_error("negative start region", ChannelError,
             lambda: ch.scatter(root=0, regions=lambda r: slice(-2, None) if r == 0 else slice(0, 1)),
             "region of rank 0", "out of bounds")
expect_error("step != 1", ChannelError,
             lambda: ch.scatter(root=0, regions={0: slice(0, 6, 2), 1: slice(6, 7)}),
             f"rank {rank}", "scatter(root=0)", "region of rank 0", "step 2")
expect_error("axis out of range", ChannelError, lambda: ch.scatter(root=0, axis=1),
             f"rank {rank}", "axis 1 out of range")
expect_error("region of wrong type", ChannelError,
             lambda: ch.gather(root=0, regions={0: "abc", 1: (1, 2)}), "region of rank 0", "expected a slice")

# nothing above communicated: the channel still works and was not touched
same(ch.buffer, np.full(7, rank, np.float64), "buffer untouched by rejected calls")
ch.allreduce("sum")
same(ch.buffer, np.full(7, sum(range(size)), np.float64), "allreduce after errors")
keep.check("after errors")

# -- use after close ------------------------------------------------------------------------------
ch.close()
ch.close()  # idempotent
same(ch.buffer, np.full(7, sum(range(size)), np.float64), "buffer readable after close")
for opname, fn in [("put", lambda: ch.put(peer)), ("take", lambda: ch.take(peer)),
                   ("reduce", lambda: ch.reduce("sum")), ("allreduce", lambda: ch.allreduce("sum")),
                   ("bcast", lambda: ch.bcast(0)), ("scatter", lambda: ch.scatter(0)),
                   ("gather", lambda: ch.gather(0))]:
    expect_error(f"{opname} after close", ChannelError, fn, f"rank {rank}", opname, "after close()")

comm.Barrier()
import os
os.environ["NBMPI_SHM_CHUNK"] = str(4096 * (rank + 1))   # same-node piece size differs between ranks
expect_error("piece size differs", ChannelError, lambda: ArrayChannel(70001, np.float32, name="chunky"),
             "NBMPI_SHM_CHUNK differs", "same value on every rank")
os.environ["NBMPI_SHM_CHUNK"] = "many"
expect_error("piece size not a number", ChannelError, lambda: ArrayChannel(70001, np.float32), "NBMPI_SHM_CHUNK",
             "positive byte count")
del os.environ["NBMPI_SHM_CHUNK"]
print(f"rank {rank}: errors OK", flush=True)
'''


@pytest.mark.parametrize("n", [2, 3])
def test_channel_errors(run_mpi, n):
    """Every misuse raises ChannelError naming rank, peer and operation, without communicating."""
    proc = run_mpi(ERRORS, n=n)
    assert_ok(proc)
    for r in range(n):
        assert f"rank {r}: errors OK" in proc.stdout, proc.stdout + proc.stderr


TIMEOUTS = PRELUDE + r'''
import re

ch = ArrayChannel(16, np.float64)
keep = InPlace(ch)

# -- take whose partner never sends: ChannelTimeout, then the channel still works ----------------
if rank == 1:
    t = time.monotonic()
    exc = expect_error("take timeout", ChannelTimeout, lambda: ch.take(0, timeout=0.4),
                       "rank 1", "take(src=0)", "timed out after", "waiting for rank 0")
    m = re.search(r"after ([0-9.]+) s", str(exc))
    check(m is not None and float(m.group(1)) >= 0.4, "take timeout reports waited time", str(exc))
    check(isinstance(exc, CommTimeout) and isinstance(exc, ChannelError), "take timeout type",
          type(exc).__mro__)
    check((exc.rank, exc.peer, exc.op) == (1, 0, "take(src=0)") and exc.waited >= 0.4,
          "take timeout attributes", f"{exc.rank} {exc.peer} {exc.op} {exc.waited}")
comm.Barrier()
for k in range(3):  # the cancelled receive is reusable: three real transfers in both directions
    if rank == 0:
        ch.buffer[...] = 40 + k
        ch.put(1, timeout=30)
        ch.take(1, timeout=30)
        same(ch.buffer, np.full(16, 41 + k), f"after take timeout: round {k} back on rank 0")
    else:
        ch.take(0, timeout=30)
        same(ch.buffer, np.full(16, 40 + k), f"after take timeout: round {k} on rank 1")
        ch.buffer[...] += 1
        ch.put(0, timeout=30)
keep.check("take timeout")

check(ch.timeout is None, "NBMPI_TIMEOUT unset -> no default timeout", repr(ch.timeout))

# -- an interrupt (Ctrl-C / Jupyter interrupt = KeyboardInterrupt) ends a blocked take; the
#    receive is cancelled and the channel stays usable ------------------------------------------
import signal
from nbmpi.workers.core import waiting
seen = []
if rank == 1:
    def interrupt(signum, frame):
        seen.append(waiting.current)
        raise KeyboardInterrupt
    signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    expect_error("interrupted take", KeyboardInterrupt, lambda: ch.take(0))  # no timeout at all
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    check(seen and seen[0][:2] == ("take(src=0)", 0), "waiting.current while blocked", repr(seen))
    check(waiting.current is None, "waiting.current cleared after the interrupt", repr(waiting.current))
comm.Barrier()
if rank == 0:
    ch.buffer[...] = 77
    ch.put(1, timeout=30)
else:
    ch.take(0, timeout=30)
    same(ch.buffer, np.full(16, 77.0), "transfer after an interrupted take")
keep.check("interrupted take")

# -- gather whose root never hears from a rank: the root's receives are cancelled ---------------
if rank == 0:
    expect_error("gather timeout on root", ChannelTimeout, lambda: ch.gather(root=0, timeout=0.3),
                 "rank 0", "gather(root=0)", "waiting for rank 1")
comm.Barrier()
ch.buffer[...] = rank + 1
ch.gather(root=0, timeout=30)
if rank == 0:
    same(ch.buffer, np.r_[np.full(8, 1.0), np.full(8, 2.0)], "gather after a gather timeout")

# -- default timeout of the channel (constructor timeout=) applies to collectives -------------
ch2 = ArrayChannel(4, np.float64, timeout=0.3)
if rank == 1:
    expect_error("reduce timeout (channel default)", ChannelTimeout, lambda: ch2.reduce("sum", root=1),
                 "rank 1", "reduce(op=sum, root=1)", "waiting for rank 0")
comm.Barrier()
ch2.buffer[...] = rank + 1
ch2.allreduce("sum", timeout=30)  # the cancelled reduce receive did not break the channel
same(ch2.buffer, np.full(4, 3.0), "allreduce after reduce timeout")
ch2.close()

# -- put whose partner never takes ------------------------------------------------------------
ch3 = ArrayChannel(16, np.float64)
status = np.zeros(1, np.int64)
if rank == 0:
    ch3.buffer[...] = 5
    exc = expect_error("put timeout", ChannelTimeout, lambda: ch3.put(1, timeout=0.4),
                       "rank 0", "put(dest=1)", "timed out after", "waiting for rank 1")
    check((exc.rank, exc.peer, exc.op) == (0, 1, "put(dest=1)"), "put timeout attributes", str(exc))
    # MPI cannot reliably cancel a synchronous send. Either the channel stays usable, or every
    # later operation says clearly that it is unusable (and why) instead of hanging or mixing data.
    try:
        ch3._usable("probe")  # local check only: does the channel consider itself usable?
        status[0] = 1
    except ChannelError:
        status[0] = 2
    comm.Send(status, dest=1, tag=99)
    if status[0] == 2:
        for opname, fn in [("put", lambda: ch3.put(1, timeout=5)), ("take", lambda: ch3.take(1, timeout=5)),
                           ("reduce", lambda: ch3.reduce("sum", timeout=5))]:
            expect_error(f"{opname} after abandoned put", ChannelError, fn, "rank 0", opname,
                         "unusable", "put(dest=1) was abandoned", "create a new channel")
        print("put-timeout: channel reported unusable", flush=True)
    else:
        ch3.buffer[...] = 6
        ch3.put(1, timeout=30)
        print("put-timeout: channel still usable", flush=True)
else:
    comm.Recv(status, source=0, tag=99)
    if status[0] == 1:
        ch3.take(0, timeout=30)
        same(ch3.buffer, np.full(16, 6.0), "take after partner's put timeout")
comm.Barrier()
print(f"rank {rank}: timeouts OK", flush=True)
'''


def test_channel_timeouts(run_mpi):
    """take/put/reduce with timeout= raise ChannelTimeout naming rank, peer, op and waited time;
    a timed-out take leaves the channel usable, a timed-out put leaves it usable or clearly unusable."""
    proc = run_mpi(TIMEOUTS, n=2, env={"NBMPI_TIMEOUT": ""})
    assert_ok(proc)
    for r in range(2):
        assert f"rank {r}: timeouts OK" in proc.stdout, proc.stdout + proc.stderr
    assert "put-timeout: channel" in proc.stdout


def test_reduce_interior_nodes_accumulate_in_scratch(run_mpi):
    """4 ranks: the only rank count here where a non-root tree node combines a
    child's data (vrank 2 receives from vrank 3) before sending on, which is the
    path through the two scratch buffers. 4 ranks on purpose; one short run."""
    proc = run_mpi(PRELUDE + r'''
@numba.njit
def plus_one(a, b):
    return a + b + 1


ch = ArrayChannel((5, 3), np.float64, name="tree4")
addr = ch.buffer.ctypes.data
for op, expect in (("sum", lambda v: v.sum(0)), ("prod", lambda v: v.prod(0)),
                   ("min", lambda v: v.min(0)), ("max", lambda v: v.max(0)),
                   (plus_one, lambda v: v.sum(0) + (size - 1))):
    for root in range(size):
        mine = np.arange(15, dtype=np.float64).reshape(5, 3) * (rank + 1) + rank
        ch[...] = mine
        ch.reduce(op, root=root)
        allv = np.stack([np.arange(15.0).reshape(5, 3) * (r + 1) + r for r in range(size)])
        if rank == root:
            same(ch.buffer, expect(allv), f"reduce {op} root {root}")
        else:
            same(ch.buffer, mine, f"reduce {op} root {root}: non-root buffer must not change")
    ch[...] = rank + 1.0
    ch.allreduce(op)
    allv = np.stack([np.full((5, 3), r + 1.0) for r in range(size)])
    same(ch.buffer, expect(allv), f"allreduce {op}")
check(ch.buffer.ctypes.data == addr, "buffer identity", "the persistent buffer was replaced")
print("ok", rank)
''', n=4)
    assert_ok(proc)
    assert proc.stdout.count("ok") == 4


SAME_NODE = PRELUDE + r'''
import os
from nbmpi.workers import gather_trace, get_tracer

from nbmpi.workers.channels.channel import SAME_NODE_COPY

shm_on = os.environ.get("NBMPI_SHM_MIN_BYTES") != "off"
if os.environ.get("TEST_ONE_CPU"):   # both ranks on one core: the running rank copies the other's pieces too
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
check(SAME_NODE_COPY == "compiled", "the same-node copy is compiled by the install", SAME_NODE_COPY)
# 70001 float32 = 280004 bytes: above the shared-memory threshold, not a multiple of 64 (nor of
# a 4096-byte piece: the last piece is partial)
ch = ArrayChannel(70001, np.float32, name="big")
others = [r for r in range(size) if r != rank]
check(ch.same_node_peers == (others if shm_on else []), "same_node_peers", str(ch.same_node_peers))
check(ch.same_node_how == ("memfd" if shm_on else "off: NBMPI_SHM_MIN_BYTES=off"), "same_node_how",
      ch.same_node_how)
leftover = [f for f in os.listdir("/dev/shm") if f.startswith(f"nbmpi-{os.getpid()}-")]
check(leftover == [], "segments are unlinked once mapped", str(leftover))
saved_min = os.environ.get("NBMPI_SHM_MIN_BYTES")
os.environ["NBMPI_SHM_MIN_BYTES"] = "1000" if shm_on else "off"
small = ArrayChannel(100, np.float64, name="small")   # 800 bytes: below the threshold
check(small.same_node_peers == [], "channels below NBMPI_SHM_MIN_BYTES stay on MPI messages",
      str(small.same_node_peers))
check(small.same_node_how.startswith("off:"), "and say so", small.same_node_how)
os.environ["NBMPI_SHM_MIN_BYTES"] = saved_min if saved_min is not None else ""
tiny = ArrayChannel(3, np.float64, name="tiny")      # by default even 24 bytes go through shared memory
check(tiny.same_node_peers == (others if shm_on else []), "small channels in shared memory by default",
      str(tiny.same_node_peers))
for it in range(3):
    if rank == 0:
        tiny.buffer[...] = [it, 1, 2]
        tiny.put(1)
    elif rank == 1:
        tiny.take(0)
        same(tiny.buffer, [it, 1, 2], f"tiny channel round {it}")
tiny.close()
keep = InPlace(ch)
base = np.arange(70001, dtype=np.float32)
mark = get_tracer().mark()
rounds = 0
for a in range(size):                      # every ordered pair, both directions, several rounds
    for b in range(a + 1, size):
        for it in range(3):
            if rank == a:
                ch.buffer[...] = base + 1000 * a + it
                ch.put(b)
                ch.take(b)
                same(ch.buffer, base + 1000 * b + it + 0.5, f"reply from {b} round {it}")
            elif rank == b:
                got = ch.take(a)
                check(got is ch.buffer, "take returns the buffer")
                same(ch.buffer, base + 1000 * a + it, f"data from {a} round {it}")
                ch.buffer[...] = base + 1000 * b + it + 0.5
                ch.put(a)
            rounds += 1
keep.check("shared-memory put/take keep the one buffer")
ch.buffer += 1.0                           # in-place op through the property: allowed
expect_error("buffer cannot be replaced", ChannelError, lambda: setattr(ch, "buffer", base), "ch.buffer[...]")
ch.buffer[...] = rank
ch.allreduce("sum")                        # collectives on a shared-memory buffer
same(ch.buffer, np.full(70001, sum(range(size)), np.float32), "allreduce on the shared buffer")
tr = gather_trace(since=mark)
if rank == 0:
    p2p = [i for i in range(len(tr)) if tr.op_label(i).split("(")[0] in ("put", "take")]
    check(len(p2p) == 4 * rounds, "one trace event per put and per take", f"{len(p2p)} != {4 * rounds}")
    matched = set(tr.flow_pairs.ravel().tolist())
    check(all(i in matched for i in p2p), "every put matched to its take (flow arrows)",
          f"{len(tr.flow_pairs)} flow pairs for {len(p2p)} events")
comm.Barrier()
if size == 2:                              # a partner that arrives late: the transfer resumes, slice by slice
    for it in range(2):
        if rank == 0:
            ch.buffer[...] = base * 2 + it
            time.sleep(0.2)
            ch.put(1)
        else:
            ch.take(0)
            same(ch.buffer, base * 2 + it, f"late sender round {it}")
        comm.Barrier()
if shm_on:
    # a same-node take that times out before the sender came is withdrawn: clear error, channel usable
    if rank == 0:
        expect_error("shm take timeout", ChannelTimeout, lambda: ch.take(1, timeout=0.3), "rank 0", "take(src=1)")
    comm.Barrier()
    if rank == 1:
        ch.buffer[...] = base + 5
        ch.put(0)
    elif rank == 0:
        ch.take(1)
        same(ch.buffer, base + 5, "transfer after a withdrawn take")
    comm.Barrier()
    # Ctrl-C while blocked in a same-node take: it arrives within a slice, the take is withdrawn too
    import signal, threading
    if rank == 0:
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        t0 = time.monotonic()
        try:
            ch.take(1)
        except KeyboardInterrupt:
            waited = time.monotonic() - t0
            check(waited < 5.0, "Ctrl-C ends a same-node wait", f"after {waited:.2f} s")
        else:
            raise AssertionError("take returned without a partner")
    comm.Barrier()
    if rank == 1:
        ch.buffer[...] = base + 6
        ch.put(0)
    elif rank == 0:
        ch.take(1)
        same(ch.buffer, base + 6, "transfer after an interrupted take")
    comm.Barrier()
    # a put cannot be withdrawn (the receiver may be copying from it): the channel refuses work after
    if rank == 0:
        expect_error("shm put timeout", ChannelTimeout, lambda: ch.put(1, timeout=0.3), "rank 0", "put(dest=1)")
        expect_error("unusable after an abandoned put", ChannelError, lambda: ch.take(1), "unusable",
                     "create a new channel")
    comm.Barrier()
ch.close(); small.close()
print(f"[rank {rank}] same-node OK", flush=True)
'''


@pytest.mark.parametrize("n,shm", [(2, "on"), (3, "on"), (2, "4096"), (2, "one-cpu"), (2, "off")])
def test_same_node_shared_memory_put_take(run_mpi, n, shm):
    """Large channels on one node move put/take data through shared memory (one copy shared by
    both ranks, also in many small pieces with a partial last one, also with both ranks on one
    core, where the running rank claims its partner's pieces); results, tracing and errors
    are the same as with MPI messages (NBMPI_SHM_MIN_BYTES=off); a late partner, a timeout and
    Ctrl-C behave as documented."""
    env = {"NBMPI_SHM_MIN_BYTES": "off"} if shm == "off" else {"NBMPI_SHM_MIN_BYTES": ""}
    env["NBMPI_SHM_CHUNK"] = shm if shm[0].isdigit() else ""
    env["TEST_ONE_CPU"] = "1" if shm == "one-cpu" else ""
    proc = run_mpi(SAME_NODE, n=n, env=env)
    assert_ok(proc)
    assert proc.stdout.count("same-node OK") == n


def test_node_segments_agree_per_node(run_mpi):
    """If one rank of a node cannot (or will not) share memory, no rank of the node does, so
    every pair decides the same way; segments are mapped both ways and written through."""
    proc = run_mpi(PRELUDE + r'''
from nbmpi.workers.channels.shared_memory import NodeSegments

seg = NodeSegments(comm, 4096, want=True)
check(seg.enabled and seg.peer_ranks() == [r for r in range(size) if r != rank], "all ranks map each other",
      str(seg.peer_ranks()))
seg.mine[:] = rank + 1
comm.Barrier()
for r in seg.peer_ranks():
    check(np.all(seg.peer(r) == r + 1), f"rank {r}'s segment is visible here")
comm.Barrier()
check(seg.how == "memfd", "memfd segments by default", seg.how)
one_refuses = NodeSegments(comm, 4096, want=(rank != size - 1))
check(not one_refuses.enabled and one_refuses.peer_ranks() == [], "one refusal disables the node")
check("not wanted" in one_refuses.how, "the reason is told", one_refuses.how)
# without memfd (e.g. /proc of the peers not reachable): a /dev/shm file, unlinked once mapped,
# with a zeroed header shared like the data
import os
files = NodeSegments(comm, 10000, header_bytes=300, methods=("file",))
check(files.enabled and files.how == "/dev/shm file", "file segments", files.how)
check(files.header.size == 300 and not files.header.any() and files.mine.size == 10000, "header and data",
      f"{files.header.size} {files.mine.size}")
check(files.mine.ctypes.data % 4096 == 0, "data starts on a page boundary")
check(not [f for f in os.listdir("/dev/shm") if f.startswith(f"nbmpi-{os.getpid()}-")], "file unlinked")
files.header[rank] = rank + 1
files.mine[-1] = rank + 10
comm.Barrier()
for r in files.peer_ranks():
    check(files.peer_header(r)[r] == r + 1 and files.peer(r)[-1] == r + 10, f"rank {r}'s header and data")
comm.Barrier()
print(f"[rank {rank}] segments OK", flush=True)
''', n=3)
    assert_ok(proc)
    assert proc.stdout.count("segments OK") == 3
