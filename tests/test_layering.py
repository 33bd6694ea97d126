"""Static checks of the runtime's structure (no MPI): imports inside ``nbmpi.workers`` run one way
(function-level imports included), and nothing outside the tracer writes the tracer's own state."""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, List, Set

from conftest import REPO

WORKERS = REPO / "workers"


def _module_name(path: Path) -> str:
    rel = path.relative_to(WORKERS).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)          # "" is the package nbmpi.workers itself


def workers_import_graph() -> Dict[str, Set[str]]:
    """Module -> modules of nbmpi.workers it imports anywhere in its body (also inside functions)."""
    files = {_module_name(p): p for p in WORKERS.rglob("*.py") if ".venv" not in p.parts}
    # compiled modules (Cython sources) import nothing of ours from Python: leaves of the graph
    compiled = {_module_name(p) for ext in ("*.pyx", "*.c") for p in WORKERS.rglob(ext)}
    graph: Dict[str, Set[str]] = {m: set() for m in list(files) + sorted(compiled)}

    def resolve(candidate: str, names: List[str]) -> Set[str]:
        out = set()
        for n in names:                      # `from pkg import mod` imports the module pkg.mod
            sub = f"{candidate}.{n}" if candidate else n
            if sub in files or sub in compiled:
                out.add(sub)
        if candidate in files and len(out) < len(names):
            out.add(candidate)
        return out

    for mod, path in files.items():
        is_pkg = path.name == "__init__.py"
        package = mod if is_pkg else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                names = [a.name for a in node.names]
                if node.level:
                    base = package.split(".") if package else []
                    base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                    target = ".".join(base + ([node.module] if node.module else []))
                elif node.module and (node.module == "nbmpi.workers" or node.module.startswith("nbmpi.workers.")):
                    target = node.module[len("nbmpi.workers."):] if node.module != "nbmpi.workers" else ""
                else:
                    continue
                graph[mod] |= resolve(target, names)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("nbmpi.workers."):
                        name = a.name[len("nbmpi.workers."):]
                        graph[mod] |= {name} if name in files or name in compiled else set()
        graph[mod].discard(mod)
    return graph


def find_cycle(graph: Dict[str, Set[str]]) -> List[str]:
    """One import cycle as a list of modules, or [] if there is none."""
    state: Dict[str, int] = {}
    stack: List[str] = []

    def visit(m: str) -> List[str]:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return []

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return []


def test_workers_imports_have_no_cycle():
    graph = workers_import_graph()
    cycle = find_cycle(graph)
    assert not cycle, "import cycle in nbmpi.workers: " + " -> ".join(c or "nbmpi.workers" for c in cycle)


def test_runtime_tracing_analysis_layering():
    """tracing.records <- tracing.analysis <- tracing.tracer <- tracing.startup, core.runtime <-
    tracing.tracer: one way only; core.switches (reading on/off variables) imports nothing."""
    g = workers_import_graph()
    assert g["tracing.records"] == set()
    assert g["core.switches"] == set()
    assert g["core.runtime"] <= {"core.switches"}
    assert g["tracing.analysis"] <= {"tracing.records"}
    assert g["tracing.tracer"] <= {"core.runtime", "core.switches", "tracing.analysis", "tracing.records"}
    assert g["tracing.startup"] <= {"core.runtime", "tracing.tracer"}
    below_startup = ("core.runtime", "tracing.tracer", "tracing.analysis", "tracing.records")
    assert not [m for m in below_startup if "tracing.startup" in g[m]]


#: Subpackage -> the subpackages it may import (the rooms of ``workers/`` and their one-way doors).
ROOMS = {
    "core": set(),
    "tracing": {"core"},
    "channels": {"core", "tracing"},
    "fused_reductions": {"core", "tracing"},
    "aggregation": {"core", "tracing"},
    "distarray": {"core", "tracing", "aggregation"},
    "launch": {"core", "tracing", "fused_reductions", "distarray"},   # distarray: DistArray <-> dask.array (dask_worker)
}


def subpackage_graph(graph: Dict[str, Set[str]]) -> Dict[str, Set[str]]:
    """Subpackage -> the other subpackages its modules import."""
    rooms: Dict[str, Set[str]] = {}
    for mod, deps in graph.items():
        room = mod.split(".")[0]
        rooms.setdefault(room, set()).update(d.split(".")[0] for d in deps if d.split(".")[0] != room)
    return rooms


def test_workers_is_cut_into_rooms_that_import_one_way():
    """Every module of ``workers/`` sits in a subpackage named for its idea, and each subpackage
    imports only the rooms below it (``ROOMS``)."""
    g = workers_import_graph()
    loose = [m for m in g if "." not in m and m not in ROOMS and m != ""]
    assert not loose, f"modules outside a subpackage of workers/: {loose}"
    rooms = subpackage_graph(g)
    bad = {r: sorted(deps - ROOMS.get(r, set())) for r, deps in rooms.items()
           if r in ROOMS and deps - ROOMS[r]}
    assert not bad, f"subpackages importing against the layering: {bad}"



