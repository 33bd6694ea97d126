"""Lazy fused reductions on shared variables, under real mpiexec (2 and 3 ranks).

Values are checked against closed forms; "one collective per force point" is
checked from the trace (events of kind fused_allreduce). No timings asserted.
"""
import json
import subprocess
import sys

import pytest

from conftest import REPO, assert_ok

PRELUDE = """
import numpy as np
from mpi4py import MPI
from nbmpi.workers import shared, pool, flush, fused, get_tracer, SPMDDivergence, SharedVariableError
from nbmpi.workers.fused_reductions import fuser, configure, K_FUSED
comm = MPI.COMM_WORLD
r, P = comm.Get_rank(), comm.Get_size()
R = np.arange(P, dtype=float)
def ncoll():
    return int(np.sum(get_tracer().events()[:, 0] == K_FUSED))
import os
from nbmpi.workers import fused_reductions as _fr
_want = "python" if os.environ.get("NBMPI_PURE_PYTHON") == "1" else "compiled"
assert _fr.IMPLEMENTATION == _want, (_fr.IMPLEMENTATION, _want)
"""

# Both implementations of the hot path (the compiled extension and the pure-Python
# reference, NBMPI_PURE_PYTHON=1) must give the same results: the semantic tests run
# under both; the prelude asserts which one ran.
IMPLS = [pytest.param(2, "compiled", id="2-compiled"), pytest.param(3, "compiled", id="3-compiled"),
         pytest.param(2, "python", id="2-python")]
# the compiled force point calls MPI_Start/MPI_Test directly; NBMPI_DIRECT_MPI=0 goes through mpi4py
IMPLS_MPI4PY = IMPLS + [pytest.param(2, "compiled-mpi4py", id="2-compiled-mpi4py")]


def impl_env(impl: str, **extra) -> dict:
    return {"NBMPI_PURE_PYTHON": "1" if impl == "python" else "0",
            "NBMPI_DIRECT_MPI": "0" if impl == "compiled-mpi4py" else "1", **extra}

ALL_OPS = PRELUDE + """
s1 = shared(0.0); s2 = shared(0.0)
N = 10
for i in range(3):
    before = ncoll()
    s1.reset(); s2.reset()
    for v in range(5):
        s1 += float(r + v)
    s2 += float((r + 1) ** 2)
    s2 -= 1.0
    var = np.empty(1)
    var[0] = (s2 - s1 * s1 / N) / (N - 1)
    assert ncoll() == before + 1, (before, ncoll())
    S1 = sum(5 * q + 10 for q in range(P)); S2 = sum((q + 1) ** 2 - 1 for q in range(P))
    assert abs(var[0] - (S2 - S1 * S1 / N) / (N - 1)) < 1e-12, var
# every op, scalars and arrays, ints, complex, mixed in ONE fusion
before = ncoll()
a = shared(np.zeros((2, 3))); mn = shared(100.0); mx = shared(-1.0); pr = shared(2.0); k = shared(0)
ai = shared(np.ones(4, dtype=np.int32)); c = shared(1 + 0j); amin = shared(np.full(3, 50.0))
a += np.arange(6.0).reshape(2, 3) * (r + 1)
mn.min_with(r * 10.0); mx.max_with(r * 10.0); pr *= (r + 2.0); k += r; k += 1
ai *= 2; c *= complex(0, 1); amin.min_with(np.array([r, 60.0, -r]))
x = mn + 5.0          # contribution: mn + 5P
y = mx - pr           # shared - shared: local
assert ncoll() == before
assert np.allclose(a.value, np.arange(6.0).reshape(2, 3) * sum(range(1, P + 1)))
assert ncoll() == before + 1
assert float(mn) == 0.0 and float(mx) == 10.0 * (P - 1)
assert float(pr) == 2.0 * np.prod([q + 2.0 for q in range(P)])
assert int(k) == sum(range(P)) + P
assert (ai.value == 2 ** P).all() and ai.value.dtype == np.int32
assert complex(c) == 1j ** P
assert np.array_equal(amin.value, np.array([0.0, 50.0, -(P - 1)]))
assert float(x) == 5.0 * P and float(y) == float(mx) - float(pr)
assert ncoll() == before + 1, "all of that must be one collective"
e = get_tracer().events()
assert e[e[:, 0] == K_FUSED][-1, -1] == 9, e[e[:, 0] == K_FUSED][-1]   # count = variables resolved
# snapshot semantics: later contributions do not change an earlier shared result
z = shared(1.0); w = z * 2.0; z += 1.0
assert float(w) == 2.0 and float(z) == 1.0 + P
# assigning a local value is an error; reading never happens silently
try:
    z.value = 3.0
except SharedVariableError:
    pass
else:
    raise AssertionError("local assignment accepted")
# flush / fused / threshold
q = shared(0.0)
before = ncoll()
with fused():
    for i in range(10):
        q += 1.0
assert ncoll() == before + 1 and float(q) == 10.0 * P
assert flush() == 0 and ncoll() == before + 1      # nothing pending: no collective
configure(threshold_bytes=8 * 40)
vs = [shared(0.0) for _ in range(100)]
before = ncoll()
for v in vs:
    v += 1.0
assert ncoll() - before >= 2, ncoll() - before       # the threshold forced early
assert all(float(v) == P for v in vs)
configure(threshold_bytes=1 << 20)
print("OK", r)
"""

