"""The cyclic garbage collector is paused while a force point evaluates (``ArrayContext.flush``,
``NBMPI_DISTARRAY_GC_PAUSE``): run SPMD by tests/test_distarray_gc_pause.py under ``nbmpi run -n 1/2/3``.
A ``gc.callbacks`` hook counts the collections that start while a force point runs: none with the pause, some
without it (the same program, so the count can tell the two apart); the collector is enabled again after the
force point, left off when the program had turned it off, and every result equals NumPy's exactly. A force point
that made plan instances freezes what is alive (``NBMPI_DISTARRAY_GC_FREEZE``), one that made none does not, and a
plan evicted from the cache is freed by reference counting although frozen (no reference cycle outlives it); cyclic
garbage alive at a freezing force point is collected, not frozen for good.
Prints ``ok <section>`` per section on rank 0 and ``ALL OK`` at the end."""
import gc
import weakref

import numpy as np

import nbmpi.workers.distarray as dnp
from nbmpi.workers.distarray import context as context_module
from nbmpi.workers.distarray.context import context_for
from spmd_checks import checks, same, section, size

DISTS = ["block", "cyclic", ("block-cyclic", 2)]
ctx = context_for()
during = [0]


def on_gc(phase: str, info: dict) -> None:
    """Count the collections that start inside a force point."""
    if phase == "start" and ctx.in_flush:
        during[0] += 1


def program(dist, n=40, width=8):
    """Many small recorded operations (hundreds of units and closures in one force point); the DistArray and
    the NumPy result."""
    x = np.arange(n * width, dtype=float).reshape(n, width) * 0.25 - 3.0
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

    for dist in DISTS:
        for width in (5, 6):               # shapes not seen yet: new plans, their instances made by bound plans
            gc.unfreeze()
            made = context_module._instances[0]
            X, y = program(dist, 30, width)
            dnp.evaluate()
            assert context_module._instances[0] > made, f"no plan instance made ({dist}, {width})"
            assert gc.get_freeze_count() > 0, f"nothing frozen after a force point that made instances ({dist})"
            same(f"row updates, new plans {dist} {width}", X, y)
        gc.unfreeze()
        X, y = program(dist, 30, 6)          # the same shapes again: plans and instances reused, kernels cached
        dnp.evaluate()
        assert gc.get_freeze_count() == 0, f"a force point that made no instance froze ({dist})"
        same(f"row updates, cached plans {dist}", X, y)
    # evict every cached plan while frozen: each (and each plan an instance was made by) dies at once
    X, y = program("block", 30, 7)
    dnp.evaluate()
    assert gc.get_freeze_count() > 0
    refs = [weakref.ref(p) for p in ctx.plans.values()]
    refs += [weakref.ref(inst.plan) for p in ctx.plans.values() for inst in p.instances if inst.plan is not None]
    del X
    max_plans = context_module.MAX_PLANS
    gc.disable()
    try:
        context_module.MAX_PLANS = 1
        X, y = program("cyclic", 12, 3)      # new plans: every earlier one is evicted (and freed after the flush)
        dnp.evaluate()
        alive = [r() for r in refs if r() is not None and r() not in ctx.plans.values()]
        assert not alive, f"{len(alive)} evicted plans still alive while frozen: {[type(p).__name__ for p in alive][:4]}"
    finally:
        context_module.MAX_PLANS = max_plans
        gc.enable()
        gc.unfreeze()
    same("row updates after evicting every plan", X, y)
    section("a force point that made plan instances freezes them, evicted plans die though frozen")

    class Cycle:
        """An object in a reference cycle (only the cyclic collector frees it)."""

    for k, dist in enumerate(DISTS):
        gc.unfreeze()
        gc.collect()
        threshold = gc.get_threshold()
        gc.set_threshold(10 ** 9)            # no automatic collection from here to the force point
        try:
            c = Cycle()
            c.me = c
            c.arr = dnp.from_numpy(np.ones((9, 4)), dist=dist)
            ref = weakref.ref(c)
            del c                            # cyclic garbage when the force point freezes
            X, y = program(dist, 30, 11 + k)   # shapes not seen yet: new plan instances, a freeze
            dnp.evaluate()
            assert gc.get_freeze_count() > 0, f"nothing frozen after a force point that made instances ({dist})"
        finally:
            gc.set_threshold(*threshold)
        gc.collect()
        assert ref() is None, f"a reference cycle that was garbage at a freezing force point was frozen for good " \
                              f"(never collected) ({dist})"
        same(f"row updates, garbage before a freeze {dist}", X, y)
        gc.unfreeze()
    section("garbage alive when a force point freezes is collected, not frozen for good")

    # objects alive at freezing force points that become cyclic garbage later: not all kept for good
    refresh = getattr(context_module, "FREEZE_REFRESH", None)
    context_module.FREEZE_REFRESH = 4
    try:
        gc.unfreeze()
        gc.collect()
        refs = []
        for width in range(15, 24):          # 9 force points, each with new shapes: each freezes
            c = Cycle()
            c.me = c
            c.arr = dnp.from_numpy(np.ones((9, 4)), dist="block")
            refs.append(weakref.ref(c))
            X, y = program("block", 12, width)
            dnp.evaluate()                   # c is alive: frozen
            del c                            # cyclic garbage from now on
            same(f"row updates, a cycle alive at the force point {width}", X, y)
        gc.collect()
        alive = sum(r() is not None for r in refs)
        assert alive < len(refs), f"all {alive} object cycles alive at a freezing force point and dropped after it " \
                                  "are kept for good"
    finally:
        if refresh is None:
            del context_module.FREEZE_REFRESH
        else:
            context_module.FREEZE_REFRESH = refresh
        gc.unfreeze()
    section("objects frozen alive and dropped later are collected at the next refresh of the frozen set")
finally:
    gc.callbacks.remove(on_gc)
print(f"ALL OK ({checks[0]} checks on {size} ranks)", flush=True) if ctx.rank == 0 else None
