"""Where a rank's main thread is right now: its user-code line and the MPI call on it, read from another thread.

A rank blocked in a raw mpi4py call (``comm.Recv(buf, source=1)``) sits in C
with the GIL released, so a helper thread of the same process (the pool's
state probe, :mod:`nbmpi.workers.launch.engine_side`) can read the main thread's
Python stack with :func:`sys._current_frames`. :func:`main_thread_location`
returns the innermost frames of user code (cells, scripts; not nbmpi,
IPython, ipyparallel or the standard library) and, when the current line
calls an mpi4py communication method, which call and which peer
(:func:`describe_mpi_call`: the peer argument is evaluated only when it is a
literal or a simple arithmetic of names visible in that frame, never by
calling anything).

For waits inside nbmpi's own calls, :data:`nbmpi.workers.core.waiting.current`
already names the operation and the peer; this module covers everything else.
Read-only and safe to call from any thread at any time.

Ranks under the launcher (``nbmpi run``) answer the question from outside
through files: each rank runs :func:`answer_where_requests` (a daemon thread),
and the launcher, before it ends a launch on purpose (``--timeout``, Ctrl-C),
calls :func:`request_locations` and prints :func:`describe_snapshot` per rank.
"""
from __future__ import annotations

import ast
import linecache
import os
import sys
import threading
from typing import Any, Dict, List, Optional

#: mpi4py methods -> (kind, name of the peer argument, its position among the positional args).
#: kind: "recv" (peer is a source), "send" (a destination), "root" (a collective's root),
#: "collective" (every rank of the communicator), "request" (completion of earlier calls).
MPI_CALLS: Dict[str, tuple] = {
    **{m: ("recv", "source", 1) for m in ("Recv", "recv", "Mrecv", "Probe", "probe", "Mprobe", "mprobe")},
    **{m: ("send", "dest", 1) for m in ("Send", "send", "Ssend", "ssend", "Bsend", "bsend", "Rsend")},
    **{m: ("sendrecv", "dest", 1) for m in ("Sendrecv", "sendrecv", "Sendrecv_replace")},
    **{m: ("root", "root", 1) for m in ("Bcast", "bcast", "Reduce", "reduce", "Gather", "gather", "Gatherv",
                                        "Scatter", "scatter", "Scatterv")},
    **{m: ("collective", None, None) for m in ("Barrier", "barrier", "Allreduce", "allreduce", "Allgather",
                                               "allgather", "Allgatherv", "Alltoall", "alltoall", "Alltoallv",
                                               "Alltoallw", "Reduce_scatter", "Scan", "Exscan", "Split",
                                               "Dup", "Create", "Split_type")},
    **{m: ("request", None, None) for m in ("Wait", "wait", "Waitall", "waitall", "Waitany", "waitany",
                                            "Waitsome", "Test", "Testall")},
}
_SKIP = ("nbmpi" + os.sep + "workers", os.sep + "workers" + os.sep, "IPython", "ipykernel", "ipyparallel",
         "zmq", "tornado", "asyncio", "threading.py", "runpy.py", "site-packages", os.sep + "lib" + os.sep + "python")


def _is_user_frame(filename: str) -> bool:
    if filename.startswith("<") and not filename.startswith("<ipython-input"):
        return filename in ("<string>", "<stdin>")
    if "ipykernel_" in filename:   # IPython cell files: /tmp/ipykernel_PID/HASH.py
        return True
    return not any(part in filename for part in _SKIP)