BOUNDED = PRELUDE + """
# no scaling: total request fits
p = pool(100.0)
g = p.consume(1.0 + r)
assert g.pending
tot = sum(1.0 + q for q in range(P))
assert float(g) == 1.0 + r and float(p) == 100.0 - tot
# exact depletion with a floor, fused with other ops in ONE collective
before = ncoll()
p2 = pool(10.0); other = shared(0.0)
other += 1.0
g2 = p2.consume(10.0 * (r + 1), floor=4.0)
grants = np.zeros(P); grants[r] = float(g2)
assert ncoll() == before + 1
assert float(p2) == 4.0, float(p2)               # left at exactly the floor
scale = 6.0 / sum(10.0 * (q + 1) for q in range(P))
assert abs(float(g2) - 10.0 * (r + 1) * scale) < 1e-12
allg = np.empty(P); comm.Allreduce(grants, allg)
assert abs(allg.sum() - 6.0) < 1e-12               # exactly what was above the floor
# pool already below the floor: nothing granted
p3 = pool(1.0)
g3 = p3.consume(5.0, floor=2.0)
assert float(g3) == 0.0 and float(p3) == 1.0
# two consumes of one pool in one fusion apply in order; array pool elementwise
p4 = pool(np.array([10.0, 1.0]))
ga = p4.consume(np.array([1.0, 1.0]))
gb = p4.consume(np.array([1.0, 1.0]))
assert np.allclose(ga.value, [1.0, 1.0 / P if P > 1 else 1.0])
assert np.allclose(p4.value, [10.0 - 2 * P, 0.0])
assert np.allclose(gb.value, [1.0, 0.0])
# contributing a grant still pending reads it (a force point) and lands in the batch after it
p5 = pool(10.0); got = shared(0.0); arr = shared(np.zeros(2))
got *= 1.0                                          # pending in the batch the grant's read resolves
gc = p5.consume(1.0 + r)
got += gc
gd = p5.consume(1.0)
arr += gd
assert float(got) == tot, (float(got), tot)
assert np.array_equal(arr.value, [P, P]), arr.value
assert float(p5) == 10.0 - tot - P
print("OK", r)
"""

DIVERGE = PRELUDE + """
a = shared(0.0); b = shared(0.0)
if r == 0:
    a += 1.0; b += 2.0
else:
    b += 2.0; a += 1.0
try:
    float(a)
except SPMDDivergence as exc:
    msg = str(exc)
    assert "first difference at pending step" in msg and "#0" in msg, msg
    print("DIVERGED", r, msg)
else:
    raise AssertionError("no divergence detected")
try:
    float(b)          # values of a failed fusion are never used
except SPMDDivergence:
    print("AGAIN", r)
# different uniform operand
c = shared(2.0)
c += 1.0
d = c * (r + 1.0)
try:
    float(d)
except SPMDDivergence as exc:
    assert "uniform operand" in str(exc) and "write x *= a" in str(exc), str(exc)
    print("UNIFORM", r)
# a creation value that differs inside a run of creations (logged as bare values after the first)
first = shared(0.0)
run = [shared(1.0), shared(2.0), shared(3.0 + r)]
first += 1.0
try:
    float(first)
except SPMDDivergence as exc:
    msg = str(exc)
    assert f"shared variable #{run[2].id} created/reset with value" in msg, msg
    assert "value 3.0" in msg and "value 4.0" in msg, msg
    print("CREATED", r)
# a late rank is not a divergence: rank 0 arrives 1 s after the others, who meanwhile read
# its size board several times (it has not reached the collective: they keep waiting)
import pathlib, tempfile, time
configure(timeout=None)
flags = pathlib.Path(comm.bcast(tempfile.mkdtemp() if r == 0 else None))
late = [shared(0.0) for _ in range(40)]
for k, x in enumerate(late):
    x += float(k)
if r == 0:
    time.sleep(1.0)
assert [float(x) for x in late] == [float(k * P) for k in range(40)]
# ... and the others leave the force point while rank 0 makes no MPI call (their board
# reads of rank 0 may still be pending: they must not wait for them)
if r != 0:
    (flags / f"back{r}").touch()
else:
    deadline = time.monotonic() + 60
    while len(list(flags.glob("back*"))) < P - 1:
        assert time.monotonic() < deadline, "ranks stayed in the force point until rank 0 called MPI again"
        time.sleep(0.05)
# very different sizes: the ranks' collectives cannot match (different counts) and MPI
# completes them on no rank; without any timeout every rank still raises SPMDDivergence
# naming the first difference (size boards, then the diagnosis communicator)
e = shared(np.zeros(5000)) if r == 0 else shared(0.0)
e += 1.0
try:
    flush()
except SPMDDivergence as exc:
    msg = str(exc)
    assert "first difference at pending step 0" in msg and "shape (5000,)" in msg, msg
    assert "rank 1: shared variable #" in msg and "with value 0.0" in msg, msg
    assert "differed in size" in msg, msg
    dets = comm.allgather(exc.detail)      # COMM_WORLD is unaffected (the fuser has its own)
    assert len(set(dets)) == 1, dets       # the same text on every rank
    print("SIZES", r)
"""


