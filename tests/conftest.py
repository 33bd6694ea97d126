"""Shared fixtures: run real MPI programs under `nbmpi run` (real mpiexec); the suite leaves no shared memory."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"


def _interrupt_on_sigterm(signum, frame):
    raise KeyboardInterrupt(f"pytest received signal {signum} (e.g. CI's timeout)")


def pytest_configure(config):
    """A SIGTERM (``timeout`` in ``.ci/run``, a CI runner cancelling the job) interrupts the run like Ctrl-C, so
    pytest still tears the fixtures down: the Slurm daemons, controllers, network namespaces and bridges the
    tests started are stopped and removed, and MPI finalizes (no ``mpich_shm_*`` segment left in /dev/shm).
    Python's default for SIGTERM would end the process at once and leave all of them behind."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt_on_sigterm)


def nbmpi_run(tmp_path: Path, code: str, n: int = 2, timeout: float = 120, env=None, args=()):
    """Write ``code`` (dedented) to a script and run it with ``nbmpi run -n n``.

    Returns the CompletedProcess (text stdout/stderr). The launcher kills the
    whole process group on failure, so nothing is left behind. The program finds
    the helper modules of this folder (``spmd_checks``) through ``PYTHONPATH``.
    """
    script = tmp_path / f"prog_{abs(hash(code)) % 10**8}_{n}.py"
    script.write_text(textwrap.dedent(code))
    full_env = dict(os.environ)
    full_env.setdefault("NBMPI_TIMEOUT", "60")
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
    if env:
        full_env.update(env)
    cmd = [sys.executable, "-m", "nbmpi.workers.launch.cli", "run", "-n", str(n), "--timeout", str(timeout),
           str(script), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=full_env, cwd=tmp_path,
                          timeout=timeout + 30)


@pytest.fixture
def run_mpi(tmp_path):
    """``run_mpi(code, n=2, timeout=120, env=None, args=())`` -> CompletedProcess."""
    def _run(code: str, n: int = 2, timeout: float = 120, env=None, args=()):
        return nbmpi_run(tmp_path, code, n=n, timeout=timeout, env=env, args=args)
    return _run


@pytest.fixture(scope="module")
def kernel_cache() -> str:
    """The on-disk numba kernel cache of the distributed arrays that users get (``fused_kernels.cache_dir()``,
    "" if none), to pass on as ``NBMPI_DISTARRAY_CACHE`` so every run of a module compiles each kernel once."""
    from nbmpi.workers.distarray.fused_kernels import cache_dir

    return cache_dir() or ""


def assert_ok(proc) -> None:
    """Fail with the program's output if it did not exit 0."""
    assert proc.returncode == 0, f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr}"


def run_script(run_mpi, kernel_cache: str, script: str, n: int, timeout: float = 300, args=()):
    """Run ``tests/<script>`` on ``n`` ranks with the suite's kernel cache (``args``: its command line); fail
    with its output unless it exits 0. Returns the finished process."""
    code = (REPO / "tests" / script).read_text()
    p = run_mpi(code, n=n, timeout=timeout, env={"NBMPI_DISTARRAY_CACHE": kernel_cache}, args=args)
    assert_ok(p)
    return p


def run_ranks(run_mpi, kernel_cache: str, script: str, n: int, marks, timeout: float = 290, args=()):
    """:func:`run_script`, then fail unless every rank ``r`` printed ``rank r: <mark>`` for each of ``marks``.
    Returns the finished process."""
    p = run_script(run_mpi, kernel_cache, script, n, timeout, args)
    for r in range(n):
        for m in marks:
            assert f"rank {r}: {m}" in p.stdout, (r, m, p.stdout)
    return p


def run_code_all_ok(run_mpi, kernel_cache: str, code: str, n: int, timeout: float = 180,
                    env_timeout: str = "30"):
    """Run the program text ``code`` on ``n`` ranks with the suite's kernel cache and ``NBMPI_TIMEOUT`` =
    ``env_timeout``; fail with its output unless it exits 0 and every rank ``r`` printed ``rank r: ALL OK (``.
    Returns the finished process."""
    p = run_mpi(code, n=n, timeout=timeout, env={"NBMPI_DISTARRAY_CACHE": kernel_cache, "NBMPI_TIMEOUT": env_timeout})
    assert_ok(p)
    for rank in range(n):
        assert f"rank {rank}: ALL OK (" in p.stdout, (rank, p.stdout, p.stderr)
    return p


