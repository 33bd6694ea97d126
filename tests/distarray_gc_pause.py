"""The cyclic garbage collector is paused while a force point evaluates (``ArrayContext.flush``,
``NBMPI_DISTARRAY_GC_PAUSE``): run SPMD by tests/test_distarray_gc_pause.py under ``nbmpi run -n 1/2/3``.
A ``gc.callbacks`` hook counts the collections that start while a force point runs: none with the pause, some
without it (the same program, so the count can tell the two apart); the collector is enabled again after the
force point, left off when the program had turned it off, and every result equals NumPy's exactly.
Prints ``ok <section>`` per section on rank 0 and ``ALL OK`` at the end."""
import gc

import numpy as np

import nbmpi.workers.distarray as dnp
from nbmpi.workers.distarray.context import context_for
from spmd_checks import checks, same, section, size

DISTS = ["block", "cyclic", ("block-cyclic", 2)]
ctx = context_for()
during = [0]


def on_gc(phase: str, info: dict) -> None:
    """Count the collections that start inside a force point."""
    if phase == "start" and ctx.in_flush:
        during[0] += 1


def program(dist):
    """Many small recorded operations (hundreds of units and closures in one force point); the DistArray and
    the NumPy result."""
    n = 40
    x = np.arange(n * 8, dtype=float).reshape(n, 8) * 0.25 - 3.0
    X, y = dnp.from_numpy(x, dist=dist), x.copy()
    for k in range(n - 1):                 # a row update per step: each a few groups of the force point
        X[k + 1:, :] = X[k + 1:, :] - X[k, :] * 0.01
        y[k + 1:, :] = y[k + 1:, :] - y[k, :] * 0.01
    return X, y


gc.callbacks.append(on_gc)
try:
    for dist in DISTS:
        for pause in (True, False):
            ctx.gc_pause = pause
            X, y = program(dist)
            gc.collect()
            during[0] = 0
            threshold = gc.get_threshold()
            gc.set_threshold(50)              # a young collection every 50 net allocations: many in a force point
            try:
                dnp.evaluate()
            finally:
                gc.set_threshold(*threshold)
            assert gc.isenabled(), f"the collector is off after a force point ({dist}, pause={pause})"
            if pause:
                assert during[0] == 0, f"{during[0]} collections during a paused force point ({dist})"
            else:
                assert during[0] > 0, f"no collection during a force point without the pause ({dist}): the test " \
                                      "cannot tell the two apart"
            same(f"row updates {dist} pause={pause}", X, y)
    section("no collection during a force point, the collector enabled after it")

    ctx.gc_pause = True
    for dist in DISTS:
        X, y = program(dist)
        gc.disable()
        try:
            dnp.evaluate()
            assert not gc.isenabled(), f"a force point turned on the collector the program had turned off ({dist})"
        finally:
            gc.enable()
        same(f"row updates, collector off {dist}", X, y)
    section("a collector turned off by the program stays off")
finally:
    gc.callbacks.remove(on_gc)
print(f"ALL OK ({checks[0]} checks on {size} ranks)", flush=True) if ctx.rank == 0 else None
