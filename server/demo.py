"""``nbmpi demo``: start the controller, run one example job through it, show the results.

Steps (one command, used as the project's main job):

1. start ``nbmpi serve`` on a free 127.0.0.1 port with a data directory
   (a fresh temporary one unless ``--data-dir``), its own token and client
   configuration inside that directory (the user's configuration is untouched);
2. submit :mod:`nbmpi.server.example_job` (1-D heat equation with ArrayChannel
   halos) on N ranks, follow its state and print every rank's output;
3. print the per-rank compute / communication / wait summary and the bytes
   matrix from the job's trace; with ``--keep`` also where the Chrome trace lies and
   the dashboard's address with a link that logs the browser tab in (without it the
   controller stops next, so no link to it is printed; with ``--data-dir`` the trace
   file stays and its path is printed);
4. stop the service (SIGTERM: nothing is left running) and exit with the job's
   exit code; with ``--keep`` leave it running instead (its pid is printed, and
   ``kill PID`` stops it) so that the dashboard can be opened.

The service's own output goes to ``DATA_DIR/serve.log`` (a kept service must not
write into the pipe of a command that has ended).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional

EXAMPLE = Path(__file__).resolve().parent / "example_job.py"


def start_service(data_dir: Path, max_ranks: int, config: Optional[Path] = None, echo: bool = True):
    """Start ``nbmpi serve`` (no pools) on a free 127.0.0.1 port with ``data_dir``; return ``(proc, url)``
    once ``/api/health`` answers. ``config``: client config file (default ``data_dir/client.json``).
    The service writes its output to ``data_dir/serve.log``; ``echo`` prints its start-up lines.
    Stop it with :func:`stop_service`."""
    env = dict(os.environ, NBMPI_CONFIG=str(config or data_dir / "client.json"))
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    log_path = data_dir / "serve.log"
    with open(log_path, "ab") as log:
        start = log.tell()
        proc = subprocess.Popen([sys.executable, "-m", "nbmpi.server.cli", "serve", "--port", "0", "--data-dir",
                                 str(data_dir), "--max-ranks", str(max_ranks), "--no-pools"],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    url = None
    deadline = time.monotonic() + 60
    with open(log_path, errors="replace") as out:
        out.seek(start)
        pending = ""
        while True:
            chunk = out.readline()
            if not chunk:
                if proc.poll() is not None:
                    raise RuntimeError(f"nbmpi serve exited {proc.returncode} before listening; see {log_path}")
                if time.monotonic() > deadline:
                    stop_service(proc)
                    raise RuntimeError(f"nbmpi serve did not start within 60 s; see {log_path}")
                time.sleep(0.05)
                continue
            pending += chunk
            if not pending.endswith("\n"):
                continue
            line, pending = pending, ""
            if echo:
                print(line, end="", flush=True)
            if "listening on " in line:
                url = line.split("listening on ")[1].split()[0]
            if "client configuration" in line and url:
                break
    from .client import ApiError, Client

    deadline = time.monotonic() + 60
    while True:
        try:
            with Client(url, None, timeout=2) as c:
                c.health()
            return proc, url
        except ApiError:
            pass
        if time.monotonic() > deadline:
            stop_service(proc)
            raise RuntimeError("nbmpi serve did not answer /api/health within 60 s")
        time.sleep(0.1)


def stop_service(proc: subprocess.Popen, timeout: float = 30) -> None:
    """SIGTERM a service started by :func:`start_service`; SIGKILL if it has not ended in ``timeout`` s."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def remove_data_dir(d: Path) -> List[str]:
    """Remove the directory ``d`` and everything in it (the service that used it has stopped, and with it
    every process it started). Returns what could not be removed, each with its error (empty: ``d`` is gone)."""
    errors: List[str] = []
    if sys.version_info >= (3, 12):   # onerror is deprecated there
        shutil.rmtree(d, onexc=lambda fn, path, exc: errors.append(f"{path}: {exc}"))
    else:
        shutil.rmtree(d, onerror=lambda fn, path, exc: errors.append(f"{path}: {exc[1]}"))
    if d.exists() and not errors:
        errors.append(f"{d}: still there")
    return errors


