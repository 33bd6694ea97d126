"""The ``nbmpi`` command: ``nbmpi run`` (from :mod:`nbmpi.workers.launch.cli`) and the controller's subcommands.

The console script ``nbmpi`` is :func:`main` here, so the runtime package never
imports the controller; ``python -m nbmpi.workers.launch.cli run`` works without it.

* ``nbmpi serve [--host 127.0.0.1] [--port 8765] [--max-ranks N] [--db PATH] [--data-dir DIR]
  [--backend local|slurm] [--hosts H1,H2 | --hostfile F] [--slurm-partition P] [--slurm-sbatch-arg ARG ...]``:
  run the service (uvicorn). Creates the data directory and, on first start,
  a token (printed once with a dashboard link that logs a browser tab in; the
  users file, mode 0600, keeps only its hash); writes the client configuration
  file (URL + token, mode 0600). The dashboard is at ``URL/dashboard``.
* ``nbmpi users add NAME | list | remove NAME [--data-dir DIR] [--users FILE]``: ``add``
  prints a new token of NAME once and stores its hash (see :mod:`nbmpi.server.auth`).
* ``nbmpi submit script.py -n 4 [--wait] [--timeout S] [--pool ID] [--args 'A B'] [--idempotency-key K]``:
  queue a job and print its id (the request carries an ``Idempotency-Key``, and is retried with it when
  the connection breaks, so it runs once); ``--wait`` follows it, prints every rank's output and
  exits with the job's exit code. The script's syntax is checked before anything is submitted;
  Ctrl-C during ``--wait`` says the job keeps running (``--cancel-on-interrupt``: cancels it).
* ``nbmpi jobs [--state S]``, ``nbmpi logs ID [--rank R] [--stderr]``,
  ``nbmpi cancel ID``, ``nbmpi pools``, ``nbmpi pool start -n N [--name X] [--idle-timeout S]``,
  ``nbmpi pool stop ID``.
* ``nbmpi demo [-n N] [--data-dir DIR] [--keep]``: see :mod:`nbmpi.server.demo`.

Client commands take ``--server URL`` and ``--token T``, else ``$NBMPI_SERVER`` /
``$NBMPI_TOKEN``, else the client configuration file (see :mod:`nbmpi.server.config`).
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Optional

from nbmpi.workers.launch.jupyter_proxy import proxied_path

from . import config
from .backends import BACKENDS


DEFAULT_MAX_LOG = "256M"


def _size(text: str) -> int:
    """``"512M"`` -> bytes (suffixes K, M, G, T; powers of 1024)."""
    t = str(text).strip().upper().removesuffix("B")
    mult = 1
    if t and t[-1] in "KMGT":
        mult = 1024 ** ("KMGT".index(t[-1]) + 1)
        t = t[:-1]
    try:
        value = int(float(t) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size; use e.g. 512M or 2G") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a size cannot be negative")
    return value


def _add_client_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server", default=None, metavar="URL", help=f"service URL (else ${config.SERVER_ENV} "
                   "or the client config file)")
    p.add_argument("--token", default=None, metavar="T", help=f"bearer token (else ${config.TOKEN_ENV} "
                   "or the client config file)")


def _client(args: argparse.Namespace):
    from .client import Client

    s = config.client_settings(args.server, args.token)
    if not s.token:
        raise SystemExit("nbmpi: no token: pass --token, set NBMPI_TOKEN, or run `nbmpi serve` once "
                         f"(it writes {config.client_config_path()})")
    return Client(s.url, s.token)


def _fail(exc) -> int:
    print(f"nbmpi: {exc}", file=sys.stderr)
    return 1


# -- serve --------------------------------------------------------------------------------------
#: ``nbmpi serve`` option -> backend keyword, per backend (see :class:`nbmpi.server.backends.local.LocalBackend`
#: and :class:`nbmpi.server.backends.slurm.SlurmBackend`).
_BACKEND_OPTIONS = {
    "local": {"hosts": "hosts", "hostfile": "hostfile"},
    "slurm": {"slurm_partition": "partition", "slurm_sbatch_arg": "sbatch_args",
              "slurm_poll_interval": "poll_interval", "slurm_mpi": "mpi", "slurm_pool_ip": "pool_ip"},
}


def _backend_options(args: argparse.Namespace) -> dict:
    """The backend's keyword options from the backend options given (``--slurm-*``; ``--hosts``,
    ``--hostfile``). Raises ValueError when they are given to another backend."""
    for backend, options in _BACKEND_OPTIONS.items():
        wrong = [o for o in options if getattr(args, o, None) is not None]
        if wrong and args.backend != backend:
            flags = ", ".join("--" + o.replace("_", "-") for o in wrong)
            raise ValueError(f"{flags}: only for --backend {backend} (this service uses --backend {args.backend})")
    options = _BACKEND_OPTIONS.get(args.backend, {})
    given = {key: getattr(args, opt) for opt, key in options.items() if getattr(args, opt, None) is not None}
    if "hosts" in given:
        given["hosts"] = [h for h in given["hosts"].split(",") if h.strip()]
    return given


def _accounts(data_dir: Path, users_path: Path, db_path: Path, unsafe_shared: bool):
    """The service's :class:`~nbmpi.server.accounts.Accounts`; with an account per user, the data
    directory protected from them and files made from now on root's alone (umask 077).
    ValueError (AccountError) saying what to change when the service must not start."""
    from .accounts import Accounts, check_runnable, protect_data_dir

    accounts = Accounts.load(users_path, unsafe_shared_account=unsafe_shared)
    if accounts.mode == "accounts":
        check_runnable()
        os.umask(0o077)
        (data_dir / "pools").mkdir(exist_ok=True)
        protect_data_dir(data_dir, db_path, users_path)
    return accounts


def _cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from .app import create_app
    from .auth import ensure_users_file

    data_dir = config.ensure_data_dir(Path(args.data_dir) if args.data_dir else config.default_data_dir())
    users_path = Path(args.users) if args.users else data_dir / "users.json"
    try:
        token, created = ensure_users_file(users_path)
    except (ValueError, OSError) as exc:
        print(f"nbmpi serve: {exc}", file=sys.stderr)
        return 2
    try:
        backend_options = _backend_options(args)
        accounts = _accounts(data_dir, users_path, Path(args.db) if args.db else data_dir / "nbmpi.db",
                             args.unsafe_shared_account)
    except ValueError as exc:
        print(f"nbmpi serve: {exc}", file=sys.stderr)
        return 2
    if args.max_ranks is not None:
        max_ranks = args.max_ranks
    else:   # the local backend holds ranks on this host; a cluster queue decides itself
        max_ranks = (os.cpu_count() or 1) if args.backend == "local" else None
    if max_ranks is not None and max_ranks < 1:
        print(f"nbmpi serve: --max-ranks must be at least 1, got {max_ranks}", file=sys.stderr)
        return 2
    try:
        loopback = ipaddress.ip_address(args.host).is_loopback
    except ValueError:
        loopback = args.host == "localhost"
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as exc:
        print(f"nbmpi serve: cannot listen on {args.host}:{args.port}: {exc}; choose another --port",
              file=sys.stderr)
        return 1
    sock.listen(128)
    port = sock.getsockname()[1]
    host = f"[{args.host}]" if family == socket.AF_INET6 else args.host
    url = f"http://{host}:{port}"
    cfg = config.read_client_config()
    client_token = token
    if not created and cfg.get("token"):   # keep the configured token while it is valid here
        from .auth import Authenticator

        client_token = cfg["token"] if Authenticator(users_path).user_for(cfg["token"]) else None
    cfg_path = config.write_client_config(url, client_token) if client_token else None
    from .backends import BackendError

    try:
        app = create_app(data_dir, max_ranks, users_path=users_path, db_path=Path(args.db) if args.db else None,
                         enable_pools=not args.no_pools, backend=args.backend, backend_options=backend_options,
                         max_log_bytes=args.max_log_bytes or None, accounts=accounts)
    except BackendError as exc:
        print(f"nbmpi serve: {exc}", file=sys.stderr)
        return 2
    limit = max_ranks if max_ranks is not None else "per job: the backend's queue decides"
    print(f"nbmpi serve: listening on {url} (backend {args.backend}, max ranks {limit}, data {data_dir})",
          flush=True)
    print(f"nbmpi serve: containment: {app.state.service.containment}", flush=True)
    _announce(url, port, token if created else None, client_token, users_path, cfg_path, accounts)
    if not loopback:
        print(f"nbmpi serve: WARNING: listening on {args.host}, not only on this machine; this service runs "
              "code: use TLS in front of it and keep tokens secret", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level=args.log_level, access_log=False))
    server.run(sockets=[sock])
    return 0


def _announce(url: str, port: int, new_token: Optional[str], client_token: Optional[str], users_path: Path,
              cfg_path: Optional[Path], accounts) -> None:
    """What ``nbmpi serve`` tells the operator at start: the dashboard's links (a new token once),
    the path through a Jupyter server, the client configuration, the users' isolation."""
    if new_token:
        print(f"nbmpi serve: first start: generated token {new_token}\n"
              f"nbmpi serve: shown only now: {users_path} keeps only its hash (owner-only); "
              "`nbmpi users add NAME` makes more", flush=True)
        print(f"nbmpi serve: dashboard at {url}/dashboard; this link logs a browser tab in: "
              f"{url}/dashboard#token={new_token}", flush=True)
    else:
        print(f"nbmpi serve: dashboard at {url}/dashboard (log in with your token"
              + (f", kept in {config.client_config_path()}" if client_token else
                 f"; {users_path} holds only hashes: make a new one with `nbmpi users add NAME`") + ")",
              flush=True)
    print(f"nbmpi serve: from a Jupyter server on this host (jupyter-server-proxy): "
          f"{proxied_path(port, 'dashboard')} under Jupyter's address", flush=True)
    if cfg_path:
        print(f"nbmpi serve: client configuration written to {cfg_path}", flush=True)
    if accounts.mode == "accounts":
        print("nbmpi serve: each user's jobs and pools run as their own UNIX account", flush=True)
    elif accounts.warning():
        print(f"nbmpi serve: WARNING: {accounts.warning()}", flush=True)


