"""No submodule of ``nbmpi.workers.distarray`` shadows a NumPy name of the ``dnp`` namespace.

Importing a submodule binds its name on its package, so a submodule named like a NumPy function (say
``piecewise.py``) turns ``dnp.<name>`` from the NumPy fallback into a module as soon as anything imports it
(``fusion`` at the first fused force point): ``dnp.piecewise(...)`` then raised ``'module' object is not
callable``. The only such names are the ones the package binds on purpose, checked to be the intended objects.
"""
from __future__ import annotations

import importlib
import pkgutil
import types

import numpy as np
import pytest

from conftest import assert_ok

#: submodules named like NumPy names on purpose: ``dnp.linalg`` and ``dnp.random`` are our modules standing for
#: NumPy's; ``array`` is imported before ``__init__`` rebinds ``dnp.array`` to the constructor.
DELIBERATE = {"array", "linalg", "random"}


def _import_all() -> list:
    """Import every submodule of the package, recursively; their full names."""
    import nbmpi.workers.distarray as dnp

    names = []
    for info in pkgutil.walk_packages(dnp.__path__, dnp.__name__ + "."):
        importlib.import_module(info.name)
        names.append(info.name)
    return names


def _numpy_names() -> set:
    return {n for n in dir(np) if not n.startswith("_")}


def test_no_submodule_takes_a_numpy_name():
    """A submodule directly in the package (the ones that bind on ``dnp``) has no public NumPy name but the
    deliberate ones; nested ones (``operations.linalg``) bind on their own package, not on ``dnp``."""
    import nbmpi.workers.distarray as dnp

    names = _import_all()
    assert "nbmpi.workers.distarray.fusion" in names and len(names) > 30, names
    direct = {n.rsplit(".", 1)[1] for n in names if n.rsplit(".", 1)[0] == dnp.__name__}
    clashes = sorted((direct & _numpy_names()) - DELIBERATE)
    assert not clashes, f"submodules named like NumPy names shadow dnp's: {clashes} (rename them)"


def test_numpy_names_of_dnp_are_the_intended_objects():
    """After every submodule is imported: ``dnp.linalg``/``dnp.random`` are our modules, ``dnp.array`` is the
    constructor, and no other public NumPy name of ``dnp`` is one of our modules; a callable NumPy name is
    callable on ``dnp`` too (native or the fallback)."""
    import nbmpi.workers.distarray as dnp
    from nbmpi.workers.distarray import creation

    _import_all()
    assert dnp.linalg is importlib.import_module("nbmpi.workers.distarray.linalg") and callable(dnp.linalg.norm)
    assert dnp.random is importlib.import_module("nbmpi.workers.distarray.random") and callable(dnp.random.default_rng)
    assert dnp.array is creation.array and not isinstance(dnp.array, types.ModuleType)
    ours, not_callable = [], []
    before = set(vars(dnp))
    try:
        for name in sorted(_numpy_names()):
            obj = getattr(dnp, name, None)
            if isinstance(obj, types.ModuleType) and obj.__name__.startswith(dnp.__name__ + "."):
                ours.append(name)
            theirs = getattr(np, name)
            if callable(theirs) and not isinstance(theirs, types.ModuleType) and not callable(obj):
                not_callable.append(name)
    finally:
        for name in set(vars(dnp)) - before:      # the fallback wrappers dnp's __getattr__ cached
            delattr(dnp, name)
    assert sorted(ours) == ["linalg", "random"], ours
    assert not not_callable, f"NumPy functions not callable on dnp: {not_callable}"


@pytest.mark.parametrize("n", [2])
def test_piecewise_after_a_fused_force_point(run_mpi, kernel_cache, n):
    """The reported program: ``dnp.piecewise`` after an evaluation that ran the fusion pass is NumPy's (through
    the fallback), on every rank."""
    p = run_mpi("""
import numpy
import nbmpi.workers.distarray as dnp
from nbmpi.workers import world

a = dnp.arange(7.)
assert numpy.array_equal(numpy.asarray(a * 2 + 1), numpy.arange(7.) * 2 + 1)
got = numpy.asarray(dnp.piecewise(a, [a < 3], [-1, 1]))
x = numpy.arange(7.)
want = numpy.piecewise(x, [x < 3], [-1, 1])
assert got.dtype == want.dtype and numpy.array_equal(got, want), (got, want)
print(f"rank {world().Get_rank()}: piecewise OK", flush=True)
""", n=n, timeout=120, env={"NBMPI_DISTARRAY_CACHE": kernel_cache})
    assert_ok(p)
    for r in range(n):
        assert f"rank {r}: piecewise OK" in p.stdout, p.stdout