def run_sections(run_mpi, kernel_cache: str, script: str, n: int, sections, timeout: float = 300):
    """:func:`run_script`, then fail unless it printed ``ok <section>`` for every one of ``sections`` and its
    closing count ``... checks on <n> ranks)``. Returns the finished process (for further checks)."""
    p = run_script(run_mpi, kernel_cache, script, n, timeout)
    for s in sections:
        assert f"ok {s}\n" in p.stdout, (s, p.stdout)
    assert f" checks on {n} ranks)" in p.stdout, p.stdout
    return p


SHM = Path("/dev/shm")


def _shm_names():
    try:
        return {p.name for p in SHM.iterdir() if p.name.startswith(("mpich_shm_", "nbmpi-"))}
    except OSError:
        return set()


def _controller_cgroups():
    """The per-controller cgroup directories (``<cgroup root>/nbmpi/c-*``) that exist now."""
    try:
        from nbmpi.workers.launch.cgroups import cgroup2_mount, freezer_mount
    except ImportError:
        return set()
    found = set()
    for mount in (cgroup2_mount(), freezer_mount()):
        if mount and os.path.isdir(os.path.join(mount, "nbmpi")):
            found.update(p for p in Path(mount, "nbmpi").glob("c-*") if p.is_dir())
    return found


#: modules that must not run beside each other on two pytest-xdist workers: the same UNIX accounts
#: (test_slurm takes test_isolation's), one private address range picked as "the first free /24" (virtual clusters)
SHARED_GROUPS = {
    "accounts": ("test_isolation", "test_containment", "test_slurm"),
    "virtual-cluster": ("test_cluster", "test_cluster_pools", "test_notebooks", "test_serve_hosts", "test_slurm_nodes"),
}
_GROUP_OF = {m: g for g, mods in SHARED_GROUPS.items() for m in mods}


def pytest_itemcollected(item):
    """Under ``pytest -n 2 --dist loadgroup`` (the README's test command) a module runs whole, in order, on one
    worker (its module fixtures once; test_slurm's ordered tests in order); the modules of one of
    :data:`SHARED_GROUPS` share a worker. (Marked as each test is collected: pytest-xdist reads the marks in its
    own ``pytest_collection_modifyitems``.)"""
    mod = item.module.__name__.rsplit(".", 1)[-1] if getattr(item, "module", None) else item.nodeid
    item.add_marker(pytest.mark.xdist_group(_GROUP_OF.get(mod, mod)))


def _is_xdist_worker(config) -> bool:
    return hasattr(config, "workerinput")


def pytest_sessionstart(session):
    """Note the /dev/shm segments and controller cgroups that exist before the suite (in the process that runs
    the whole session: pytest alone, or pytest-xdist's controller, which outlives its workers)."""
    if not _is_xdist_worker(session.config):
        session.config._nbmpi_before = (_shm_names(), _controller_cgroups())


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    """After the whole suite (every fixture torn down, every xdist worker ended):

    * no MPI or nbmpi shared-memory segment created during it may remain in /dev/shm unless a live process
      still maps it (killed ranks must not leak their segments): else the run fails, naming them;
    * the per-controller cgroup directories it made are removed (a controller the tests killed with SIGKILL
      cannot remove its own): only empty ones, which ``rmdir`` alone can remove (a cgroup with a live process
      or a job cgroup below it stays, and is not ours to end here).
    """
    before = getattr(session.config, "_nbmpi_before", None)
    if before is None:
        return
    shm_before, cgroups_before = before
    for path in _controller_cgroups() - cgroups_before:
        try:
            os.rmdir(path)
        except OSError:
            pass
    from nbmpi.workers.launch.processes import segments_in_use

    new = {str(SHM / n) for n in _shm_names() - shm_before}
    leaked = sorted(new - segments_in_use(new))
    if leaked:
        tr = session.config.pluginmanager.get_plugin("terminalreporter")
        msg = f"the test suite left {len(leaked)} shared-memory segments in /dev/shm: {leaked[:10]}"
        if tr is not None:
            tr.write_line(f"FAILED (leftovers): {msg}", red=True)
        else:
            print(msg, file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
