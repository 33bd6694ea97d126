"""``nbmpi run``: the command-line face of the launcher (run a program SPMD on N MPI ranks).

:func:`add_run_command` adds the ``run`` subcommand to an argparse parser; the
``nbmpi`` console script (:func:`nbmpi.server.cli.main`) uses it next to the
controller's subcommands. ``python -m nbmpi.workers.launch.cli run -n 2 script.py``
works on its own, without the controller's dependencies. The launch itself is
:func:`nbmpi.workers.launch.launcher.run`.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional, Tuple


def _usage_error(args: argparse.Namespace, program: List[str]) -> Optional[str]:
    """Why ``program`` cannot be run on ``args.n`` ranks, found before any rank starts (None: it can)."""
    if args.n < 1:
        return f"-n must be at least 1 (the number of MPI ranks), got {args.n}"
    if args.hosts and args.hostfile:
        return "give the hosts either with --hosts or with --hostfile, not both"
    if args.hostfile and not os.path.isfile(args.hostfile):
        return f"--hostfile {args.hostfile!r}: no such file (one host[:slots] a line); nothing was started"
    if args.timeout is not None and not args.timeout > 0:
        return f"--timeout must be a positive number of seconds, got {args.timeout}"
    if not program:
        return "give a script to run, e.g. `nbmpi run -n 2 script.py` (or -m module, or -c code)"
    if program[0] == "-c":
        return _syntax_error(program[1], "<string>")
    if program[0] == "-m":
        import importlib.util

        try:
            found = importlib.util.find_spec(program[1]) is not None
        except (ImportError, ValueError) as exc:
            return f"cannot run module {program[1]!r}: {exc}"
        return None if found else (f"no module named {program[1]!r} (check the name and PYTHONPATH; "
                                   "nothing was started)")
    path = program[0]
    if os.path.isdir(path) or path.endswith(".zip"):
        return None if os.path.exists(path) else f"cannot run {path!r}: no such file or directory"
    try:
        with open(path, "rb") as f:
            source = f.read()
    except OSError as exc:
        return f"cannot run {path!r}: {exc.strerror or exc}; nothing was started"
    return _syntax_error(source, path)


def check_syntax(source, filename: str) -> Optional[str]:
    """Why ``source`` (str or bytes) cannot run: ``"FILE, line N: MESSAGE (nothing was started)"``, or None.
    Compiles only (nothing runs); used by ``nbmpi run`` and ``nbmpi submit`` before anything starts."""
    return _syntax_error(source, filename)


def _syntax_error(source, filename: str) -> Optional[str]:
    try:
        compile(source, filename, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return f"{filename}, line {exc.lineno}: {exc.msg} (nothing was started)"
    except ValueError as exc:  # NUL bytes
        return f"{filename}: {exc} (nothing was started)"
    return None


def _cmd_run(args: argparse.Namespace) -> int:
    from .launcher import run

    program = list(args.program)
    if args.code is not None:
        program = ["-c", args.code, *program]
    elif args.module is not None:
        program = ["-m", args.module, *program]
    why = _usage_error(args, program)
    if why is not None:
        print(f"nbmpi run: {why}", file=sys.stderr)
        return 2
    hosts = [h for h in args.hosts.split(",") if h] if args.hosts else None
    return run(args.n, program, timeout=args.timeout, hosts=hosts, hostfile=args.hostfile)


def add_run_command(sub) -> argparse.ArgumentParser:
    """Add ``run`` to the argparse subparsers ``sub``; returns its parser."""
    r = sub.add_parser("run", help="run a Python program SPMD on N MPI ranks",
                       description="Run a Python program on N MPI ranks with the bundled mpiexec. "
                                   "Returns the worst rank's exit code; if one rank fails or on Ctrl-C "
                                   "the whole process group is terminated (no orphan ranks).")
    r.add_argument("-n", type=int, default=2, metavar="N", help="number of ranks (default 2)")
    r.add_argument("--hosts", metavar="H1,H2,...", default=None,
                   help="place the ranks on these hosts in order, one slot each (`host:N`: N slots), as "
                        "`mpiexec -hosts` does; started over ssh, or $NBMPI_LAUNCHER_EXEC (a virtual "
                        "cluster's stand-in: `nbmpi cluster`)")
    r.add_argument("--hostfile", metavar="FILE", default=None,
                   help="like --hosts, one host[:N] a line (mpiexec -f)")
    r.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="terminate all ranks after this many seconds (exit code 124)")
    # -c/-m are options here: argparse's REMAINDER does not accept a leading "-c"/"-m"
    form = r.add_mutually_exclusive_group()
    form.add_argument("-c", dest="code", metavar="CODE", help="run CODE (like python -c) on every rank")
    form.add_argument("-m", dest="module", metavar="MODULE", help="run MODULE (like python -m) on every rank")
    r.add_argument("program", nargs=argparse.REMAINDER,
                   help="script.py [args], or -m module [args], or -c code [args]")
    r.set_defaults(func=_cmd_run)
    return r


def build_parser() -> argparse.ArgumentParser:
    """A parser with only ``run`` (the full ``nbmpi`` parser is :func:`nbmpi.server.cli.build_parser`)."""
    p = argparse.ArgumentParser(prog="nbmpi", description="nbmpi: run programs SPMD on MPI ranks.")
    add_run_command(p.add_subparsers(dest="command", metavar="COMMAND"))
    return p


#: ``nbmpi run`` options that take a value (their value is never read as ``-m``/``-c``).
_RUN_VALUED = frozenset({"-n", "--hosts", "--hostfile", "--timeout"})


def split_program_args(argv: List[str]) -> Tuple[List[str], List[str]]:
    """Split ``nbmpi run ... -m MODULE ARGS...`` (or ``-c CODE ARGS...``) into what argparse parses and the
    program's own arguments ``ARGS`` (returned untouched, options included, as ``python -m`` passes them).

    argparse would read an option of the program (``-m mod --opt``) as one of ``nbmpi run``'s. Only the
    ``run`` subcommand is split, and only when ``-m``/``-c`` comes before any script name; otherwise
    ``(argv, [])``. Pure function."""
    command = next((i for i, tok in enumerate(argv) if not tok.startswith("-")), None)
    if command is None or argv[command] != "run":
        return argv, []
    i = command + 1
    while i < len(argv):
        tok = argv[i]
        if tok in ("-m", "-c"):
            return argv[:i + 2], argv[i + 2:]
        if tok.startswith(("-m", "-c")) and not tok.startswith("--"):  # -mmodule, -cCODE
            return argv[:i + 1], argv[i + 1:]
        if tok == "--" or not tok.startswith("-"):
            break  # a script: argparse's REMAINDER keeps its arguments
        i += 2 if tok in _RUN_VALUED else 1
    return argv, []


def dispatch(parser: argparse.ArgumentParser, argv: Optional[List[str]] = None) -> int:
    """Parse ``argv`` with ``parser`` and run the chosen subcommand; its exit code (2 and the help
    when no subcommand was given)."""
    head, program_args = split_program_args(sys.argv[1:] if argv is None else list(argv))
    args = parser.parse_args(head)
    if program_args:
        args.program = [*getattr(args, "program", []), *program_args]
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``python -m nbmpi.workers.launch.cli``."""
    return dispatch(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
