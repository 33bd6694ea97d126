"""What each rank runs under ``nbmpi run``: start the runtime, run the user's
program like ``python`` would (script path, ``-m module`` or ``-c code``),
report this rank's exit code to the launcher's status directory.

Not called by users directly: ``nbmpi run -n N script.py`` does it.
"""
from __future__ import annotations

import os
import runpy
import sys
import traceback


def _report(code: int) -> None:
    status_dir = os.environ.get("NBMPI_STATUS_DIR")
    if not status_dir:
        return
    from .runtime import world

    rank = world().Get_rank()
    tmp = os.path.join(status_dir, f".rank-{rank}.tmp")
    with open(tmp, "w") as f:
        f.write(str(code))
    os.replace(tmp, os.path.join(status_dir, f"rank-{rank}.exit"))


def main(argv=None) -> int:
    """Run one rank. Returns (and exits with) the program's exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("usage: python -m nbmpi.workers.rank_entry (script.py | -m module | -c code) [args]",
              file=sys.stderr)
        return 2
    from .runtime import init

    init()
    code = 0
    try:
        if argv[0] == "-m":
            sys.argv = argv[1:]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        elif argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})  # noqa: S102
        else:
            sys.argv = argv
            sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        c = exc.code
        code = 0 if c is None else (c if isinstance(c, int) else 1)
        if not isinstance(c, (int, type(None))):
            print(c, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - report every failure as this rank's exit code
        from .runtime import world

        sys.stderr.write(f"[rank {world().Get_rank()}] ")
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    _report(code)
    return code


if __name__ == "__main__":
    rc = main()
    if rc != 0:
        # A failed rank must not wait in MPI_Finalize for ranks that may be
        # blocked on it; the launcher ends the rest of the job.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    sys.exit(0)