HOT_PATH = PRELUDE + """
# float64 scalar fast paths: slot references, lazily filled intermediate results, persistent requests
# contributions with flushes in between and no read: resolved sums are folded in, nothing piles up
acc = shared(0.0)
for k in range(2000):
    acc += 1.0
    flush()
    assert len(acc._entries) <= 1, len(acc._entries)
assert float(acc) == 2000.0 * P
S = float(sum(range(P)))
s = shared(0.0); u = shared(10.0)
before = ncoll()
s += float(r)
w = s * s                  # lazy: refers to s's pending slot
s += 1.0                   # a later contribution must not change w (snapshot semantics)
t = w / 2.0                # uniform operand
t += 1.0                   # contribution to an intermediate result
v = (u - s * s / 4) / 3    # mixed shared/shared/uniform, lazy
assert ncoll() == before
assert type(t).__name__ == "_LazyF8" and isinstance(t, type(s)) and t.dtype == np.float64 and t.shape == ()
assert repr(t).startswith("SharedVar#") and t.pending
assert float(w) == S * S, (float(w), S)
assert ncoll() == before + 1, "one collective for everything pending"
assert float(s) == S + P and float(t) == S * S / 2 + P
assert abs(float(v) - (10.0 - (S + P) ** 2 / 4) / 3) < 1e-12
assert ncoll() == before + 1
# open slot accumulation, then a snapshot closes it, then a new slot in the same fusion
a = shared(0.0)
for k in range(5):
    a += 1.0
snap = a * 1.0
a += 2.0
assert float(snap) == 5.0 * P and float(a) == 7.0 * P
# assigning a pending value, then reading .value (the base is a snapshot)
y = shared(0.0); z = shared(0.0)
z += 1.0
y.assign(z)
assert y.value == float(P) and y.pending is False
# an intermediate result whose dtype an assignment changed keeps it
iv = shared(3)
q = s * 2.0
q.assign(iv)
assert q.dtype == np.int64 and int(q) == 3
# size classes: small, large (the fusion buffer grows, persistent requests are remade), small again
for nvars in (3, 600, 400, 3, 40):
    vs = [shared(0.0) for _ in range(nvars)]
    before = ncoll()
    for k, x in enumerate(vs):
        x += float(k * (r + 1))
    vals = [float(x) for x in vs]
    assert ncoll() == before + 1, (nvars, ncoll() - before)
    assert vals == [float(k * sum(q + 1 for q in range(P))) for k in range(nvars)], nvars
e = get_tracer().events()
assert e[e[:, 0] == K_FUSED][-1, -1] == 40          # count = variables resolved
# mixed ops on float64 scalars take the compiled-op path and still one collective
m1 = shared(0.0); m2 = shared(1e9); m3 = shared(1.0)
before = ncoll()
m1 += float(r); m2.min_with(float(r)); m3 *= 2.0
assert (float(m1), float(m2), float(m3)) == (S, 0.0, 2.0 ** P)
assert ncoll() == before + 1
# a resolved pending slot that nobody read stays valid across many later fusions (the
# compiled force point reuses a finished batch only once nothing refers to it)
k0 = shared(0.0)
k0 += float(r)
kept = k0 * 2.0            # refers to k0's slot in this fusion's batch
other = shared(0.0)
for k in range(30):
    other.reset()
    other += float(k)
    assert float(other) == k * P
assert float(kept) == 2.0 * S and float(k0) == S
# the compiled force point calls the MPI library directly unless NBMPI_DIRECT_MPI=0
assert fuser().direct_mpi == (_want == "compiled" and os.environ.get("NBMPI_DIRECT_MPI") != "0")
print("OK", r)
"""