def test_distarray_scheduler_knows_no_operation():
    """The distributed arrays' scheduler only orders and executes units: it reaches the operations through
    the tables of ``distarray.operations`` and imports no operation module, plan, task class or kernel;
    no operation module imports the scheduler (the scheduler before issue 24 imported all of these)."""
    g = workers_import_graph()
    sched = g["distarray.scheduler"]
    ops = sorted(m for m in g if m.startswith("distarray.operations."))
    assert {"distarray.operations.elementwise", "distarray.operations.redistribution"} <= set(ops), ops
    assert "distarray.operations" in sched
    leaked = sorted(sched & (set(ops) | {"distarray.plans", "distarray.graph", "distarray.irregular",
                                         "distarray.packing", "distarray.fused_kernels", "distarray.reductions"}))
    assert not leaked, f"distarray.scheduler imports operation internals: {leaked}"
    assert not [m for m in ops if "distarray.scheduler" in g[m]], "an operation module imports the scheduler"


def test_distarray_has_no_class_over_500_lines_and_no_function_over_80():
    too_long = []
    for path in sorted((WORKERS / "distarray").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > (500 if isinstance(node, ast.ClassDef) else 80):
                    too_long.append(f"{path.relative_to(WORKERS)}:{node.lineno} {node.name}: {n} lines")
    assert not too_long, "split these:\n" + "\n".join(too_long)

def test_the_cycle_finder_finds_a_lazy_import_cycle():
    """The check above can fail: a function-level import back into a lower layer is a cycle."""
    g = workers_import_graph()
    g["core.runtime"] = g["core.runtime"] | {"tracing.tracer"}          # what runtime.init() used to do lazily
    assert find_cycle(g), "a core.runtime -> tracing.tracer import must show as a cycle"


PRIVATE_TRACER_STATE = {"buf", "cap", "n", "dropped", "offset_ns", "offset_err_ns", "max_events", "_next_chan",
                        "_lock", "pend", "site1", "site2", "t0_1", "t1_1", "t0_2", "t1_2", "comm", "rank", "size"}


_TRACER_EXPR = re.compile(r"^([\w.]+\.)?(get_tracer\(\)|_TRACER|tracer|Tracer\(.*\))$")


def tracer_state_writes(root: Path, skip: Path) -> List[str]:
    """Assignments to a tracer-state attribute of a tracer object (``get_tracer()``, ``_TRACER``,
    or a name bound to one) anywhere under ``root`` except ``skip``."""
    found = set()
    for path in sorted(root.rglob("*.py")):
        if path == skip or ".venv" in path.parts:
            continue
        tree = ast.parse(path.read_text(), str(path))
        for fn in [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            tracer_names = {"_TRACER"}
            for node in ast.walk(fn):        # plain names bound to a tracer in this scope
                if isinstance(node, ast.Assign) and _TRACER_EXPR.match(ast.unparse(node.value)):
                    tracer_names.update(t.id for t in node.targets if isinstance(t, ast.Name))
            for node in ast.walk(fn):
                targets = (node.targets if isinstance(node, ast.Assign) else [node.target]
                           if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else
                           node.targets if isinstance(node, ast.Delete) else [])
                for t in targets:
                    for e in ast.walk(t):
                        if isinstance(e, ast.Attribute) and e.attr in PRIVATE_TRACER_STATE:
                            base = ast.unparse(e.value)
                            if base in tracer_names or base.endswith("get_tracer()") or base.endswith("_TRACER"):
                                found.add(f"{path.relative_to(root.parent)}:{e.lineno}: {ast.unparse(e)}")
    return sorted(found)


def test_nothing_outside_the_tracer_writes_its_state():
    """Components record only through Tracer.record (issue 17 point 5)."""
    offenders = []
    for folder in ("workers", "kernel_ext", "server"):
        offenders += tracer_state_writes(REPO / folder, WORKERS / "tracing" / "tracer.py")
    assert not offenders, "writes to the tracer's state outside tracing/tracer.py:\n" + "\n".join(offenders)


def test_the_state_write_check_sees_the_old_inline_hot_path(tmp_path):
    """The check above can fail: the put path that used to defer records inline is caught."""
    bad = tmp_path / "old_channels.py"
    bad.write_text("from . import tracing as _tracing\n"
                   "def put(site, t0, t1):\n"
                   "    tr = _tracing._TRACER\n"
                   "    if tr.pend == 0:\n"
                   "        tr.site1, tr.t0_1, tr.t1_1, tr.pend = site, t0, t1, 1\n"
                   "    _tracing.get_tracer().n += 1\n")
    found = tracer_state_writes(tmp_path, tmp_path / "tracing.py")
    assert len(found) == 5, found


def _imports_of(path: Path) -> Set[str]:
    """Absolute module names ``path`` imports (relative imports resolved inside the nbmpi namespace)."""
    folder = {"workers": "nbmpi.workers", "server": "nbmpi.server", "kernel_ext": "nbmpi.kernel_ext"}
    rel = path.relative_to(REPO).with_suffix("")
    parts = [folder[rel.parts[0]], *rel.parts[1:]]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    package = ".".join(parts if path.name == "__init__.py" else parts[:-1])
    found: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                found.add(".".join(base + ([node.module] if node.module else [])))
            elif node.module:
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def test_packages_import_one_way():
    """kernel_ext and server may import workers; workers imports neither; server never imports
    kernel_ext (imports inside functions count too)."""
    forbidden = {"workers": ("nbmpi.server", "nbmpi.kernel_ext"), "server": ("nbmpi.kernel_ext",)}
    bad = []
    for folder, prefixes in forbidden.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            if ".venv" in path.parts:
                continue
            for mod in _imports_of(path):
                if mod.startswith(prefixes):
                    bad.append(f"{path.relative_to(REPO)} imports {mod}")
    assert not bad, "imports against the layering:\n" + "\n".join(bad)
