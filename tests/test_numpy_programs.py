"""Classic scientific programs written as plain NumPy (``tests/numpy_programs/``), run unchanged but for the import
(``import nbmpi.workers.distarray as np``) on 2 ranks under real mpiexec, equal to NumPy's results: heat equation,
shallow water, lattice Boltzmann, n-body, game of life, Monte Carlo pi, Gauss elimination, LU decomposition,
1-D convolution, quasicrystal, Black-Scholes, x-ray projection, Rosenbrock descent, wave equation. What the
distributed arrays lack runs through the NumPy fallback."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, assert_ok

PROGRAMS = sorted((REPO / "tests" / "numpy_programs").glob("*.py"))
RUNNER = REPO / "tests" / "numpy_program_runner.py"


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