def _safe_eval(node: ast.AST, frame) -> Any:
    """Value of a literal, a name of ``frame`` or + - * // % of those; raises ValueError otherwise."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str)):
        return node.value
    if isinstance(node, ast.Name):
        for scope in (frame.f_locals, frame.f_globals):
            if node.id in scope:
                v = scope[node.id]
                if isinstance(v, (int, float)):
                    return v
                raise ValueError(node.id)
        raise ValueError(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_safe_eval(node.operand, frame)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod)):
        a, b = _safe_eval(node.left, frame), _safe_eval(node.right, frame)
        if isinstance(node.op, ast.Add):
            return a + b
        if isinstance(node.op, ast.Sub):
            return a - b
        if isinstance(node.op, ast.Mult):
            return a * b
        if isinstance(node.op, ast.FloorDiv):
            return a // b
        return a % b
    if isinstance(node, ast.Attribute) and node.attr in ("ANY_SOURCE", "ANY_TAG"):
        return "any"
    raise ValueError(ast.dump(node))


def describe_mpi_call(code: str, frame=None) -> Optional[Dict[str, Any]]:
    """The mpi4py call on source line ``code`` (``"comm.Recv(buf, source=1)"``), if any.

    Returns ``{"call": "Recv", "kind": "recv", "peer": 1 or None or "any" or the argument's
    text when it cannot be evaluated safely}``; None when the line calls no known MPI method.
    ``frame`` (optional) supplies the names the peer argument may use.
    """
    tree = None
    for text in (code.strip(), code.strip() + "\n    pass"):   # a lone line, or the head of a block
        try:
            tree = ast.parse(text)
            break
        except SyntaxError:
            continue
    if tree is None:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MPI_CALLS:
            kind, kw, pos = MPI_CALLS[node.func.attr]
            peer: Any = None
            if kw is not None:
                arg = next((k.value for k in node.keywords if k.arg == kw), None)
                if arg is None and pos is not None and len(node.args) > pos:
                    arg = node.args[pos]
                if arg is None:
                    peer = "any" if kind == "recv" else (0 if kind == "root" else None)
                else:
                    try:
                        peer = _safe_eval(arg, frame) if frame is not None else _safe_eval(arg, _NoFrame)
                    except (ValueError, ZeroDivisionError, TypeError):
                        peer = ast.unparse(arg)
            return dict(call=node.func.attr, kind=kind, peer=peer)
    return None


class _NoFrame:
    f_locals: Dict[str, Any] = {}
    f_globals: Dict[str, Any] = {}


def _describe_frame(frame) -> Dict[str, Any]:
    code = linecache.getline(frame.f_code.co_filename, frame.f_lineno, frame.f_globals).strip()
    where = dict(file=frame.f_code.co_filename, line=frame.f_lineno, function=frame.f_code.co_name, code=code)
    call = describe_mpi_call(code, frame) if code else None
    if call is not None:
        where["mpi"] = call
    return where


def main_thread_location(depth: int = 4) -> Dict[str, Any]:
    """Where the main thread is: ``{"stack": [innermost user frames, innermost last], "mpi": the MPI
    call on the innermost user line or None}``. Call it from another thread (it reads frames only)."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    frames: List[Dict[str, Any]] = []
    while frame is not None and len(frames) < depth:
        if _is_user_frame(frame.f_code.co_filename):
            frames.append(_describe_frame(frame))
        frame = frame.f_back
    frames.reverse()
    return dict(stack=frames, mpi=frames[-1].get("mpi") if frames else None)


def format_location(loc: Optional[Dict[str, Any]]) -> str:
    """One line for people: ``line 3 `comm.Recv(buf, source=1)`: MPI Recv from rank 1``."""
    if not loc or not loc.get("stack"):
        return ""
    top = loc["stack"][-1]
    fname = top["file"]
    if fname == "<string>":   # ``nbmpi run -c CODE``
        place = "-c code"
    else:
        place = "cell" if "ipykernel_" in fname or fname.startswith("<") else os.path.basename(fname)
    text = f"{place} line {top['line']}"
    if top.get("code"):
        text += f" `{top['code']}`"
    mpi = loc.get("mpi")
    if mpi:
        text += ": " + describe_call(mpi)
    return text


def describe_call(mpi: Dict[str, Any]) -> str:
    """``"MPI Recv from rank 1"``, ``"MPI Allreduce with every rank"`` ... for a :func:`describe_mpi_call` result."""
    kind, peer, call = mpi["kind"], mpi.get("peer"), mpi["call"]
    who = "any rank" if peer == "any" else (f"rank {peer}" if isinstance(peer, int) else f"rank `{peer}`")
    if kind == "recv":
        return f"MPI {call} from {who}"
    if kind in ("send", "sendrecv"):
        return f"MPI {call} to {who}"
    if kind == "root":
        return f"MPI {call} with root {who}"
    if kind == "collective":
        return f"MPI {call} with every rank of the communicator"
    return f"MPI {call} (completion of earlier requests)"


