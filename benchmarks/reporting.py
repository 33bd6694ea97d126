"""Shared output of every nbmpi benchmark: one JSON file and one markdown table
under ``benchmarks/results/``, plus machine facts so numbers are never quoted
without their context: the date, the git commit of the measured code (and
whether it had uncommitted changes) and the load average.

Use: ``write_results("pingpong", data, md_text)``; build tables with
:func:`md_table`; check targets with :func:`target` (PASS/FAIL computed from
the measured numbers, never typed in). Every benchmark's command line starts
from :func:`benchmark_parser` (``--quick`` and ``--out-dir``, the same in all).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

RESULTS = Path(__file__).resolve().parent / "results"
REPO = RESULTS.parent.parent


def code_version() -> Dict[str, Any]:
    """The git commit the benchmark measures: ``commit`` (full hash), ``commit_short``, ``dirty``
    (uncommitted changes to the code, results files excluded). Empty values outside a git checkout."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                                  timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)benchmarks/results")
    return dict(commit=commit, commit_short=commit[:10], dirty=bool(status))


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def benchmark_parser(doc: str, quick_help: str) -> argparse.ArgumentParser:
    """The command line every benchmark shares: its description is the first paragraph of ``doc``
    (the module docstring); ``--quick`` (a smoke-test run, described by ``quick_help``) and
    ``--out-dir`` (default ``benchmarks/results``). The caller adds its own options.

    It also makes SIGTERM end the benchmark like Ctrl-C does: the signal raises ``SystemExit(143)``, so the
    ``finally`` blocks run and a benchmark stopped by ``kill`` or a CI timeout stops the controllers,
    pools and clusters it started instead of leaving them running."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help=quick_help)
    p.add_argument("--out-dir", default=None, metavar="DIR",
                   help="where to write the JSON/markdown (default benchmarks/results)")
    return p


def machine() -> Dict[str, Any]:
    """Facts about the machine and software the numbers were measured on."""
    info: Dict[str, Any] = dict(
        date=time.strftime("%Y-%m-%d %H:%M:%S"), python=sys.version.split()[0],
        platform=platform.platform(), cpus=os.cpu_count(),
    )
    try:
        info["loadavg"] = os.getloadavg()
    except OSError:
        pass
    info.update(code_version())
    for mod in ("numpy", "numba", "mpi4py"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            pass
    return info


def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table."""
    def cell(v: Any) -> str:
        if isinstance(v, float):
            if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
                return f"{v:.3g}"
            return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def target(name: str, measured: float, limit: float, higher_is_better: bool = True) -> Dict[str, Any]:
    """A 'must reach' check: PASS if ``measured`` is on the right side of ``limit``."""
    ok = measured >= limit if higher_is_better else measured <= limit
    return dict(target=name, measured=measured, limit=limit,
                direction=">=" if higher_is_better else "<=", status="PASS" if ok else "FAIL")


def targets_table(targets: List[Dict[str, Any]]) -> str:
    """Markdown table of target checks."""
    return md_table(["target", "measured", "limit", "status"],
                    [[t["target"], t["measured"], f"{t['direction']} {t['limit']}", t["status"]] for t in targets])


def write_results(name: str, data: Dict[str, Any], markdown: str, out_dir: Optional[Path] = None) -> Path:
    """Write ``NAME.json`` (data + machine facts) and ``NAME.md``; return the JSON path."""
    out = Path(out_dir) if out_dir else RESULTS
    out.mkdir(parents=True, exist_ok=True)
    data = dict(data)
    data.setdefault("machine", machine())
    (out / f"{name}.json").write_text(json.dumps(data, indent=2, default=float))
    mach = data["machine"]
    at = f" at commit `{mach['commit_short']}`{' with uncommitted changes' if mach.get('dirty') else ''}" \
        if mach.get("commit_short") else ""
    load = mach.get("loadavg")
    load_s = ", ".join(f"{x:.2f}" for x in load) if load else "n/a"
    header = f"# {name}\n\nMeasured {mach['date']}{at} on {mach['cpus']} CPUs (load average {load_s}).\n\n"
    (out / f"{name}.md").write_text(header + markdown + "\n")
    return out / f"{name}.json"
