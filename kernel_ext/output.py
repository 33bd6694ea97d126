"""Per-rank output of a ``%%distributed`` cell: grouping, labels, errors.

Pure functions and plain classes (no IPython, no ipyparallel), so they are
tested without a pool:

* :func:`format_ranks` / :func:`rank_label`: ``[0, 1, 2, 3]`` -> ``"0-3"`` ->
  ``"[ranks 0-3]"``; ``[2]`` -> ``"[rank 2]"``.
* :func:`group_identical`: ranks whose text is identical form one group,
  groups ordered by their first rank; empty texts are dropped.
* :func:`render_groups`: one labelled block per group (label on its own line
  when the text spans several lines).
* :func:`render_live`: the view shown while a cell runs: every rank's lines
  so far, each prefixed with its rank, in rank order.
* :class:`DistributedCellError` / :class:`DistributedTimeout` /
  :class:`DistributedInterrupt`: what a failed, hung or interrupted cell
  raises in the notebook. IPython shows their ``_render_traceback_`` (the
  remote tracebacks, deduplicated, and one line per other rank) instead of
  the magic's own frames; the cell still fails like any failed cell.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from nbmpi.workers.launch.pool_runner import describe_state  # noqa: F401 - one wording for notebook and controller

Group = Tuple[List[int], str]


def format_ranks(ranks: Iterable[int]) -> str:
    """Compact text of a set of ranks: ``[0,1,2,5,7,8]`` -> ``"0-2,5,7-8"``."""
    rs = sorted(set(int(r) for r in ranks))
    parts: List[str] = []
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        parts.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ",".join(parts)


def rank_label(ranks: Sequence[int]) -> str:
    """``"[rank 3]"`` for one rank, ``"[ranks 0-3]"`` for several."""
    return f"[rank {ranks[0]}]" if len(ranks) == 1 else f"[ranks {format_ranks(ranks)}]"


def group_identical(per_rank: Mapping[int, Optional[str]]) -> List[Group]:
    """Group ranks with identical, non-empty text; groups in order of their first rank."""
    groups: Dict[str, List[int]] = {}
    for r in sorted(per_rank):
        text = per_rank[r]
        if text:
            groups.setdefault(text, []).append(r)
    return sorted(((ranks, text) for text, ranks in groups.items()), key=lambda g: g[0][0])


def render_block(ranks: Sequence[int], text: str, sep: str = " ") -> str:
    """One labelled block: ``"[ranks 0-1] text"``; label on its own line for multi-line text."""
    label = rank_label(ranks)
    body = text if text.endswith("\n") else text + "\n"
    if body.count("\n") > 1:
        return f"{label}\n{body}"
    return f"{label}{sep}{body}"


def render_groups(per_rank: Mapping[int, Optional[str]], sep: str = " ") -> str:
    """All groups of :func:`group_identical`, each as :func:`render_block`."""
    return "".join(render_block(rs, t, sep) for rs, t in group_identical(per_rank))


def render_live(per_rank: Mapping[int, str], max_lines: int = 200) -> str:
    """Output so far while a cell runs: each rank's lines prefixed ``[rank r]``, rank order.

    Keeps the last ``max_lines`` lines of each rank.
    """
    out: List[str] = []
    for r in sorted(per_rank):
        lines = per_rank[r].splitlines()
        if len(lines) > max_lines:
            out.append(f"[rank {r}] ... {len(lines) - max_lines} earlier lines")
            lines = lines[-max_lines:]
        out.extend(f"[rank {r}] {line}" for line in lines)
    return "\n".join(out)


def strip_ansi(text: str) -> str:
    """Remove terminal colour codes (for comparisons and plain-text reports)."""
    import re

    return re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)


class _RenderedError(Exception):
    """Base: an error whose notebook rendering is the given text lines (no local frames)."""

    def __init__(self, summary: str, lines: Sequence[str]):
        super().__init__(summary)
        self.summary = summary
        self.lines = list(lines)

    def _render_traceback_(self) -> List[str]:
        return [*self.lines, f"{type(self).__name__}: {self.summary}"]

    def __str__(self) -> str:
        return self.summary + "\n" + "\n".join(strip_ansi(line) for line in self.lines)


#: IPython's text for a traceback frame without readable source.
NO_SOURCE = "Could not get source, probably due dynamically evaluated source code."


class DistributedCellError(_RenderedError):
    """A ``%%distributed`` cell raised on one or more ranks.

    ``errors``: rank -> (ename, evalue, traceback text); ``others``: rank ->
    one line saying what the rank did instead.
    """

    def __init__(self, errors: Mapping[int, Tuple[str, str, str]], others: Mapping[int, str]):
        self.errors = dict(errors)
        self.others = dict(others)
        lines: List[str] = []
        import re

        # IPython writes this line under every frame whose source it cannot read (compiled or
        # dynamically evaluated code): five such frames, five copies. The frame's header stays.
        self.errors = {r: (n, v, "\n".join(line for line in tb.split("\n") if NO_SOURCE not in line))
                       for r, (n, v, tb) in self.errors.items()}
        # ranks run different numbers of cells (--ranks), so "In[7]" may differ: ignore it when grouping
        norm = {r: re.sub(r"In\[\d+\]", "In[ ]", tb) for r, (_, _, tb) in self.errors.items()}
        for ranks, _ in group_identical(norm):
            tb = self.errors[ranks[0]][2]
            lines.append(f"{rank_label(ranks)} remote traceback:")
            lines.extend(tb.rstrip("\n").split("\n"))
            lines.append("")
        for r in sorted(self.others):
            lines.append(f"rank {r}: {self.others[r]}")
        failing = sorted(self.errors)
        first = self.errors[failing[0]]
        summary = (f"{first[0]} on rank{'s' if len(failing) > 1 else ''} {format_ranks(failing)}"
                   f": {first[1]}")
        super().__init__(summary, lines)


class DistributedTimeout(_RenderedError):
    """A ``%%distributed`` cell exceeded ``--timeout`` and was interrupted on every rank.

    ``states``: rank -> what the rank was doing at the timeout.
    """

    def __init__(self, timeout: float, states: Mapping[int, str], note: str = ""):
        self.timeout = timeout
        self.states = dict(states)
        lines = [f"the cell exceeded --timeout {timeout:g} s; what each rank was doing then:"]
        lines += [f"  rank {r}: {self.states[r]}" for r in sorted(self.states)]
        if note:
            lines.append(note)
        waiting = [r for r in sorted(self.states) if " waiting " in self.states[r]]
        summary = f"cell timed out after {timeout:g} s"
        if waiting:
            summary += "; " + "; ".join(f"rank {r}: {self.states[r]}" for r in waiting)
        super().__init__(summary, lines)


class DistributedInterrupt(_RenderedError, KeyboardInterrupt):
    """A ``%%distributed`` cell was interrupted (kernel interrupt); every rank got SIGINT."""

    def __init__(self, states: Mapping[int, str], note: str = ""):
        self.states = dict(states)
        lines = ["interrupted; what each rank was doing then:"]
        lines += [f"  rank {r}: {self.states[r]}" for r in sorted(self.states)]
        if note:
            lines.append(note)
        super().__init__("the cell was interrupted on every rank; the pool is ready for the next cell", lines)