# -- asking the ranks of a launch where they are (``nbmpi run --timeout``, Ctrl-C) ----------------------
#: File the launcher creates in the status directory to ask every rank where it is.
WHERE_REQUEST = "where.request"


def snapshot_now() -> Dict[str, Any]:
    """This rank's state now, read from any thread: the nbmpi call it waits in (``op``, ``peer``,
    ``waiting_s`` from :data:`nbmpi.workers.core.waiting.current`) and ``where`` (the main thread's
    user-code line and the MPI call on it, :func:`main_thread_location`)."""
    import time

    from ..core import waiting

    out: Dict[str, Any] = dict(op=None, peer=None, waiting_s=0.0, where=None)
    cur = waiting.current
    if cur is not None:
        op, peer, t0 = cur
        out.update(op=str(op), peer=None if peer is None else int(peer),
                   waiting_s=(time.perf_counter_ns() - int(t0)) / 1e9)
    try:
        out["where"] = main_thread_location()
    except Exception as exc:  # noqa: BLE001 - an answer whatever happens
        out["where"] = {"stack": [], "mpi": None, "error": repr(exc)}
    return out


def answer_where_requests(status_dir: str, rank: str, poll: float = 0.2) -> threading.Thread:
    """Start a daemon thread that, once ``status_dir/where.request`` exists, writes this rank's
    :func:`snapshot_now` to ``status_dir/rank-R.where.json`` and ends.

    Called by each rank under the launcher (:mod:`nbmpi.workers.launch.rank_entry`), non-blocking.
    The thread only checks for the file every ``poll`` s (no MPI call, no signal), so it answers
    while the main thread is blocked in an MPI call that released the GIL."""
    import json

    request = os.path.join(status_dir, WHERE_REQUEST)
    target = os.path.join(status_dir, f"rank-{rank}.where.json")

    def serve() -> None:
        import time

        while not os.path.exists(request):
            time.sleep(poll)
        tmp = target + ".tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(snapshot_now(), f)
            os.replace(tmp, target)
        except OSError:
            pass

    t = threading.Thread(target=serve, name="nbmpi-where", daemon=True)
    t.start()
    return t


def request_locations(status_dir: str, ranks, timeout: float = 1.5) -> Dict[int, Optional[Dict[str, Any]]]:
    """Ask the ranks ``ranks`` of a launch where they are; block up to ``timeout`` s for their answers.

    Called by the launcher before it ends a launch on purpose (timeout, Ctrl-C). Returns rank ->
    :func:`snapshot_now` of that rank, or None for a rank that did not answer in time."""
    import json
    import time

    ranks = list(ranks)
    with open(os.path.join(status_dir, WHERE_REQUEST), "w"):
        pass
    got: Dict[int, Optional[Dict[str, Any]]] = {r: None for r in ranks}
    deadline = time.monotonic() + timeout
    while True:
        for r in ranks:
            if got[r] is None:
                try:
                    with open(os.path.join(status_dir, f"rank-{r}.where.json")) as f:
                        got[r] = json.load(f)
                except (OSError, ValueError):
                    pass
        if all(v is not None for v in got.values()) or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def describe_snapshot(snap: Optional[Dict[str, Any]]) -> str:
    """What a rank was doing, from its :func:`snapshot_now`: ``"take(src=0) waiting 3.0 s at prog.py
    line 4 `ch.take(0)`"``, ``"at prog.py line 5 `comm.Recv(buf, source=1)`: MPI Recv from rank 1"``,
    ``"running, outside user code"`` or ``"no answer (busy in C code holding the GIL, or it had ended)"``."""
    if not snap:
        return "no answer (busy in C code holding the GIL, or it had ended)"
    where = format_location(snap.get("where"))
    if snap.get("op"):
        return f"{snap['op']} waiting {snap['waiting_s']:.1f} s" + (f" at {where}" if where else "")
    return f"at {where}" if where else "running, outside user code"