# -- users ----------------------------------------------------------------------------------------
def _users_path(args: argparse.Namespace) -> Path:
    if args.users:
        return Path(args.users)
    return config.ensure_data_dir(Path(args.data_dir) if args.data_dir else config.default_data_dir()) / "users.json"


def _cmd_users(args: argparse.Namespace) -> int:
    from .auth import add_token, load_users, remove_user

    if args.action != "list" and not args.name:
        print(f"nbmpi users {args.action}: name the user, e.g. nbmpi users {args.action} alice", file=sys.stderr)
        return 2
    path = _users_path(args)
    try:
        if args.action == "add":
            token = add_token(path, args.name)
            print(f"nbmpi users: new token of {args.name} (shown only now; {path} keeps only its hash):",
                  file=sys.stderr)
            print(token, flush=True)
        elif args.action == "remove":
            n = remove_user(path, args.name)
            print(f"nbmpi users: removed {n} token(s) of {args.name} from {path}")
            return 0 if n else 1
        else:
            users = load_users(path) if path.exists() else {}
            for name in sorted(set(users.values())):
                print(f"{name}\t{sum(1 for u in users.values() if u == name)} token(s)")
    except (ValueError, OSError) as exc:
        print(f"nbmpi users: {exc}", file=sys.stderr)
        return 2
    return 0


