"""`nbmpi run` (python -m nbmpi.workers.launch.cli run) with the bundled mpiexec: exit codes, failure
and Ctrl-C handling without orphan processes, --timeout, the MPI thread level, bundled MPICH."""
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import psutil
import pytest

CLI = [sys.executable, "-m", "nbmpi.workers.launch.cli", "run"]


def write_script(tmp_path, code: str):
    """A script with a unique name (the marker to find its processes by command line)."""
    path = tmp_path / f"nbmpi_launch_{uuid.uuid4().hex}.py"
    path.write_text(textwrap.dedent(code))
    return path


def base_env(**extra):
    env = dict(os.environ)
    env.pop("MPI4PY_RC_THREAD_LEVEL", None)
    env["NBMPI_TIMEOUT"] = ""          # blocking waits wait forever unless a test says otherwise
    env.update(extra)
    return env


def cli(tmp_path, script, n=2, timeout=60, env=None, args=()):
    """Run `nbmpi run -n n --timeout timeout script` to completion."""
    return subprocess.run([*CLI, "-n", str(n), "--timeout", str(timeout), str(script), *args],
                          capture_output=True, text=True, env=env or base_env(), cwd=tmp_path,
                          timeout=timeout + 60)


def processes_with(marker: str):
    """Live (non-zombie) processes whose command line contains ``marker``."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if marker in " ".join(p.info["cmdline"] or []):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def alive(procs):
    """Those of ``procs`` (psutil.Process snapshots) still running and not zombies."""
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def assert_no_survivors(marker, tree=()):
    """Nothing of the job remains: no process naming the script, none of its recorded process tree."""
    deadline = time.monotonic() + 5  # reaping by init after a kill is asynchronous
    while time.monotonic() < deadline:
        left = processes_with(marker) + alive(tree)
        if not left:
            return
        time.sleep(0.1)
    desc = [(p.pid, " ".join(p.cmdline())) for p in left if p.is_running()]
    for p in left:  # clean up what we started before failing
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    raise AssertionError(f"processes of the job survived: {desc}")


def test_run_help():
    proc = subprocess.run([*CLI, "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "-n N" in proc.stdout and "--timeout" in proc.stdout and "program" in proc.stdout
    script = os.path.join(os.path.dirname(sys.executable), "nbmpi")
    proc = subprocess.run([script, "run", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "--timeout" in proc.stdout, proc.stdout + proc.stderr


def test_success_funneled_and_bundled_mpich(tmp_path):
    script = write_script(tmp_path, r'''
        import os, sys
        from mpi4py import MPI
        from nbmpi.workers import world
        rank = world().Get_rank()
        assert world().Get_size() == 2
        assert os.environ.get("MPI4PY_RC_THREAD_LEVEL") == "funneled", os.environ.get("MPI4PY_RC_THREAD_LEVEL")
        level = MPI.Query_thread()
        assert level == MPI.THREAD_FUNNELED, f"rank {rank}: thread level {level}, expected funneled"
        lib = MPI.Get_library_version()
        assert "MPICH" in lib, lib
        # the MPI library mpi4py loaded is the one of the bundled mpich wheel, next to this Python
        print(f"rank {rank}: funneled MPICH {lib.splitlines()[0]!r} {sys.argv[1:]}", flush=True)
    ''')
    proc = cli(tmp_path, script, args=("a1", "--flag"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for r in range(2):
        assert f"rank {r}: funneled MPICH" in proc.stdout, proc.stdout + proc.stderr
    assert "['a1', '--flag']" in proc.stdout  # script arguments reach the program


def test_thread_level_overridable_by_env(tmp_path):
    script = write_script(tmp_path, r'''
        from mpi4py import MPI
        assert MPI.Query_thread() == MPI.THREAD_MULTIPLE, MPI.Query_thread()
        print("multiple OK", flush=True)
    ''')
    proc = cli(tmp_path, script, env=base_env(MPI4PY_RC_THREAD_LEVEL="multiple"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("multiple OK") == 2


def test_blas_threads_per_rank(tmp_path):
    """Ranks on this host share its CPUs: each rank's BLAS gets cpus // n threads (the OpenBLAS
    of NumPy's wheels really runs that many), and a user's own setting stands."""
    from nbmpi.workers.launch.environment import BLAS_THREAD_VARIABLES, blas_threads

    assert blas_threads({}, 2, 2) == {v: "1" for v in BLAS_THREAD_VARIABLES}
    assert blas_threads({}, 3, 8)["OPENBLAS_NUM_THREADS"] == "2"
    assert blas_threads({}, 4, 2)["OMP_NUM_THREADS"] == "1"
    assert blas_threads({"MKL_NUM_THREADS": "4"}, 2, 2) == {}
    cpus = len(os.sched_getaffinity(0))
    script = write_script(tmp_path, r'''
        import os
        import numpy as np
        from nbmpi.workers import world
        import ctypes
        libs = sorted({l.split()[-1] for l in open("/proc/self/maps") if "openblas" in l.lower()})
        get = [getattr(ctypes.CDLL(p), n) for p in libs for n in
               ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_", "openblas_get_num_threads")
               if hasattr(ctypes.CDLL(p), n)]
        print(f"rank {world().Get_rank()} runs {get[0]() if get else 'unknown'} BLAS threads", flush=True)
        print(f"rank {world().Get_rank()}: {os.environ.get('OPENBLAS_NUM_THREADS')} {os.environ.get('OMP_NUM_THREADS')}",
              flush=True)
    ''')
    env = base_env()
    for v in BLAS_THREAD_VARIABLES:
        env.pop(v, None)
    proc = cli(tmp_path, script, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    want = max(1, cpus // 2)
    for r in range(2):
        assert f"rank {r}: {want} {want}" in proc.stdout, proc.stdout + proc.stderr
        if "unknown BLAS" not in proc.stdout:     # NumPy linked with OpenBLAS (the wheels): it obeys
            assert f"rank {r} runs {want} BLAS threads" in proc.stdout, proc.stdout
    proc = cli(tmp_path, script, env=dict(env, OMP_NUM_THREADS="3"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count(": None 3") == 2, proc.stdout + proc.stderr


def test_worst_exit_code(tmp_path):
    script = write_script(tmp_path, r'''
        import sys
        from nbmpi.workers import world
        world().Barrier()
        if world().Get_rank() == 1:
            sys.exit(3)
    ''')
    proc = cli(tmp_path, script)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "rank 1 exited 3" in proc.stderr
    assert_no_survivors(script.name)


def test_failing_rank_ends_blocked_rank(tmp_path):
    """Rank 0 raises while rank 1 blocks forever in a take without timeout: the launcher ends the
    job (not its --timeout), returns non-zero and shows the traceback."""
    script = write_script(tmp_path, r'''
        from nbmpi.workers import ArrayChannel, world
        ch = ArrayChannel(8)
        world().Barrier()
        if world().Get_rank() == 0:
            raise ValueError("boom from rank zero")
        ch.take(0)  # never satisfied, no timeout
        print("rank 1 should never get here", flush=True)
    ''')
    proc = cli(tmp_path, script, timeout=90)
    assert proc.returncode not in (0, 124), f"exit {proc.returncode}: the failure did not end the job\n{proc.stderr}"
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" in proc.stderr and "ValueError: boom from rank zero" in proc.stderr, proc.stderr
    assert "[rank 0]" in proc.stderr and "rank 0 exited 1" in proc.stderr
    assert "never get here" not in proc.stdout
    assert_no_survivors(script.name)


def _start_and_wait_running(tmp_path, code, n, extra_args=()):
    """Popen `nbmpi run`; returns (proc, script, lines, tree) once every rank printed RUNNING."""
    script = write_script(tmp_path, code)
    proc = subprocess.Popen([*CLI, "-n", str(n), *extra_args, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=base_env(), cwd=tmp_path)
    lines = []
    ready = threading.Event()

    def reader():
        for line in proc.stdout:
            lines.append(line)
            if "".join(lines).count("RUNNING") >= n:  # ranks' lines may interleave
                ready.set()

    threading.Thread(target=reader, daemon=True).start()
    try:
        assert ready.wait(60), f"ranks did not start: {lines}"
        tree = psutil.Process(proc.pid).children(recursive=True)
        assert len(tree) >= n + 1, tree  # mpiexec (+ proxy) + ranks
    except BaseException:
        for p in processes_with(script.name) + [psutil.Process(proc.pid)]:
            p.kill()
        raise
    return proc, script, lines, tree


BLOCKED = r'''
    import time
    from nbmpi.workers import ArrayChannel, world
    rank = world().Get_rank()
    ch = ArrayChannel(8)
    print(f"RUNNING rank {rank}", flush=True)
    if rank == 0:
        ch.take(1)          # blocked in a communication wait, no timeout
    else:
        while True:         # blocked in user code
            time.sleep(0.1)
'''


def test_ctrl_c_ends_every_process(tmp_path):
    proc, script, lines, tree = _start_and_wait_running(tmp_path, BLOCKED, 2)
    try:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=60)
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 130, f"exit {rc}\n{err}"
    assert "interrupted" in err
    assert_no_survivors(script.name, tree)


def test_timeout_returns_124_and_ends_every_process(tmp_path):
    proc, script, lines, tree = _start_and_wait_running(tmp_path, BLOCKED, 2, extra_args=("--timeout", "4"))
    try:
        rc = proc.wait(timeout=90)
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 124, f"exit {rc}\n{err}"
    assert "timed out after 4.0 s" in err
    assert_no_survivors(script.name, tree)


@pytest.mark.parametrize("form", ["-c", "-m"])
def test_module_and_code_forms(tmp_path, form):
    if form == "-c":
        # every rank prints before rank 1 fails (the barrier): the launch ends the others once a rank
        # has failed, so without it rank 0's line would race rank 1's exit
        argv = ["-c", "from nbmpi.workers import world; import sys; "
                      "print(f'code rank {world().Get_rank()} {sys.argv[1:]}', flush=True); world().Barrier(); "
                      "sys.exit(4 * world().Get_rank())",
                "x", "--flag"]
        expect = 4
    else:
        (tmp_path / "nbmpi_mod_probe.py").write_text(
            "import sys\nfrom nbmpi.workers import world\nprint(f'module rank {world().Get_rank()} {sys.argv[1:]}', flush=True)\n")
        argv = ["-m", "nbmpi_mod_probe", "--opt", "-n", "5"]  # the module's options, not nbmpi run's
        expect = 0
    env = base_env(PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    proc = subprocess.run([*CLI, "-n", "2", "--timeout", "60", *argv], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == expect, proc.stdout + proc.stderr
    word = "code" if form == "-c" else "module"
    args = "['x', '--flag']" if form == "-c" else "['--opt', '-n', '5']"
    for r in range(2):
        assert f"{word} rank {r} {args}" in proc.stdout, proc.stdout + proc.stderr


def test_usage_errors_before_any_rank_starts(tmp_path):
    """Bad input is refused with one line and exit 2 before mpiexec starts (no rank tracebacks)."""
    ok = write_script(tmp_path, "print('never')\n")
    cases = [(["-n", "0", str(ok)], "-n must be at least 1 (the number of MPI ranks), got 0"),
             (["-n", "2", str(tmp_path / "missing.py")], "No such file or directory; nothing was started"),
             (["-n", "2", "-m", "no_such_module_xyz"], "no module named 'no_such_module_xyz'"),
             (["-n", "2", "-c", "x = ("], "line 1: '(' was never closed (nothing was started)"),
             (["-n", "2", "--timeout", "-1", str(ok)], "--timeout must be a positive number of seconds")]
    for args, expect in cases:
        proc = subprocess.run([*CLI, *args], capture_output=True, text=True, env=base_env(), cwd=tmp_path,
                              timeout=60)
        assert proc.returncode == 2, (args, proc.returncode, proc.stderr)
        assert proc.stderr.startswith("nbmpi run: ") and expect in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1 and "never" not in proc.stdout


def test_rank_killed_by_a_signal_is_named(tmp_path):
    """A rank killed by SIGKILL cannot report; its guard does: the final line names it and the signal."""
    script = write_script(tmp_path, r'''
        import os, signal, time
        from nbmpi.workers import world
        world().Barrier()
        if world().Get_rank() == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
    ''')
    proc = cli(tmp_path, script, n=3, timeout=90)
    assert proc.returncode == 128 + signal.SIGKILL, proc.stdout + proc.stderr
    assert "nbmpi run: rank 1 was killed by SIGKILL; ranks [0, 2] were terminated" in proc.stderr, proc.stderr
    assert_no_survivors(script.name)


def test_lines_of_two_ranks_never_share_a_line(tmp_path):
    """Each rank writes whole lines (one write per line), so the merged output of 3 ranks printing at the same
    time has only whole lines: `print("rank", r, i)` is one line of the output, never cut by another rank's."""
    script = write_script(tmp_path, r'''
        import sys
        from nbmpi.workers import world
        r = world().Get_rank()
        world().Barrier()
        for i in range(400):
            print("line", "of", "rank", r, "number", i, "end")
            print("err", "of", "rank", r, "number", i, "end", file=sys.stderr)
    ''')
    proc = cli(tmp_path, script, n=3)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    import re
    for stream, word in ((proc.stdout, "line"), (proc.stderr, "err")):
        lines = [ln for ln in stream.splitlines() if ln.strip()]
        bad = [ln for ln in lines if not re.fullmatch(rf"{word} of rank [012] number \d+ end", ln)]
        assert not bad, bad[:5]
        assert len(lines) == 1200, len(lines)