@pytest.mark.parametrize("n,impl", IMPLS_MPI4PY)
def test_float64_hot_paths(run_mpi, n, impl):
    proc = run_mpi(HOT_PATH, n=n, timeout=90, env=impl_env(impl))
    assert_ok(proc)
    assert proc.stdout.count("OK") == n


@pytest.mark.parametrize("n,impl", IMPLS)
def test_all_ops_one_collective_per_force_point(run_mpi, n, impl):
    proc = run_mpi(ALL_OPS, n=n, timeout=90, env=impl_env(impl))
    assert_ok(proc)
    assert proc.stdout.count("OK") == n


@pytest.mark.parametrize("n,impl", IMPLS)
def test_bounded_consume(run_mpi, n, impl):
    proc = run_mpi(BOUNDED, n=n, timeout=90, env=impl_env(impl))
    assert_ok(proc)
    assert proc.stdout.count("OK") == n


GENUINE_TIMEOUT = PRELUDE + """
# a rank that never reaches the force point is a timeout, not a divergence: the diagnosis
# exchange finds nobody to compare with and the original CommTimeout is raised
import time
from nbmpi.workers import CommTimeout
configure(timeout=1)
x = shared(0.0)
x += 1.0
flush()                       # every rank: the fuser is connected
x += 1.0
if r == 0:
    try:
        flush()
    except CommTimeout as exc:
        assert "fused reduction #1" in str(exc), str(exc)
        print("TIMEOUT", r)
    try:
        x += 1.0
        flush()
    except Exception as exc:   # the fuser refuses further use after an abandoned collective
        assert "unusable" in str(exc), str(exc)
        print("UNUSABLE", r)
comm.Barrier()
"""


def test_absent_rank_is_a_timeout_not_a_divergence(run_mpi):
    proc = run_mpi(GENUINE_TIMEOUT, n=2, timeout=60)
    assert_ok(proc)
    assert proc.stdout.count("TIMEOUT") == 1 and proc.stdout.count("UNUSABLE") == 1, proc.stdout + proc.stderr


MPI_ERROR = PRELUDE + """
# a real MPI error in the force point's MPI_Start (compiled: called directly in C, else through
# mpi4py): the request of this size class is made active behind the fuser's back, so MPI
# refuses to start it again; the error reaches the caller on every rank as mpi4py's exception
from nbmpi.workers import NbmpiError
e = fuser()
x = shared(0.0)
for k in range(2):        # the first force point makes the persistent request, the second reuses it
    x += 1.0
    assert float(x) == (k + 1) * P
assert e.compiled_collectives == (1 if _want == "compiled" else 0), e.compiled_collectives
assert e.direct_mpi == (_want == "compiled" and os.environ.get("NBMPI_DIRECT_MPI") != "0")
req = e._preq[16]
req.Start()
x += 1.0
try:
    flush()
except MPI.Exception as exc:
    assert exc.Get_error_class() == MPI.ERR_REQUEST, exc
    assert f"rank {r}: in fused reduction #2" in "".join(getattr(exc, "__notes__", [])), exc
    print("MPIERROR", r)
else:
    raise AssertionError("MPI_Start of an active request did not fail")
req.Wait()                # every rank started it: it completes
try:
    float(x)              # the failed fusion's values are never used
except MPI.Exception:
    print("AGAIN", r)
x2 = shared(1.0)
x2 += 1.0
try:
    flush()
except NbmpiError as exc:
    assert "unusable" in str(exc), str(exc)
    print("UNUSABLE", r)
"""


@pytest.mark.parametrize("n,impl", IMPLS_MPI4PY)
def test_mpi_error_in_force_point(run_mpi, n, impl):
    proc = run_mpi(MPI_ERROR, n=n, timeout=90, env=impl_env(impl))
    assert_ok(proc)
    for word in ("MPIERROR", "AGAIN", "UNUSABLE"):
        assert proc.stdout.count(word) == n, (word, proc.stdout, proc.stderr)


@pytest.mark.parametrize("n,impl", IMPLS_MPI4PY)
def test_spmd_divergence_raises_on_every_rank(run_mpi, n, impl):
    proc = run_mpi(DIVERGE, n=n, timeout=90, env=impl_env(impl))
    assert_ok(proc)
    for word in ("DIVERGED", "AGAIN", "UNIFORM", "CREATED", "SIZES"):
        assert proc.stdout.count(word) == n, (word, proc.stdout, proc.stderr)


