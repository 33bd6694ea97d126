"""Classic scientific programs written as plain NumPy (``tests/numpy_programs/``), run unchanged but for the import
(``import nbmpi.workers.distarray as np``) on 2 ranks under real mpiexec, equal to NumPy's results: heat equation,
shallow water, lattice Boltzmann, n-body, game of life, Monte Carlo pi, Gauss elimination, LU decomposition,
1-D convolution, quasicrystal, Black-Scholes, x-ray projection, Rosenbrock descent, wave equation. What the
distributed arrays lack runs through the NumPy fallback.

Bit for bit (``np.array_equal``, :data:`BIT_EXACT`): every program whose work is elementwise, shifted (``roll``,
slices), or sums along an axis local to each rank. Elementwise arithmetic is correctly rounded in the fused kernels
as in NumPy (no FMA contraction, no fastmath); ``exp``, ``log``, ``power``, ... run as NumPy's own ufunc on each
rank's block (NumPy math, on by default: ``nbmpi.workers.distarray.numpy_math``); float sums along the last axis
add in NumPy's pairwise order.

Not bit for bit (:data:`REDUCTION_ORDER`), equal to rounding (``rtol`` 1e-10), because of the order in which a
sum adds, never an elementwise difference:

* ``rosenbrock``: the final ``np.sum`` adds each rank's part, then the parts; NumPy adds one pairwise tree. The
  iterate ``x`` (elementwise and slices) is bit for bit.
* ``xray``: ``phantom.sum(axis=0)`` sums down the distributed axis, per rank and then across ranks; the row
  projections (``sum(axis=1)``, local rows) are bit for bit, and the back projection is bit for bit NumPy's
  elementwise formula applied to the distributed run's own projections.
* ``gauss_elimination`` (``np.dot`` of a row and ``x``), ``lu_decomposition`` and ``nbody`` (``@``): BLAS adds
  a dot product in an order that depends on the operands' shapes and alignment, and a product over the
  distributed axis adds per rank, then across ranks; every later step carries the difference.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, assert_ok

PROGRAMS = sorted((REPO / "tests" / "numpy_programs").glob("*.py"))
RUNNER = REPO / "tests" / "numpy_program_runner.py"
#: Programs equal to NumPy's bit for bit on 2 ranks (see the module doc).
BIT_EXACT = ("black_scholes", "convolution_1d", "game_of_life", "heat", "lattice_boltzmann", "monte_carlo_pi",
             "quasicrystal", "shallow_water", "wave_equation")
#: The others: why they differ (the order of a sum).
REDUCTION_ORDER = {
    "rosenbrock": "the final np.sum adds per rank, then across ranks",
    "xray": "sum(axis=0) adds down the distributed axis, per rank, then across ranks",
    "gauss_elimination": "np.dot in the back substitution (BLAS's order; per rank, then across ranks)",
    "lu_decomposition": "@ (BLAS's order; per rank, then across ranks)",
    "nbody": "@ (BLAS's order; per rank, then across ranks), every step",
}


@pytest.fixture(scope="module")
def outputs(tmp_path_factory, kernel_cache):
    """Both runs of every program: NumPy in one process, the distributed arrays on 2 ranks (one launch)."""
    ref = tmp_path_factory.mktemp("numpy")
    dist = tmp_path_factory.mktemp("dnp")
    p = subprocess.run([sys.executable, str(RUNNER), "numpy", str(ref), *map(str, PROGRAMS)],
                       capture_output=True, text=True, timeout=300)
    assert_ok(p)
    env_cache = {"NBMPI_DISTARRAY_CACHE": kernel_cache}
    import os
    q = subprocess.run([sys.executable, "-m", "nbmpi.workers.launch.cli", "run", "-n", "2", "--timeout", "900",
                        str(RUNNER), "dnp", str(dist), *map(str, PROGRAMS)],
                       capture_output=True, text=True, timeout=960, env={**os.environ, **env_cache},
                       cwd=str(REPO / "tests"))
    return ref, dist, p.stdout, q


def test_at_least_twelve_programs():
    assert len(PROGRAMS) >= 12, PROGRAMS


@pytest.mark.parametrize("program", [p.stem for p in PROGRAMS])
def test_program_equals_numpy(outputs, program):
    ref, dist, _, q = outputs
    assert f"dnp {program}: FAILED" not in q.stdout, q.stdout + q.stderr
    assert (dist / f"{program}.npy").exists(), f"no result from the distributed run\n{q.stdout}\n{q.stderr}"
    want = np.load(ref / f"{program}.npy")
    got = np.load(dist / f"{program}.npy")
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    # elementwise float64 work is bit for bit; sums over several ranks add in another order
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_the_run_exits_cleanly(outputs):
    assert_ok(outputs[3])


def _results(outputs, program):
    ref, dist, _, q = outputs
    assert (dist / f"{program}.npy").exists(), f"no result from the distributed run\n{q.stdout}\n{q.stderr}"
    return np.load(ref / f"{program}.npy"), np.load(dist / f"{program}.npy")


def test_every_program_is_classified():
    names = {p.stem for p in PROGRAMS}
    assert names == set(BIT_EXACT) | set(REDUCTION_ORDER), names ^ (set(BIT_EXACT) | set(REDUCTION_ORDER))
    assert not set(BIT_EXACT) & set(REDUCTION_ORDER)


@pytest.mark.parametrize("program", BIT_EXACT)
def test_elementwise_program_is_bit_for_bit(outputs, program):
    want, got = _results(outputs, program)
    diff = np.flatnonzero(got.ravel() != want.ravel())
    assert np.array_equal(got, want), (f"{program}: {diff.size} of {want.size} values differ from NumPy's, first at "
                                       f"{diff[:5]}: {got.ravel()[diff[:5]]} vs {want.ravel()[diff[:5]]}")


def test_rosenbrock_iterate_is_bit_for_bit(outputs):
    want, got = _results(outputs, "rosenbrock")
    assert np.array_equal(got[:-1], want[:-1])          # x: elementwise updates of slices
    assert got[-1] == pytest.approx(want[-1], rel=1e-12)  # f: a sum over both ranks


def test_xray_row_projection_and_back_projection_are_bit_for_bit(outputs):
    want, got = _results(outputs, "xray")
    n = int(round(np.sqrt(1 + want.size))) - 1            # result = [rows (n), columns (n), back (n * n)]
    assert n * n + 2 * n == want.size
    assert np.array_equal(got[:n], want[:n])              # exp(-sum(axis=1) * dl): rows are local, pairwise sums
    rows, cols = got[:n], got[n:2 * n]                    # columns: sums across ranks (to rounding only)
    np.testing.assert_allclose(cols, want[n:2 * n], rtol=1e-13)
    assert np.array_equal(got[2 * n:], (-np.log(rows)[:, np.newaxis] - np.log(cols)[np.newaxis, :]).ravel())
