"""SPMD program for tests/test_distarray_fresh_buffers.py (1, 2 or 3 ranks): the fresh memory a program's
arrays take. Checked on every rank, each result against NumPy bit for bit:

* ``to_numpy`` (every rank and one root) of whole block arrays, of views and of cyclic / block-cyclic arrays;
  a whole block array builds no plan and takes no pooled buffer (it gathers from the local blocks straight
  into the result);
* ``mgrid`` and ``empty``: run again, an mgrid program takes every buffer from the pool (no fresh one), and
  ``concatenate``'s ``empty`` result takes its buffer only when written;
* ``ravel``/``reshape`` of a whole block array shares the source's buffer (no fresh one) and stays a copy for
  NumPy semantics: writes recorded on either array, ``.local`` writes, the source dying first;
* a dead array's buffer serves a later array of another shape needing at least half its bytes, two live arrays
  never share one, and the whole buffer comes back to the pool.

Prints ``rank R: NAME ok`` per check, then ``rank R: ALL OK``; a failing check raises.
"""
import os
import tracemalloc

import numpy as np

import nbmpi.workers.distarray as dnp
from nbmpi.workers import world
from spmd_checks import check

comm = world()
rank, P = comm.Get_rank(), comm.Get_size()
ctx = dnp.context_for()
R = 6 * P + 1 if P > 1 else 7          # uneven blocks on 2 and 3 ranks (rows 7 / 13 / 19)
C = 3000                               # 24 KB rows: several rows are above the pool's 64 KiB minimum


def fresh():
    return dnp.stats()["buffers_allocated"]


a0 = np.arange(R * C, dtype=np.float64).reshape(R, C) * 0.5
for dist in ["block", "cyclic", ("block-cyclic", 2)]:
    a = dnp.from_numpy(a0, dist=dist) * 1.5
    for root in (None, P - 1):
        got = a.to_numpy(root=root)
        check(f"to_numpy {dist} root={root}", (got is None) == (root is not None and rank != root)
              and (got is None or np.array_equal(got, a0 * 1.5)))
    check(f"to_numpy view {dist}", np.array_equal(a[1::2, 5:9].to_numpy(), (a0 * 1.5)[1::2, 5:9]))

a = dnp.from_numpy(a0) + 1.0
a.evaluate()
nplans, f0 = len(ctx.plans), fresh()
got = a.to_numpy()
check("to_numpy block: no plan, no pooled buffer", len(ctx.plans) == nplans and fresh() == f0
      and np.array_equal(got, a0 + 1.0) and got.flags.c_contiguous and got.flags.writeable)


G = 6 * P                              # grid rows: the 1-D blocks of its ravel split at row ends


def grid_program():
    y, x = dnp.mgrid[-1:1:G * 1j, -1:1:C * 1j]
    ph = dnp.where(x ** 2 + y ** 2 < 0.8, 0.2, 0.0)
    return dnp.concatenate([ph.sum(axis=1), ph.ravel()]).to_numpy()