MIXED = """
import os, sys
import numpy as np
from mpi4py import MPI
from nbmpi.workers import shared, flush, SPMDDivergence
from nbmpi.workers import fused_reductions as fr
comm = MPI.COMM_WORLD
r, P = comm.Get_rank(), comm.Get_size()
assert fr.IMPLEMENTATION == ("python" if r == 0 else "compiled"), (r, fr.IMPLEMENTATION)
s1, s2, u = shared(0.0), shared(0.0), shared(2.5)
N = 7
for i in range(50):
    s1.reset(); s2.reset()
    s1 += float(r + i); s2 += 2.0; s2 -= float(i % 3)
    got = float((s2 - s1 * s1 / N) / (N - 1) + u * 3)
    S1 = sum(q + i for q in range(P)); S2 = P * (2.0 - i % 3)
    assert abs(got - ((S2 - S1 * S1 / N) / (N - 1) + 7.5)) < 1e-9, (i, got)
assert fr.fuser().collectives == 50, fr.fuser().collectives   # one per read (creation checks ride along)
# rank 1 really ran the compiled force point (only a new buffer size takes the Python path)
assert fr.fuser().compiled_collectives == (0 if r == 0 else 49), fr.fuser().compiled_collectives
# general fusions: the Python rank combines through mpi4py's Python callback, the compiled
# rank through the C operation; both read the same layout record
for i in range(5):
    a = shared(np.zeros(4)); m = shared(np.inf); q = shared(1.0)
    a += np.full(4, float(r + i)); m.min_with(float(r)); q *= 3.0
    assert np.array_equal(a.value, np.full(4, float(P * i + sum(range(P)))))
    assert float(m) == 0.0 and float(q) == 3.0 ** P
# a real difference is still found when the two implementations compute the signature
x = shared(1.0)
x += 1.0
y = x / (3.0 if r == 0 else 4.0)
try:
    float(y)
except SPMDDivergence as exc:
    assert "uniform operand" in str(exc), str(exc)
    print("DIVERGED", r)
print("OK", r)
"""


