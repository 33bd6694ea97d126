"""Regenerate the README's benchmark summary from the result files (headline numbers are never typed by hand).

    python benchmarks/readme_summary.py            # rewrite the section in README.md
    python benchmarks/readme_summary.py --check    # exit 1 if README.md is not up to date

The section lies between the lines ``<!-- bench:start -->`` and
``<!-- bench:end -->`` of README.md (added at the end of the "Benchmarks"
section if missing). For every ``benchmarks/results/NAME.json`` (``*_quick``
files excluded) it lists the targets the benchmark checked (measured value,
limit, PASS/FAIL; a diagnosis without targets is named as such) with the commit, date and load average the result was
measured at. Running it twice gives the same file.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
README = HERE.parent / "README.md"
START, END = "<!-- bench:start -->", "<!-- bench:end -->"


def _num(v: Any) -> str:
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, (int, float)):
        v = float(v)
        if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
            return f"{v:.3g}"
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def _measured_at(m: Dict[str, Any]) -> str:
    commit = m.get("commit_short") or (m.get("commit") or "")[:10]
    at = f"`{commit}`{' + uncommitted changes' if m.get('dirty') else ''}" if commit else "commit not recorded"
    load = m.get("loadavg")
    load_s = "/".join(f"{x:.1f}" for x in load) if load else "n/a"
    return f"{m.get('date', 'date not recorded')}, {at}, load {load_s}"


def _capacity(run: Dict[str, Any]) -> str:
    """The machine's parallel capacity during a run (``benchmarks/parallel_capacity.py``), or ``''`` if not measured."""
    caps = [run.get(f"parallel_capacity_{w}") for w in ("start", "end")]
    if not all(caps):
        return ""
    kinds = ", ".join(f"{what} {caps[0][k + '_capacity']:.2f} / {caps[1][k + '_capacity']:.2f}"
                      for k, what in (("python", "Python loop"), ("memory", "memory-bound NumPy")))
    return ("Two processes at once did the work of this many processes alone, before / after the run (2.00: two "
            f"full cores): {kinds}.")


def summary(results: Path = RESULTS) -> str:
    """The markdown of the section (without the markers)."""
    lines: List[str] = ["Headline numbers, read from `benchmarks/results/*.json` by "
                        "`python benchmarks/readme_summary.py` (each with the commit, date and load average "
                        "it was measured at; the full tables are in the `.md` beside each file).", ""]
    for path in sorted(results.glob("*.json")):
        if path.stem.endswith("_quick"):
            continue
        data = json.loads(path.read_text())
        targets = data.get("targets") or []
        npass = sum(t.get("status") == "PASS" for t in targets)
        verdict = f"{npass}/{len(targets)} targets pass" if targets else "a diagnosis, no targets"
        lines.append(f"**{path.stem}** ({_measured_at(data.get('machine', {}))}): {verdict} "
                     f"([table](benchmarks/results/{path.stem}.md))")
        lines.append("")
        cap = _capacity(data.get("run") or {})
        if cap:
            lines += [cap, ""]
        if targets:
            lines.append("| target | measured | limit | status |")
            lines.append("|---|---|---|---|")
            for t in targets:
                lines.append(f"| {t.get('target')} | {_num(t.get('measured'))} | {t.get('direction', '')} "
                             f"{_num(t.get('limit'))} | {t.get('status')} |")
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def updated(text: str, section: str) -> str:
    """``text`` with the marked section replaced by ``section`` (markers added if missing)."""
    block = f"{START}\n{section}{END}"
    if START in text and END in text and text.index(START) < text.index(END):
        head, rest = text.split(START, 1)
        _, tail = rest.split(END, 1)
        return head + block + tail
    anchor = "\n## Benchmarks\n"
    if anchor in text:
        i = text.index(anchor) + len(anchor)
        nxt = text.find("\n## ", i)
        nxt = len(text) if nxt < 0 else nxt
        body = text[i:nxt].rstrip("\n")
        return text[:i] + body + "\n\n" + block + "\n" + text[nxt:]
    return text.rstrip("\n") + "\n\n## Benchmarks\n\n" + block + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="only check that README.md is up to date")
    p.add_argument("--readme", default=str(README), help=argparse.SUPPRESS)
    p.add_argument("--results", default=str(RESULTS), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    readme = Path(a.readme)
    old = readme.read_text()
    new = updated(old, summary(Path(a.results)))
    if a.check:
        if new != old:
            print(f"{readme} is not up to date: run python benchmarks/readme_summary.py", file=sys.stderr)
            return 1
        return 0
    if new != old:
        readme.write_text(new)
    print(f"{readme}: benchmark section {'updated' if new != old else 'already up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