y, x = np.mgrid[-1:1:G * 1j, -1:1:C * 1j]
ph = np.where(x ** 2 + y ** 2 < 0.8, 0.2, 0.0)
want = np.concatenate([ph.sum(axis=1), ph.ravel()])
check("grid program first", np.array_equal(grid_program(), want))
f0 = fresh()
tracemalloc.start()
before = tracemalloc.get_traced_memory()[0]
again = grid_program()
grew = tracemalloc.get_traced_memory()[1] - before
tracemalloc.stop()
block = 6 * C * 8
print(f"rank {rank}: grid program again grew {grew} bytes, result {want.nbytes}, block {block}", flush=True)
# NumPy data is traced: the new memory is the gathered result (NumPy makes it too) and small objects only
check("grid program again: no fresh buffer", np.array_equal(again, want) and fresh() == f0
      and grew < want.nbytes + block // 2)

e = dnp.empty((R, C))
check("empty takes no buffer before it is written", e._base.local is None)
e[:] = 2.0
check("empty written", np.array_equal(e.to_numpy(), np.full((R, C), 2.0)))

# ravel / reshape: shared while only read (the 1-D blocks split at row ends: E rows divide evenly over P ranks)
E = 4 * P
b0 = np.arange(E * C, dtype=np.float64).reshape(E, C)
a = dnp.from_numpy(b0)
a.evaluate()
f0 = fresh()
f = a.ravel()
check("ravel shares the buffer", f._base.owner is a._base and fresh() == f0
      and np.shares_memory(f._base.local, a._base.local))
a[1:3] = -1.0
a += 2.0
w = b0.copy()
w[1:3] = -1.0
w += 2.0
check("ravel then source written", np.array_equal(f.to_numpy(), b0.ravel()) and np.array_equal(a.to_numpy(), w))
a = dnp.from_numpy(b0)
f = a.reshape(E * C)
f[3:7] = 9.0
wf = b0.ravel().copy()
wf[3:7] = 9.0
check("reshape then result written", np.array_equal(f.to_numpy(), wf) and np.array_equal(a.to_numpy(), b0))
a = dnp.from_numpy(b0)
f = a.ravel()
f.local[:] = 0.0
check("ravel then result's .local written", np.array_equal(a.to_numpy(), b0) and not f.to_numpy().any())
a = dnp.from_numpy(b0)
f = a.ravel()
a.local[:] = 0.0
check("ravel then source's .local written", np.array_equal(f.to_numpy(), b0.ravel()) and not a.to_numpy().any())
a = dnp.from_numpy(b0) * 2.0
f = a.reshape(E * C)
del a
g = dnp.zeros((E, C)) + 1.0
check("source dies first", np.array_equal(f.to_numpy(), (b0 * 2.0).ravel())
      and np.array_equal(g.to_numpy(), np.ones_like(b0)))
a = dnp.from_numpy(b0)
f = a.ravel()
s = f * 3.0
a[:] = 0.0
t = f + 1.0
check("reads recorded before and after a write", np.array_equal(s.to_numpy(), b0.ravel() * 3)
      and np.array_equal(t.to_numpy(), b0.ravel() + 1) and not a.to_numpy().any())
# a boolean-mask assignment writes the local buffer directly (masking.put): it too ends the sharing
a = dnp.from_numpy(b0)
f = a.reshape(E * C // 2, 2)
m = dnp.from_numpy(np.arange(E * C // 2) % 3 == 1)
f[m] = -1.0
wf = b0.reshape(E * C // 2, 2).copy()
wf[np.arange(E * C // 2) % 3 == 1] = -1.0
check("reshape then result mask-written", np.array_equal(f.to_numpy(), wf) and np.array_equal(a.to_numpy(), b0))
a = dnp.from_numpy(b0)
f = a.ravel()
a[dnp.from_numpy(np.arange(E) % 2 == 0)] = 5.0
w = b0.copy()
w[np.arange(E) % 2 == 0] = 5.0
check("ravel then source mask-written", np.array_equal(f.to_numpy(), b0.ravel()) and np.array_equal(a.to_numpy(), w))
del a, f, s, t, g, m


# a dead array's buffer serves a later array of another shape needing at least half its bytes (a prefix of
# its memory); while both live, two arrays never share memory; given back, the whole buffer returns to the pool
ctx.buffers.clear()
big = dnp.zeros((R, C)) + 1.0
big.evaluate()
whole = big._base.local.nbytes
f0 = fresh()
del big
small = dnp.zeros((R, C * 2 // 3)) + 2.0
small.evaluate()
check("another shape reuses a dead array's buffer", fresh() == f0 and whole >= 1 << 16
      and np.array_equal(small.to_numpy(), np.full((R, C * 2 // 3), 2.0)))
other = dnp.zeros((R, C * 2 // 3)) + 3.0
other.evaluate()
check("two live arrays never share a pooled buffer",
      not np.shares_memory(small._base.local, other._base.local)
      and np.array_equal(small.to_numpy(), np.full((R, C * 2 // 3), 2.0))
      and np.array_equal(other.to_numpy(), np.full((R, C * 2 // 3), 3.0)))
del small, other
check("a lent prefix comes back as its whole buffer",
      max(b.nbytes for b in ctx.buffers.free.values()) == whole and not ctx.buffers._lent)
kept = len(ctx.buffers.free)
tiny = dnp.zeros((R, C // 3 - 8)) + 4.0       # under half the bytes: a buffer of its own
tiny.evaluate()
check("a much smaller array takes no kept buffer", np.array_equal(tiny.to_numpy(), np.full((R, C // 3 - 8), 4.0))
      and len(ctx.buffers.free) == kept and not ctx.buffers._lent)
del tiny


# zeros/ones are recorded assignments: a loop making a new zeros(n) each step (wave_equation's pattern) takes the
# buffers of arrays dead two steps before, inside its one force point, instead of one fresh buffer per step;
# reused buffers hold old values, so the ends (never written after zeros) check the fill
ctx.buffers.clear()
n1 = P * 3 * 8192 + 5                  # 192 KiB per rank, uneven
u, up = dnp.zeros(n1) + 1.0, dnp.ones(n1) * 0.5
w, wp = np.zeros(n1) + 1.0, np.ones(n1) * 0.5
f0 = fresh()
for _ in range(40):
    un = dnp.zeros(n1)
    un[1:-1] = 2 * u[1:-1] - up[1:-1] + 0.25 * (u[2:] - 2 * u[1:-1] + u[:-2])
    up, u = u, un
    wn = np.zeros(n1)
    wn[1:-1] = 2 * w[1:-1] - wp[1:-1] + 0.25 * (w[2:] - 2 * w[1:-1] + w[:-2])
    wp, w = w, wn
u.evaluate()
check("zeros each step reuses dead steps' buffers", fresh() - f0 <= 12 and np.array_equal(u.to_numpy(), w)
      and np.array_equal(up.to_numpy(), wp))
check("ones and zeros of other dtypes", np.array_equal(dnp.ones((R, 3), dtype=bool).to_numpy(), np.ones((R, 3), bool))
      and np.array_equal(dnp.zeros(R, dtype=np.int32).to_numpy(), np.zeros(R, np.int32))
      and dnp.zeros(R, dtype=np.int32).dtype == np.int32 and float(dnp.zeros(()).to_numpy()) == 0.0)
del u, up, un


def vm_flags(arr):
    """The VmFlags of the mapping holding ``arr``'s first byte (Linux), or None."""
    addr = arr.__array_interface__["data"][0]
    try:
        lines = open("/proc/self/smaps").read().splitlines()
    except OSError:
        return None
    inside = False
    for line in lines:
        head = line.split()[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= addr < hi
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    return None


want_flag = {"0": "nh", "1": "hg"}.get(os.environ.get("NBMPI_DISTARRAY_HUGEPAGE", "0"))
ctx.buffers.clear()
h = dnp.zeros((P * 2 * 1024, 2048)) + 1.0       # 32 MiB per rank: a mapping of its own
h.evaluate()
flags = vm_flags(h._base.local)
check(f"pool buffer advice {want_flag}", want_flag is None or not os.path.exists("/proc/self/smaps")
      or (flags is not None and want_flag in flags))
check("no sharing left", ctx.shared == 0)
print(f"rank {rank}: ALL OK", flush=True)