def test_python_and_compiled_ranks_agree_on_signatures(tmp_path):
    """The compiled force point hashes the pending sequence itself: the value must equal the
    Python reference's hash((sig, L, tuple(log))), checked by a job with one rank of each."""
    from nbmpi.workers.launch.launcher import find_mpiexec, rank_environment
    prog = tmp_path / "mixed.py"
    prog.write_text(MIXED)
    env = rank_environment({"NBMPI_TIMEOUT": "20"})
    cmd = [find_mpiexec(), "-n", "1", "env", "NBMPI_PURE_PYTHON=1", sys.executable, str(prog), ":",
           "-n", "1", "env", "NBMPI_PURE_PYTHON=0", sys.executable, str(prog)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("OK") == 2 and proc.stdout.count("DIVERGED") == 2, proc.stdout + proc.stderr


REBIND = PRELUDE + """
# code run by nbmpi run is rewritten: `x = local` on a shared x raises on every rank
x = shared(0.0)
x += float(r)
x = shared(1.0)                 # shared -> shared: allowed
y = x * 2.0                     # a shared result
for k in range(3):
    z = float(k)                # plain names are unaffected
def f():
    x = 5.0                     # a name this function never binds to a shared variable: untouched
    return x
assert f() == 5.0
def g(n, arg):
    s = shared(0.0)             # names a function binds to shared variables itself are guarded
    t, u = shared(1.0), pool(2.0)
    v = s * 2.0                 # ... also results of arithmetic on them
    for i in range(n):
        s += float(i)
    hits = []
    for k in range(4):
        try:
            if k == 0:
                s = float(s)
            elif k == 1:
                u = 2.0
            elif k == 2:
                v: float = 0.5
            else:
                t = np.ones(2)
        except SharedVariableError as exc:
            assert f"rank {r}: `" in str(exc), str(exc)
            hits.append(k)
    arg = 1.0                   # a shared argument used only by arithmetic, rebound: not caught (documented)
    s = shared(2.0)             # shared -> shared: allowed
    del t
    t = 5.0                     # released on purpose
    if n < 0:
        w = shared(0.0)
    w = 1.0                     # unbound before: allowed
    return hits, float(s), t, w
assert g(3, shared(0.0)) == ([0, 1, 2, 3], 2.0, 5.0, 1.0), g(3, shared(0.0))
def h(acc):
    acc.reset()                 # used as a shared variable: rebinding the argument is caught
    acc += 1.0
    try:
        acc = float(acc)
    except SharedVariableError:
        return "CAUGHT"
assert h(shared(0.0)) == "CAUGHT"
caught = []
for stmt in ("x = 3.0", "y = np.zeros(2)", "q = x = 1", "x, w = 1.0, 2.0", "x: float = 1.0"):
    try:
        if stmt == "x = 3.0":
            x = 3.0
        elif stmt == "y = np.zeros(2)":
            y = np.zeros(2)
        elif stmt == "q = x = 1":
            q = x = 1
        elif stmt == "x, w = 1.0, 2.0":
            x, w = 1.0, 2.0
        else:
            x: float = 1.0
    except SharedVariableError as exc:
        assert f"rank {r}: `" in str(exc) and "del " in str(exc), str(exc)
        caught.append(stmt)
assert caught == ["x = 3.0", "y = np.zeros(2)", "q = x = 1", "x, w = 1.0, 2.0", "x: float = 1.0"], caught
assert type(x).__name__ == "SharedVar" and type(y).__name__ == "_LazyF8"
a, b = x, 4.0                   # unpacking: each name checked against its own value
assert float(x) == 1.0 and float(y) == 2.0
del x
x = 3.0                         # the name was released
print("OK", r)
"""


def test_rebinding_a_shared_name_to_a_local_value_raises(run_mpi):
    proc = run_mpi(REBIND, n=2, timeout=60)
    assert_ok(proc)
    assert proc.stdout.count("OK") == 2
    # NBMPI_REBIND_GUARD=0: the program runs as written (the rebinding goes through)
    proc = run_mpi(PRELUDE + "x = shared(0.0)\nx = 3.0\nprint(f'UNGUARDED{x}\\n', end='', flush=True)",
                   n=2, timeout=60, env={"NBMPI_REBIND_GUARD": "0"})
    assert_ok(proc)
    assert proc.stdout.count("UNGUARDED3.0") == 2, proc.stdout


def test_signature_log_decoding():
    """The divergence diagnosis reads the log back: contribution keys (kmap, including
    negative hashes, even ones that look like a tag), float64 scalar keys, uniform
    operands logged as a tag followed by their value, and runs of creations."""
    from nbmpi.workers.fused_reductions import _decode_log, _F8_NUM
    neg, tag_like = -(2 ** 40) - 3, -25
    kmap = {neg: (5, 0, 12, (3,)), tag_like: (6, 1, 12, (2,))}
    log = [neg, (7 << 3) | 2, -16 - 3, 2.0, tag_like, -16 - 4, 7, (-8, 9, 1.5)]
    assert _decode_log(log, kmap) == [(5, 0, 12, (3,)), (7, 2, _F8_NUM, ()), (-7, 3, 2.0), (6, 1, 12, (2,)),
                                      (-7, 4, 7), (-8, 9, 1.5)]
    # creations of float64 scalars (_Batch.note_created): a key then the value, then only the
    # values of the next ids; a bare float that does not follow a creation is not one
    log = [(3 << 3) | 5, 0.0, 1.5, 2.5, (3 << 3) | 0, -16 - 3, 2.0, (9 << 3) | 5, float("inf")]
    assert _decode_log(log, {}) == [(-8, 3, 0.0), (-8, 4, 1.5), (-8, 5, 2.5), (3, 0, _F8_NUM, ()), (-7, 3, 2.0),
                                    (-8, 9, float("inf"))]


def test_benchmark_quick_writes_json(tmp_path):
    """The benchmark runs the compiled and the pure-Python implementation (each its own MPI
    job), counts both methods' collectives from the trace, and computes every target from
    the measured numbers it writes (never typed in)."""
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "fused_reductions.py"), "--quick",
                           "--out-dir", str(tmp_path)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((tmp_path / "fused_reductions_quick.json").read_text())
    c, p = data["compiled"], data["python"]
    assert data["nranks"] == 2 and c["implementation"] == "compiled" and p["implementation"] == "python"
    assert isinstance(c["direct_mpi"], bool) and p["direct_mpi"] is False and p["compiled_op"] is False
    for part in (c, p):
        assert len(part["variance"]) == 2
        for row in part["variance"]:
            assert {"original_s", "hand_s", "lazy_s", "lazy_first_s", "lazy_over_hand"} <= set(row)
            assert row["lazy_over_hand"] == row["lazy_s"] / row["hand_s"]
        s = part["scalars64"]
        assert s["separate_over_create"] == pytest.approx(s["separate_us"] / s["create_us"])
        assert s["create_over_lazy"] == pytest.approx(s["create_us"] / s["lazy_us"])
        pk = part["plankton"]
        # collectives counted from the trace: 27 separate Allreduce, 3 fused (one per read)
        assert pk["original_collectives_per_step"] == 27 and pk["lazy_collectives_per_step"] == 3
        assert part["loadavg_start"] is not None and part["loadavg_end"] is not None
    assert data["pure_python_over_compiled_64"] == pytest.approx(p["scalars64"]["lazy_us"] / c["scalars64"]["lazy_us"])
    assert len(data["targets"]) == 7
    measured = [c["scalars64"]["separate_over_lazy"], c["scalars64"]["separate_over_create"],
                c["scalars64"]["create_over_lazy"], data["pure_python_over_compiled_64"],
                c["variance"][-1]["lazy_over_hand"], c["plankton"]["lazy_collectives_per_step"],
                c["plankton"]["lazy_s_per_step"] / c["plankton"]["original_s_per_step"]]
    for t, m in zip(data["targets"], measured):
        assert t["measured"] == m, (t, m)
        ok = m >= t["limit"] if t["direction"] == ">=" else m <= t["limit"]
        assert t["status"] == ("PASS" if ok else "FAIL"), t
    assert len(data["plankton_model"]) == 4
    assert data["machine"]["commit"] != "" and "loadavg" in data["machine"]
    md = (tmp_path / "fused_reductions_quick.md").read_text()
    assert "## Targets" in md and "commit " in md and "a model, not a measurement" in md


