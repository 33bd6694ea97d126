"""Shared memory that ranks on other hosts leave behind, removed on those hosts after a multi-host run.

A rank killed by a signal never runs ``MPI_Finalize``, and MPICH's node segments
(``/dev/shm/mpich_shm_*``) stay in the ``/dev/shm`` of the rank's host. The launcher
removes such leftovers on its own host (:meth:`nbmpi.workers.launch.launcher.RankWatch.clean_up`);
on the other hosts of an ``nbmpi run --hosts`` job it cannot, and the ranks' guards
may have been killed with them. So after such a job ended without every rank
succeeding, :func:`clean_hosts` runs ``python -m nbmpi.workers.launch.remote_cleanup
STATUS_DIR`` on every host, through the same remote shell Hydra used (``ssh``, or
``$NBMPI_LAUNCHER_EXEC`` for a virtual cluster): each host unlinks the segments its
ranks noted in the status directory (which every host sees) that no live process of
that host maps any more. Blocking; at most :data:`HOST_TIMEOUT_S` per host.

Through the same remote shell, :func:`unreachable` checks before a launch that every host can be
reached (an engine pool on other hosts checks so before it starts, to name the host that is wrong).
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Sequence

#: Seconds one host's cleanup may take before it is abandoned.
HOST_TIMEOUT_S = 30.0


def hosts_of(hosts: Optional[Sequence[str]] = None, hostfile: Optional[str] = None) -> List[str]:
    """The distinct host names of ``hosts`` (``host[:slots]`` entries) or of the lines of ``hostfile``."""
    entries = list(hosts or [])
    if hostfile:
        with open(hostfile) as f:
            entries += [line.split("#", 1)[0].strip() for line in f]
    return list(dict.fromkeys(e.split(":", 1)[0] for e in entries if e))


def clean_hosts(hosts: Sequence[str], status_dir: str, shell: str = "ssh",
                env: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """Run the cleanup on each of ``hosts`` through ``shell`` (``ssh``, or the launcher's stand-in) with
    environment ``env`` (default this process's). Returns host -> what it reported (removed paths, or
    why it failed). Blocking; never raises for a host that cannot be reached."""
    env = dict(os.environ if env is None else env)
    remote = shlex.join([sys.executable, "-m", __name__, status_dir])
    out: Dict[str, str] = {}
    for host in hosts:
        try:
            proc = subprocess.run([shell, "-x", host, remote], capture_output=True, text=True, env=env,
                                  timeout=HOST_TIMEOUT_S, stdin=subprocess.DEVNULL)
            out[host] = (proc.stdout.strip() if proc.returncode == 0
                         else f"failed ({proc.returncode}): {proc.stderr.strip()[-300:]}")
        except (OSError, subprocess.TimeoutExpired) as exc:
            out[host] = f"failed: {exc}"
    return out


def unreachable(hosts: Sequence[str], shell: str = "ssh", env: Optional[Dict[str, str]] = None,
                timeout: float = HOST_TIMEOUT_S) -> Dict[str, str]:
    """The hosts among ``hosts`` on which ``SHELL -x HOST true`` (what Hydra's ssh launcher runs, with
    ``shell`` ``ssh`` or the launcher's stand-in) does not succeed within ``timeout`` s, with why (the
    shell's last error line). Empty when every host answers. Blocking; the hosts are tried at once."""
    env = dict(os.environ if env is None else env)

    def why(host: str) -> Optional[str]:
        try:
            proc = subprocess.run([shell, "-x", host, "true"], capture_output=True, text=True, env=env,
                                  timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return f"no answer within {timeout:g} s"
        except OSError as exc:
            return f"cannot run {shell}: {exc}"
        if proc.returncode == 0:
            return None
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        return f"{shell} exited {proc.returncode}" + (f": {lines[-1][-300:]}" if lines else "")

    with ThreadPoolExecutor(max_workers=min(len(hosts), 16) or 1) as ex:
        answers = dict(zip(hosts, ex.map(why, hosts)))
    return {h: w for h, w in answers.items() if w is not None}


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m nbmpi.workers.launch.remote_cleanup STATUS_DIR`` (on one host): unlink the segments
    noted in STATUS_DIR that exist here and no process here maps; prints them, one a line."""
    from .processes import noted_segments, remove_shm

    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1:
        print("usage: python -m nbmpi.workers.launch.remote_cleanup STATUS_DIR", file=sys.stderr)
        return 2
    for path in remove_shm(noted_segments(argv[0])):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
