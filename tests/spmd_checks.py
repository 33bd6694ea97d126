"""What the SPMD case programs under tests/ (``distarray_cases.py``, ``distarray_errors.py``,
``redistribute_cases.py``, ...) share: a section's ``ok`` line, the check that an error is raised on this rank, and
the exact comparison of a distributed result with NumPy's (:func:`same`, counted in :data:`checks`), a
check printing ``rank R: NAME ok`` (:func:`check`, :func:`same_typed`: dtypes too).
They run under ``nbmpi run`` (every rank), which finds this module through the ``PYTHONPATH`` that
``conftest.nbmpi_run`` gives its programs."""
from __future__ import annotations

import sys
from typing import Any, Callable, List, Sequence, Type

import numpy as np

from nbmpi.workers import world

comm = world()
rank, size = comm.Get_rank(), comm.Get_size()


def section(name: str) -> None:
    """Collective over the world: rank 0 prints ``ok NAME`` once every rank has finished the section; no rank
    goes on (and prints) before that line is written."""
    comm.Barrier()
    if rank == 0:   # one write: lines of ranks on other nodes arrive through mpiexec at any moment
        sys.stdout.write(f"ok {name}\n")
        sys.stdout.flush()
    comm.Barrier()


def expect(name: str, exc: Type[BaseException], fn: Callable[[], object], contains: Sequence[str] = ()) -> None:
    """Call ``fn()`` on this rank: it must raise ``exc`` whose message holds every string of ``contains``; prints
    ``rank R raised NAME: TYPE: MESSAGE`` (the message cut at 300 characters). Raises AssertionError if it
    returns or a piece is missing; any other exception propagates. Local (``fn`` may be collective)."""
    try:
        fn()
    except exc as e:
        msg = str(e)
        for c in contains:
            assert c in msg, f"{name}: {c!r} not in the message {msg!r}"
        print(f"rank {rank} raised {name}: {type(e).__name__}: {msg[:300]}", flush=True)
        return
    raise AssertionError(f"{name}: no {exc.__name__} raised on rank {rank}")


def check(name: str, cond: bool) -> None:
    """``cond`` must hold: prints ``rank R: NAME ok``, else raises AssertionError naming the rank and ``name``.
    Local."""
    if not cond:
        raise AssertionError(f"rank {rank}: {name} failed")
    print(f"rank {rank}: {name} ok", flush=True)


def same_typed(name: str, got: Any, want: np.ndarray) -> None:
    """:func:`check` that ``got`` (a DistArray, gathered with ``to_numpy()`` (collective), or anything
    ``numpy.asarray`` takes) has ``want``'s dtype and shape and equals it exactly."""
    g = got.to_numpy() if hasattr(got, "to_numpy") else np.asarray(got)
    check(name, g.dtype == want.dtype and g.shape == want.shape and np.array_equal(g, want))


#: ``checks[0]``: how many comparisons :func:`same` made on this rank (the programs print it at the end).
checks: List[int] = [0]


def same(name: str, got: Any, want: Any) -> None:
    """``got`` (a DistArray, gathered with ``to_numpy()`` (collective), or anything ``numpy.asarray`` takes) must
    have ``want``'s shape and equal it exactly; AssertionError naming ``name`` and both values otherwise."""
    g = got.to_numpy() if hasattr(got, "to_numpy") else np.asarray(got)
    assert g.shape == np.shape(want) and np.array_equal(g, want), f"{name}: got {g}, NumPy gives {want}"
    checks[0] += 1