def test_compiled_hot_path_is_built():
    """The install builds the Cython core (the benchmarked path); without a compiler the
    package falls back to the pure-Python implementation, which this test reports."""
    proc = subprocess.run([sys.executable, "-c", "from nbmpi.workers import fused_reductions as f; "
                           "print(f.IMPLEMENTATION)"], capture_output=True, text=True, timeout=60,
                          env={**__import__("os").environ, "NBMPI_PURE_PYTHON": "0"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "compiled", ("nbmpi.workers.fused_reductions._core was not built: install a C compiler "
                                               "and the Python headers, then reinstall nbmpi")


BOUND_CORE = """
import operator
from nbmpi.workers import fused_reductions as f
from nbmpi.workers.fused_reductions import _core, binding, fuser
from nbmpi.workers.fused_reductions.pending import _Batch, _Snap
from nbmpi.workers.fused_reductions.values import SharedVar, _LazyF8
b = _core.bindings()
assert b.bound and b.tuplehash in (True, False)
assert (b.shared_type, b.lazy_type, b.batch_type, b.snap_type) == (SharedVar, _LazyF8, _Batch, _Snap)
assert b.make_fuser is fuser and b.div is operator.truediv and len(b.ops) == 8
# no setters beside the typed interface: the fuser state is one FuserState
assert not any(hasattr(_core, n) for n in ("set_state", "set_engine", "set_runner", "set_batch", "current_batch"))
e = fuser()
assert _core.state.fuser is e and _core.state.batch is e.batch and isinstance(e.batch, _Batch)
try:
    b.spin = 1
except AttributeError:
    pass
else:
    raise AssertionError("Bindings attributes must be read-only")
try:
    _core.Bindings(**{**{n: getattr(b, n) for n in ("reset", "iadd", "isub", "imul", "min_with", "max_with",
                   "float_", "force", "eval_", "new_var", "make_fuser", "get_tracer", "same_signature", "add",
                   "sub", "mul", "div", "shared_type", "lazy_type", "batch_type", "snap_type", "grant_type",
                   "fast_types", "work", "casters", "f8", "nan_key", "nod", "nol", "empty", "log_cap",
                   "kind_fused", "spin")}, "ops": b.ops[:7]})
except TypeError as exc:
    assert "8 reference operators" in str(exc), exc
else:
    raise AssertionError("Bindings() accepted 7 operators")
binding.bind()                       # binding again: a new Bindings, the same types
assert _core.bindings() is not b and _core.bindings().batch_type is _Batch
x = f.shared(1.5); x += 2.0
assert type(x) is SharedVar and x.pending and repr(x)
print("BOUND")
"""


def test_compiled_core_is_bound_through_one_typed_interface():
    """The compiled core reads the Python reference only through its typed ``Bindings`` (read-only,
    checked when built) and shares the fuser's state through one ``FuserState``. No MPI."""
    proc = subprocess.run([sys.executable, "-c", BOUND_CORE], capture_output=True, text=True, timeout=60,
                          env={**__import__("os").environ, "NBMPI_PURE_PYTHON": "0"})
    assert proc.returncode == 0 and proc.stdout.strip() == "BOUND", proc.stdout + proc.stderr


GENERAL = PRELUDE + """
# the general force point (arrays, min/max/prod/consume, int64) in a loop: variables created in
# the loop as users write it; compiled: every fusion after the first of its size runs in C
e = fuser()
S = float(sum(range(P)))
p = pool(1e6)
for it in range(20):
    a = shared(np.zeros(5)); m = shared(np.inf); x = shared(-np.inf); pr = shared(1.0); k = shared(0)
    s = shared(0.0); iv = shared(np.zeros(3, dtype=np.int64))
    a += np.arange(5.0) * (r + 1)
    m.min_with(float(r + it)); x.max_with(float(r)); pr *= 2.0; k += r; s += 1.0
    iv += np.array([1, r, it])
    g = p.consume(1.0 + r, floor=0.0)
    assert np.array_equal(a.value, np.arange(5.0) * sum(q + 1 for q in range(P)))
    assert float(m) == float(it) and float(x) == float(P - 1) and float(pr) == 2.0 ** P
    assert int(k) == int(S) and float(s) == P and float(g) == 1.0 + r
    assert list(iv.value) == [P, int(S), it * P]
    nan = shared(0.0); nan.max_with(np.nan if r == 0 else 1.0)        # NaN wins, whichever rank has it
    assert np.isnan(float(nan))
assert abs(float(p) - (1e6 - 20 * sum(1.0 + q for q in range(P)))) < 1e-6
if _want == "compiled":
    assert e.compiled_op, "general fusions combine through the compiled MPI operation"
    assert e.compiled_collectives >= 35, e.compiled_collectives
else:
    assert e.compiled_collectives == 0 and not e.compiled_op
print("OK", r)
"""


@pytest.mark.parametrize("n,impl", IMPLS)
def test_general_force_point_in_a_loop(run_mpi, n, impl):
    proc = run_mpi(GENERAL, n=n, timeout=90, env=impl_env(impl))
    assert_ok(proc)
    assert proc.stdout.count("OK") == n


def test_combine_kernels_one_nan_rule_and_fused_layout():
    """One set of kernels: min/max propagate NaN in either operand order (channels and fused
    reductions); the fused kernel applies each word's op from the buffer's own layout record,
    as a Python call and as the C function MPI calls, and only sums the header when the two
    buffers' layouts differ (ranks that diverged)."""
    import ctypes

    import numpy as np

    from nbmpi.workers.core import kernels as K
    from nbmpi.workers.fused_reductions.wire import layout_words

    out = np.empty(3)
    for kern, a, b, want in ((K.combine_min, [1.0, np.nan, 3.0], [np.nan, 2.0, 1.0], [np.nan, np.nan, 1.0]),
                             (K.combine_max, [np.nan, 2.0, 1.0], [1.0, np.nan, 3.0], [np.nan, np.nan, 3.0])):
        kern(out, np.array(a), np.array(b))
        np.testing.assert_array_equal(out, want)

    def buf(f8, ops, arr, L=40):
        nlay = layout_words(len(f8), 0, 1)
        w = np.zeros(L, np.int64)
        wf = w.view(np.float64)
        w[4:9] = (nlay, L, len(f8), 0, 1)
        w[9:9 + (len(f8) + 7) // 8].view(np.int8)[:len(f8)] = ops
        d = 4 + nlay
        wf[d:d + len(f8)] = f8
        pos = d + len(f8)
        wf[pos:pos + len(arr)] = arr
        w[4 + nlay - 4:4 + nlay] = (pos, len(arr), 2, 0)
        wf[:4] = (1.0, 1.0, 1.0, 1.0)
        return w, d

    a, d = buf([1.0, np.nan, 5.0, 2.0], [0, 2, 3, 1], [4.0, 9.0])
    b, _ = buf([2.0, 1.0, np.nan, 3.0], [0, 2, 3, 1], [6.0, 1.0])
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(
        K.combine_words_mpi_address())
    for how in ("python", "mpi"):
        x, y = a.copy(), b.copy()
        if how == "python":
            K.combine_words(x, y)
        else:
            one = ctypes.c_int(1)
            fn(x.ctypes.data, y.ctypes.data, ctypes.addressof(one), None)
        yf = y.view(np.float64)
        np.testing.assert_array_equal(yf[:4], [2.0] * 4)
        np.testing.assert_array_equal(yf[d:d + 4], [3.0, np.nan, np.nan, 6.0])
        np.testing.assert_array_equal(yf[d + 4:d + 6], [4.0, 1.0])     # elementwise min segment
    other, _ = buf([1.0, 1.0, 1.0, 1.0], [0, 0, 0, 0], [0.0, 0.0])       # another layout (ops differ)
    y = b.copy()
    K.combine_words(other, y)
    assert list(y.view(np.float64)[:4]) == [2.0] * 4 and np.array_equal(y[4:], b[4:])
