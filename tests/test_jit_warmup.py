"""Numba's one-time start in a background thread (``nbmpi.workers.core.jit_warmup``), started by importing
``nbmpi.workers.distarray``: it ends without error, kernels compiled and loaded afterwards give NumPy's results,
a fork while it may still run leaves a child that can compile, and ``NBMPI_JIT_WARMUP=0`` turns it off.
Real processes (single-rank MPI, a new kernel cache directory each), no mocks."""
from __future__ import annotations

import os
import subprocess
import sys

from test_kernel_cache_reuse import finish

PROGRAM = """
import json, os, sys
import numpy
import nbmpi.workers.distarray as np
from nbmpi.workers.core import jit_warmup
out = dict(started=jit_warmup.state()["started"])
if sys.argv[1] == "fork":
    pid = os.fork()             # right after the import: the warm-up thread may hold numba's compiler lock
    if pid == 0:
        import numba
        code = 1
        try:
            code = 0 if numba.njit(lambda a: a * 2 + 1)(20) == 41 else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    out["child_exit"] = os.waitstatus_to_exitcode(status)
out["ended"] = jit_warmup.wait(240)
out["state"] = jit_warmup.state()
x = np.linspace(0.0, 2.0, 50_000)
y = np.sqrt(x) * 3.0 + x * x / 7.0   # correctly rounded operations: bit-for-bit NumPy
xn = numpy.linspace(0.0, 2.0, 50_000)
out["equal"] = bool(numpy.array_equal(numpy.asarray(y), numpy.sqrt(xn) * 3.0 + xn * xn / 7.0))
out["stats"] = np.kernel_stats()
print(json.dumps(out))
"""


def _run(tmp_path, mode: str, **env) -> dict:
    full_env = {**os.environ, "NBMPI_DISTARRAY_CACHE": str(tmp_path / "kernels"), **env}
    return finish(subprocess.Popen([sys.executable, "-c", PROGRAM, mode], env=full_env, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True))


def test_warmup_ends_without_error_and_kernels_equal_numpy(tmp_path):
    r = _run(tmp_path, "plain")
    assert r["started"] is True and r["ended"] is True, r
    st = r["state"]
    assert st["done"] is True and st["error"] is None and isinstance(st["seconds"], float), st
    assert r["equal"] is True, r
    assert r["stats"]["compiled"] >= 1, r["stats"]      # a new cache directory: the kernel was compiled
    again = _run(tmp_path, "plain")                      # a new process reusing the cache loads it
    assert again["equal"] is True and again["state"]["error"] is None, again
    assert again["stats"]["compiled"] == 0 and again["stats"]["loaded"] >= 1, again["stats"]


def test_fork_right_after_import_leaves_a_child_that_compiles(tmp_path):
    r = _run(tmp_path, "fork")
    assert r["child_exit"] == 0, r
    assert r["state"]["done"] is True and r["state"]["error"] is None, r
    assert r["equal"] is True, r


def test_off_by_environment(tmp_path):
    r = _run(tmp_path, "plain", NBMPI_JIT_WARMUP="0")
    assert r["started"] is False and r["ended"] is True, r
    assert r["state"]["done"] is False, r
    assert r["equal"] is True, r