# -- client commands ----------------------------------------------------------------------------
def _fmt_time(t: Optional[float]) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) if t else "-"


def _cmd_submit(args: argparse.Namespace) -> int:
    from .client import ApiError

    from nbmpi.workers.launch.cli import check_syntax

    path = Path(args.script)
    if args.n is not None and args.n < 1:
        return _submit_usage(f"-n must be at least 1 (the number of MPI ranks), got {args.n}; nothing was submitted")
    if args.timeout is not None and not args.timeout > 0:
        return _submit_usage(f"--timeout must be a positive number of seconds, got {args.timeout:g}; "
                      "nothing was submitted")
    try:
        code = path.read_text()
    except OSError as exc:
        return _fail(f"cannot read {path}: {exc.strerror or exc}; nothing was submitted")
    why = check_syntax(code, str(path))
    if why is not None:
        return _submit_usage(f"{why.replace('nothing was started', 'nothing was submitted')}")
    env = {}
    for item in args.env or []:
        if "=" not in item:
            return _fail(f"--env expects NAME=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        env[k] = v
    import shlex

    try:
        prog_args = shlex.split(args.args)
    except ValueError as exc:
        return _fail(f"--args: {exc}")
    try:
        with _client(args) as c:
            job = c.submit(code, ranks=args.n, script_name=path.name if path.suffix == ".py" else "job.py",
                           pool=args.pool, timeout=args.timeout, args=prog_args, env=env, name=args.name,
                           idempotency_key=args.idempotency_key)
            print(job["id"], flush=True)
            if not args.wait:
                return 0
            try:
                job = c.wait(job["id"])
            except KeyboardInterrupt:
                return _interrupted_wait(c, job["id"], args.cancel_on_interrupt)
    except ApiError as exc:
        return _fail(exc)
    print(f"nbmpi: job {job['id']} {job['state']}" + (f": {job['message']}" if job.get("message") else ""),
          file=sys.stderr)
    if job["state"] == "succeeded":
        return 0
    return job["exit_code"] if job.get("exit_code") else 1


def _interrupted_wait(c, job_id: int, cancel: bool) -> int:
    """Ctrl-C while ``submit --wait`` follows job ``job_id``: cancel it (``cancel``) or say it keeps running
    and how to cancel it. Returns 130."""
    from .client import ApiError

    if not cancel:
        print(f"\nnbmpi: stopped following job {job_id}; it is still running on the controller (cancel it "
              f"with `nbmpi cancel {job_id}`; `submit --wait --cancel-on-interrupt` cancels on Ctrl-C)",
              file=sys.stderr)
        return 130
    try:
        r = c.cancel(job_id)
    except ApiError as exc:
        print(f"\nnbmpi: interrupted; cancelling job {job_id} failed: {exc} (try `nbmpi cancel {job_id}`)",
              file=sys.stderr)
        return 130
    print(f"\nnbmpi: interrupted; job {job_id} cancelled ({r['state']})", file=sys.stderr)
    return 130


def _submit_usage(why: str) -> int:
    print(f"nbmpi submit: {why}", file=sys.stderr)
    return 2


def _listing(args: argparse.Namespace, fetch, header: str, row) -> int:
    """Print the records ``fetch(client)`` returns: as JSON with ``--json``, else ``header`` and ``row(r)``."""
    from .client import ApiError

    try:
        with _client(args) as c:
            records = fetch(c)
    except ApiError as exc:
        return _fail(exc)
    if args.json:
        print(json.dumps(records, indent=2))
        return 0
    print(header)
    for r in records:
        print(row(r))
    return 0


def _cmd_jobs(args: argparse.Namespace) -> int:
    return _listing(
        args, lambda c: c.jobs(args.state),
        f"{'ID':>5}  {'STATE':<10} {'RANKS':>5} {'POOL':>4} {'EXIT':>4}  {'CREATED':<8} {'FINISHED':<8} "
        f"{'NAME':<16} SCRIPT",
        lambda j: (f"{j['id']:>5}  {j['state']:<10} {j['ranks']:>5} {j['pool'] or '-':>4} "
                   f"{'-' if j['exit_code'] is None else j['exit_code']:>4}  {_fmt_time(j['created_at']):<8} "
                   f"{_fmt_time(j['finished_at']):<8} {(j.get('name') or '-'):<16} {j['script_name']}"))


def _cmd_logs(args: argparse.Namespace) -> int:
    from .client import ApiError

    stream = "stderr" if args.stderr else "stdout"
    out = sys.stdout.buffer
    try:
        with _client(args) as c:
            offset = c.stream_log(args.id, args.rank, stream, out)   # the whole log, in pieces
            while args.follow:
                job = c.job(args.id)
                offset = c.stream_log(args.id, args.rank, stream, out, offset)
                if job["state"] not in ("queued", "running"):
                    break
                time.sleep(0.5)
    except ApiError as exc:
        return _fail(exc)
    except BrokenPipeError:   # `nbmpi logs ID | head`
        return 0
    return 0


def _cmd_cancel(args: argparse.Namespace) -> int:
    from .client import ApiError

    try:
        with _client(args) as c:
            r = c.cancel(args.id)
    except ApiError as exc:
        return _fail(exc)
    print(f"job {r['id']}: {r['state']}")
    return 0


def _cmd_pools(args: argparse.Namespace) -> int:
    return _listing(
        args, lambda c: c.pools(),
        f"{'ID':>4}  {'NAME':<16} {'STATE':<9} {'TARGET':<8} {'RANKS':>5}  CREATED",
        lambda p: (f"{p['id']:>4}  {(p['name'] or '-'):<16} {p['state']:<9} {p['target']:<8} {p['ranks']:>5}  "
                   f"{_fmt_time(p['created_at'])}"))


def _cmd_pool(args: argparse.Namespace) -> int:
    from .client import ApiError

    try:
        with _client(args) as c:
            if args.action == "start":
                if args.n < 1:
                    print(f"nbmpi pool start: -n must be at least 1 (the number of ranks), got {args.n}",
                          file=sys.stderr)
                    return 2
                print(f"nbmpi: starting a pool of {args.n} ranks (blocks until it runs)...", file=sys.stderr,
                      flush=True)
                p = c.create_pool(args.n, name=args.name, idle_timeout=args.idle_timeout)
                print(f"pool {p['id']}: {p['state']}, {p['ranks']} ranks; run a job on it with "
                      f"`nbmpi submit SCRIPT --pool {p['id']}`; stop it with `nbmpi pool stop {p['id']}`")
            else:
                p = c.delete_pool(args.id)
                print(f"pool {p['id']}: {p['state']}" + (f" ({p['message']})" if p.get("message") else ""))
    except ApiError as exc:
        return _fail(exc)
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import main as demo_main

    return demo_main(data_dir=args.data_dir, ranks=args.n, keep=args.keep)


def build_parser() -> argparse.ArgumentParser:
    """The parser of the ``nbmpi`` command: ``run`` and the controller's subcommands."""
    from nbmpi.workers.launch.cli import add_run_command
    from nbmpi.workers.launch.cluster_cli import add_cluster_command

    p = argparse.ArgumentParser(prog="nbmpi", description="nbmpi: interactive distributed computing on MPI.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    add_run_command(sub)
    add_cluster_command(sub)
    register(sub)
    return p


def main(argv=None) -> int:
    """Entry point of the ``nbmpi`` console script."""
    from nbmpi.workers.launch.cli import dispatch

    return dispatch(build_parser(), argv)


def register(sub) -> None:
    """Add the controller's subcommands to the ``nbmpi`` argparse subparsers ``sub``."""
    _register_serve(sub)
    _register_client_commands(sub)


def _register_serve(sub) -> None:
    """Add ``serve`` (the controller service, its backends' options) to the subparsers ``sub``."""
    s = sub.add_parser("serve", help="run the nbmpi controller (pools and jobs over HTTP)",
                       description="Run the controller service. Binds to 127.0.0.1 unless --host says otherwise.")
    s.add_argument("--host", default=config.DEFAULT_HOST)
    s.add_argument("--port", type=int, default=config.DEFAULT_PORT, help="0 picks a free port")
    s.add_argument("--max-ranks", type=int, default=None, metavar="N",
                   help="ranks in use at most (running jobs + pools); default: number of CPUs with the "
                        "local backend; with slurm the most ranks one job or pool may ask for (default: "
                        "no limit, Slurm decides)")
    s.add_argument("--data-dir", default=None, metavar="DIR",
                   help=f"state directory (default ${config.DATA_DIR_ENV} or ~/.local/share/nbmpi)")
    s.add_argument("--db", default=None, metavar="PATH", help="SQLite file (default DATA_DIR/nbmpi.db)")
    s.add_argument("--users", default=None, metavar="FILE",
                   help="users file mapping token hashes to user names (default DATA_DIR/users.json)")
    s.add_argument("--unsafe-shared-account", action="store_true", help="serve several users in this service's own "
                   "account (their jobs can read each other's files); else each needs an account, the service root")
    s.add_argument("--no-pools", action="store_true", help="disable the pool endpoints")
    s.add_argument("--max-log-bytes", type=_size, default=_size(DEFAULT_MAX_LOG), metavar="SIZE",
                   help=f"output kept per rank and stream of a job (e.g. 512M, 2G; 0: no limit; default "
                        f"{DEFAULT_MAX_LOG}); past it the log shows a truncation line")
    s.add_argument("--backend", default="local", choices=sorted(BACKENDS),
                   help="where jobs and pools run (default local: mpiexec on this host; slurm: sbatch "
                        "jobs and Slurm allocations for pools, see deploy/slurm/)")
    lo = s.add_argument_group("local backend", "options of --backend local (the default)")
    lo.add_argument("--hosts", default=None, metavar="H1,H2[:N],...",
                    help="run every job's ranks and every pool's engines on these hosts, filled in order as mpiexec "
                         "-hosts does (ssh, or $NBMPI_LAUNCHER_EXEC; the data directory must be shared with "
                         "them); users cannot name other hosts")
    lo.add_argument("--hostfile", default=None, metavar="FILE",
                    help="as --hosts, with the hosts in FILE (one host[:N] a line)")
    sl = s.add_argument_group("slurm backend", "options of --backend slurm (the data directory must be on a "
                                                "filesystem the cluster's nodes share)")
    sl.add_argument("--slurm-partition", default=None, metavar="NAME",
                    help="partition for jobs and pools (checked at start; default: the cluster's default)")
    sl.add_argument("--slurm-sbatch-arg", action="append", default=None, metavar="ARG",
                    help="extra sbatch argument for every job and pool, repeatable, e.g. "
                         "--slurm-sbatch-arg=--account=myproject")
    sl.add_argument("--slurm-poll-interval", type=float, default=None, metavar="SECONDS",
                    help="seconds one squeue answer is reused for all jobs (default 1)")
    sl.add_argument("--slurm-mpi", default=None, metavar="TYPE",
                    help="srun --mpi plugin (default pmi2, which the bundled MPICH speaks; pmix for some site MPIs)")
    sl.add_argument("--slurm-pool-ip", default=None, metavar="ADDR",
                    help="address a pool's ipyparallel controller listens on in its allocation (default *: "
                         "engines and this service connect to the node's NodeAddr)")
    s.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    s.set_defaults(func=_cmd_serve)

    u = sub.add_parser("users", help="add, list or remove users of the controller (their token hashes)",
                       description="Manage the users file: `add NAME` prints a new token once and stores only its "
                                   "hash; a running service picks the change up without a restart.")
    u.add_argument("action", choices=["add", "list", "remove"])
    u.add_argument("name", nargs="?", default=None, help="user name (for add and remove)")
    u.add_argument("--data-dir", default=None, metavar="DIR",
                   help=f"state directory (default ${config.DATA_DIR_ENV} or ~/.local/share/nbmpi)")
    u.add_argument("--users", default=None, metavar="FILE", help="users file (default DATA_DIR/users.json)")
    u.set_defaults(func=_cmd_users)


def _register_client_commands(sub) -> None:
    """Add the commands that talk to a running controller (``submit``, ``jobs``, ``logs``, ``cancel``,
    ``pools``) and ``demo`` to the subparsers ``sub``."""
    p = sub.add_parser("submit", help="submit a script as a job to the controller")
    p.add_argument("script", help="the program (.py)")
    p.add_argument("-n", type=int, default=None, metavar="N", help="number of ranks (required without --pool)")
    p.add_argument("--wait", action="store_true", help="follow the job, print its output, exit with its code")
    p.add_argument("--cancel-on-interrupt", action="store_true",
                   help="with --wait: Ctrl-C cancels the job (default: it keeps running and the command says so)")
    p.add_argument("--pool", type=int, default=None, metavar="ID", help="run on this pool's ranks")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS")
    p.add_argument("--env", action="append", metavar="NAME=VALUE", help="environment variable (repeatable)")
    p.add_argument("--name", default=None)
    p.add_argument("--args", default="", metavar="'A B ...'",
                   help="arguments of the program, one shell-quoted string (split like a shell would)")
    p.add_argument("--idempotency-key", default=None, metavar="KEY",
                   help="sent as Idempotency-Key (default: a fresh UUID; lost connections are retried with it): "
                        "submitting again with the same KEY returns the first job instead of running another")
    _add_client_options(p)
    p.set_defaults(func=_cmd_submit)

    j = sub.add_parser("jobs", help="list your jobs")
    j.add_argument("--state", default=None,
                   choices=["queued", "running", "succeeded", "failed", "cancelled", "timed_out", "lost"])
    j.add_argument("--json", action="store_true")
    _add_client_options(j)
    j.set_defaults(func=_cmd_jobs)

    lg = sub.add_parser("logs", help="print a job's output of one rank")
    lg.add_argument("id", type=int)
    lg.add_argument("--rank", type=int, default=0)
    lg.add_argument("--stderr", action="store_true", help="stderr instead of stdout")
    lg.add_argument("-f", "--follow", action="store_true", help="keep printing new output until the job ends")
    _add_client_options(lg)
    lg.set_defaults(func=_cmd_logs)

    c = sub.add_parser("cancel", help="cancel a job (all its ranks end)")
    c.add_argument("id", type=int)
    _add_client_options(c)
    c.set_defaults(func=_cmd_cancel)

    pl = sub.add_parser("pools", help="list your pools")
    pl.add_argument("--json", action="store_true")
    _add_client_options(pl)
    pl.set_defaults(func=_cmd_pools)

    po = sub.add_parser("pool", help="start or stop a pool (MPI ranks kept running for jobs and notebooks)")
    pa = po.add_subparsers(dest="action", metavar="ACTION", required=True)
    ps = pa.add_parser("start", help="start a pool (blocks until it runs) and print its id")
    ps.add_argument("-n", type=int, required=True, metavar="N", help="number of ranks")
    ps.add_argument("--name", default=None)
    ps.add_argument("--idle-timeout", type=float, default=None, metavar="SECONDS",
                    help="stop the pool after this many seconds without a job")
    _add_client_options(ps)
    pst = pa.add_parser("stop", help="stop a pool (its engines end; the record stays, state stopped)")
    pst.add_argument("id", type=int)
    _add_client_options(pst)
    po.set_defaults(func=_cmd_pool)

    d = sub.add_parser("demo", help="start the service, run one example job through it, print the results")
    d.add_argument("-n", type=int, default=2, metavar="N", help="ranks of the example job (default 2)")
    d.add_argument("--data-dir", default=None, metavar="DIR", help="state directory (default: a temporary one)")
    d.add_argument("--keep", action="store_true", help="leave the controller running to open its dashboard "
                   "(its pid is printed: stop it with kill PID)")
    d.set_defaults(func=_cmd_demo)


if __name__ == "__main__":
    sys.exit(main())
