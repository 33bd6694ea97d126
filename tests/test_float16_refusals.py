"""float16 distributed arrays, under real mpiexec on 2 and 3 ranks (3 ranks: a rank holds none of the rows an
assignment writes):

* operations whose compiled kernels would need float16 (copies, casts, ``where``, assignments, transposes,
  redistribution, index arrays, row swaps) raise UnsupportedOperation, naming float16 and what to use instead,
  on every rank at the same operation, before anything is recorded. Before, the kernel was compiled only on the
  ranks holding elements: ``a[0:2] = 7`` raised NotImplementedError on rank 0 alone.
  The others waited (a hang until ``NBMPI_TIMEOUT``), and a caught error left the next force point to an MPI
  abort;
* after such an error the program goes on: later float16 and float32 operations give NumPy's results and the
  run ends with exit 0;
* what works gives NumPy's result and dtype: arithmetic (also with a float32 operand), in-place ``+=`` of a whole
  array, ufuncs, reductions, masks, sort, ``matmul``, ``reshape``, ``concatenate``, ``zeros_like``.
"""
from __future__ import annotations

import pytest

from conftest import run_code_all_ok

SCRIPT = """
import warnings
import numpy as np
import nbmpi.workers.distarray as dnp
from nbmpi.workers import world
from nbmpi.workers.distarray.errors import UnsupportedOperation
from spmd_checks import same_typed

warnings.simplefilter("ignore")
comm = world()
r = comm.Get_rank()
F = np.float16
checked = [0]


def same(got, want, what):
    same_typed(what, got, want)      # dtype, shape and values exactly
    checked[0] += 1


def refused(what, fn):
    try:
        got = fn()
        np.asarray(got)      # forced: on the old code the error came at the force point, on some ranks only
    except UnsupportedOperation as e:
        text = str(e)
        assert "float16" in text and "float32" in text, (what, text)
        outcome = "refused"
    else:
        outcome = "ran"
    every = comm.allgather(outcome)      # the same on every rank (no rank left waiting)
    assert every == ["refused"] * comm.Get_size(), (what, every)
    checked[0] += 1


x = np.arange(7, dtype=F)
def assigned(a, key, value):
    a[key] = value
    return a


refused("a[0:2] = 7 (rows of rank 0 only)", lambda: assigned(dnp.arange(7, dtype=F), slice(0, 2), 7))
refused("a[...] = 7", lambda: assigned(dnp.arange(7, dtype=F), Ellipsis, 7))
refused("copy", lambda: dnp.arange(7, dtype=F).copy())
refused("astype(float32)", lambda: dnp.arange(7, dtype=F).astype(np.float32))
refused("astype(float16)", lambda: dnp.arange(7.0).astype(F))
refused("where", lambda: dnp.where(dnp.arange(7, dtype=F) > 2, dnp.arange(7, dtype=F), 0))
refused("a.T", lambda: dnp.ones((5, 3), dtype=F).T)
refused("a[::2] + 1", lambda: dnp.arange(7, dtype=F)[::2] + 1)
refused("a[1:] + a[:-1]", lambda: dnp.arange(7, dtype=F)[1:] + dnp.arange(7, dtype=F)[:-1])
refused("a[index array]", lambda: dnp.arange(7, dtype=F)[dnp.asarray([6, 0, 3])])
M = dnp.arange(15, dtype=F).reshape(5, 3)
refused("row swap", lambda: assigned(M, [0, 4], M[[4, 0]]))
refused("a[1:] += 1 (a view)", lambda: dnp.arange(7, dtype=F)[1:].__iadd__(1))

# the program goes on after the errors, float16 and float32 alike
a = dnp.arange(7, dtype=F)
same(a + 1, x + 1, "a + 1")
same(a * a, x * x, "a * a")
same(a + dnp.ones(7, dtype=np.float32), x + np.ones(7, dtype=np.float32), "float16 + float32")
same(dnp.sin(a), np.sin(x), "sin")
b = dnp.arange(7, dtype=F)
b += 1
same(b, x + 1, "a += 1 (a whole array)")
same(a > 3, x > 3, "a > 3")
same(a[a > 3], x[x > 3], "a[a > 3]")
same(dnp.sort(dnp.asarray(x[::-1])), np.sort(x[::-1]), "sort")
same(a.sum(), x.sum(), "sum")
same(dnp.ones((5, 3), dtype=F) @ dnp.ones(3, dtype=F), np.ones((5, 3), dtype=F) @ np.ones(3, dtype=F), "matmul")
same(dnp.arange(12, dtype=F).reshape(3, 4), np.arange(12, dtype=F).reshape(3, 4), "reshape")
same(dnp.concatenate([a, a]), np.concatenate([x, x]), "concatenate")
same(dnp.zeros_like(a), np.zeros_like(x), "zeros_like")
c = dnp.arange(7.0)
c[1:3] = 5
y = np.arange(7.0)
y[1:3] = 5
same(c, y, "float64 assignment after the refusals")
print(f"rank {r}: ALL OK ({checked[0]} checks)", flush=True)
"""


@pytest.mark.parametrize("n", [2, 3])
def test_float16_refusals_are_the_same_on_every_rank(run_mpi, kernel_cache, n):
    run_code_all_ok(run_mpi, kernel_cache, SCRIPT, n, timeout=150)