def main(data_dir: Optional[str] = None, ranks: int = 2, keep: bool = False) -> int:
    """Run the demo; returns the example job's exit code. ``keep`` leaves the controller running."""
    from .client import ApiError, Client

    temporary = data_dir is None
    d = Path(data_dir).expanduser().resolve() if data_dir else Path(tempfile.mkdtemp(prefix="nbmpi-demo-"))
    d.mkdir(parents=True, exist_ok=True)
    print(f"== nbmpi demo: starting the controller (data directory {d})", flush=True)
    proc, url = start_service(d, max_ranks=max(ranks, os.cpu_count() or 1))
    try:
        token = json.loads((d / "client.json").read_text())["token"]
        with Client(url, token) as c:
            print(f"== submitting {EXAMPLE.name} on {ranks} ranks", flush=True)
            job = c.submit(EXAMPLE.read_text(), ranks=ranks, script_name=EXAMPLE.name,
                           args=["--steps", "200"], name="demo", timeout=600)
            print(f"== job {job['id']} {job['state']}; output of every rank:", flush=True)
            job = c.wait(job["id"])
            print(f"== job {job['id']} {job['state']} (exit code {job['exit_code']}, per rank "
                  f"{job['rank_exit_codes']}), {job['finished_at'] - job['created_at']:.2f} s from submit "
                  "to finish", flush=True)
            if job["state"] == "succeeded":
                s = c.summary(job["id"])
                print(f"== trace summary over {s['window_s']:.3f} s:")
                print(f"{'rank':>4} {'compute s':>10} {'comm s':>10} {'wait s':>10} {'events':>7}")
                for r in s["ranks"]:
                    print(f"{r['rank']:>4} {r['compute_s']:>10.4f} {r['comm_s']:>10.4f} {r['wait_s']:>10.4f} "
                          f"{r['events']:>7}")
                print("bytes sent (row: from rank, column: to rank):")
                for i, row in enumerate(s["bytes"]):
                    print(f"{i:>4} " + " ".join(f"{b:>10}" for b in row))
                trace = d / "jobs" / str(job["id"]) / "trace" / "trace.json"
                if keep or not temporary:   # a temporary directory is removed when the controller stops
                    print(f"== Chrome trace: {trace} (open in https://ui.perfetto.dev)"
                          + (f", also at {url}/api/v1/jobs/{job['id']}/trace" if keep else ""))
            if keep:   # links only to a controller that keeps running
                print(f"== dashboard: {url}/dashboard (log in with the token {token}); this link logs the "
                      f"browser tab in: {url}/dashboard#token={token}", flush=True)
                print(f"== the job's timeline: {url}/dashboard/jobs/{job['id']}", flush=True)
            rc = 0 if job["state"] == "succeeded" else (job["exit_code"] or 1)
    except ApiError as exc:
        print(f"nbmpi demo: {exc}", file=sys.stderr)
        rc = 1
        keep = False
    except BaseException:
        stop_service(proc)
        if temporary:
            remove_data_dir(d)
        raise
    if keep:
        print(f"== the controller keeps running (pid {proc.pid}, output in {d / 'serve.log'}); stop it with: "
              f"kill {proc.pid}" + (f" and remove {d} (it holds the token)" if temporary else ""), flush=True)
    else:
        stop_service(proc)
        left = remove_data_dir(d) if temporary else []
        if temporary and left:   # never claim a removal that did not happen: the directory holds a token
            print(f"== controller stopped; its temporary data directory {d} could NOT be removed entirely "
                  f"(remove it yourself, it holds the token): " + "; ".join(left), file=sys.stderr, flush=True)
            rc = rc or 1
        elif temporary:   # it holds a token and the job's files: nothing of the demo stays behind
            print(f"== controller stopped; its temporary data directory {d} was removed (run `nbmpi demo --keep` "
                  "to keep both and open the dashboard)", flush=True)
        else:
            print(f"== controller stopped; its records stay in {d} (run `nbmpi demo --keep` to keep it running "
                  "and open the dashboard)", flush=True)
    return rc
