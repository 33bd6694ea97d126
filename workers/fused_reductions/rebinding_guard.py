"""Make ``x = a`` an error when ``x`` names a shared variable and ``a`` is rank-local.

CFL (C++) makes assigning a purely local value to a shared variable
an error through its assignment operator. Python has no such hook: ``x = a``
just rebinds the name, and afterwards every rank holds its own ``x``. This
module restores the rule where SPMD program text is run by nbmpi, by
rewriting the program's syntax tree before it runs:

* top-level code of ``%%distributed`` cells (an IPython AST transformer that
  :func:`install_ipython` registers on every engine of a pool);
* scripts run with ``nbmpi run`` (and controller jobs, which run the same way)
  and ``nbmpi run -c CODE`` (:func:`run_path`, :func:`compile_guarded`).

Module level: every simple assignment ``x = <expr>`` (also ``x = y =
<expr>``, ``x: T = <expr>`` and ``a, b = <expr>`` with plain names),
including inside top-level ``for``/``while``/``if``/``with``/``try`` blocks,
becomes ``x = __nbmpi_rebind__(<expr>, "x")``. At run time that call raises
:class:`~nbmpi.workers.core.errors.SharedVariableError` if ``x`` currently holds a
:class:`~nbmpi.workers.fused_reductions.SharedVar` (or pool) and the new value
is not a shared variable; otherwise it returns the value unchanged (one
Python call, a few hundred ns, per top-level assignment).

Functions: the names a function binds to shared variables it makes itself
(``x = shared(...)``, ``x = pool(...)``, also as ``nbmpi.workers.shared``,
``a, b = shared(..), shared(..)``), the names it uses as shared variables
(calls ``x.reset()``, ``x.min_with()``, ``x.max_with()``, ``x.consume()`` or
``x.assign()`` on them, e.g. a shared argument), and ``y = <arithmetic on
such a name>`` are guarded the same way: ``x = <expr>`` becomes ``try: old = x / except
NameError: old = None`` (free when ``x`` is bound) and ``x =
__nbmpi_rebind__value__(<expr>, old, "x")``. Assignments to other names in
functions are not touched, so function hot loops keep their speed.

``x = shared(...)``, ``x = y`` with ``y`` shared, ``x += a`` and every other
use are unaffected; ``del x`` releases the name.

Not covered, because Python gives no hook there without slowing every
assignment down: a name in a function that holds a shared variable it got
from elsewhere (argument, global, container) and uses only with ``+=`` and
arithmetic before rebinding it; inside functions, chained ``x = y = ...`` and
tuple targets of other values than a tuple display; ``a, b = <iterator>``
(checked only for tuples and lists); walrus ``(x := ...)``; ``for x in ...``
loop targets; class bodies and their methods, lambdas; IPython's output
cache names (``_``, ``__``, ``_3``...); ``exec`` of other code; ``nbmpi run
-m module`` and scripts that are not ``.py`` files.
``NBMPI_REBIND_GUARD=0`` turns the guard off.
"""
from __future__ import annotations

import ast
import builtins
import re
import sys
from typing import Any, Callable, Iterator, List, Optional, Tuple, Union

from ..core.switches import env_switch

HELPER = "__nbmpi_rebind__"
_getframe = sys._getframe
#: ``NBMPI_REBIND_GUARD=0`` disables the rewrite (the code then runs exactly as written).
ENV = "NBMPI_REBIND_GUARD"


def enabled() -> bool:
    """Whether the guard is on (``NBMPI_REBIND_GUARD`` unset, or not one of the off words of
    :func:`~nbmpi.workers.core.switches.env_switch`)."""
    return env_switch(ENV)


_SharedVar: Any = None


def _shared_type() -> Any:
    global _SharedVar
    from . import SharedVar

    _SharedVar = SharedVar
    return SharedVar


def _check(get: Callable[[str], Any], value: Any, names: Any) -> Any:
    SharedVar = _SharedVar or _shared_type()
    for name in ((names,) if type(names) is str else names):
        old = get(name)
        if isinstance(old, SharedVar) and not isinstance(value, SharedVar):
            raise _error(name, old, value)
    return value


def _rebind(value: Any, names: Any) -> Any:
    """Run-time check of ``names = value`` in the caller's namespace (see the module doc).
    The builtins fallback; :func:`bind` gives a namespace its own, faster one."""
    return _check(_getframe(1).f_locals.get, value, names)


def bind(ns: dict) -> None:
    """Put into ``ns`` (a module namespace the rewritten code runs in) a helper that
    checks against ``ns`` directly instead of looking up the caller's frame."""
    get = ns.get

    def rebind(value: Any, names: Any) -> Any:
        if type(names) is str:
            old = get(names)
            if isinstance(old, _SharedVar or _shared_type()) and not isinstance(value, _SharedVar):
                raise _error(names, old, value)
            return value
        return _check(get, value, names)

    ns[HELPER] = rebind
    # the other helpers too: functions defined here and pickled (cloudpickle) then refer to
    # importable module functions instead of names only this process's builtins have
    ns[HELPER + "unpack__"] = _rebind_unpack
    ns[HELPER + "value__"] = _rebind_value


def _rebind_unpack(value: Any, names: Tuple[str, ...]) -> Any:
    """Run-time check of ``a, b = value`` for a tuple or list ``value`` (each name against
    its own value); any other iterable is returned untouched and unchecked (checking
    would consume it)."""
    if type(value) is tuple or type(value) is list:
        SharedVar = _SharedVar or _shared_type()
        ns = _getframe(1).f_locals
        for name, v in zip(names, value):
            old = ns.get(name)
            if isinstance(old, SharedVar) and not isinstance(v, SharedVar):
                raise _error(name, old, v)
    return value


def _error(name: str, old: Any, value: Any) -> Exception:
    from ..core.errors import SharedVariableError
    from ..core.runtime import world

    try:
        rank = f"rank {world().Get_rank()}: "
    except Exception:  # noqa: BLE001 - MPI not usable: the message still stands
        rank = ""
    return SharedVariableError(
        f"{rank}`{name} = ...` assigns a rank-local {type(value).__name__} to {name!r}, which holds shared "
        f"variable #{old.id}; the ranks would no longer agree on {name!r}. To contribute every rank's value "
        f"write `{name} += a` (or {name}.min_with(a), {name}.max_with(a), {name} *= a); to set a value that "
        f"is the same on every rank write `{name}.reset(c)`; to keep a local copy use another name "
        f"(`v = float({name})`); to reuse the name for something else, `del {name}` first")


def _rebind_value(value: Any, old: Any, name: str) -> Any:
    """Run-time check of ``name = value`` inside a function, ``old`` being the name's
    value before (None if unbound)."""
    SharedVar = _SharedVar or _shared_type()
    if isinstance(old, SharedVar) and not isinstance(value, SharedVar):
        raise _error(name, old, value)
    return value


_MAKERS = frozenset({"shared", "pool"})
_SHARED_METHODS = frozenset({"reset", "min_with", "max_with", "consume", "assign"})
_OLD = "__nbmpi_old__"
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def _own_nodes(fn: ast.AST) -> Iterator[ast.AST]:
    """The nodes of ``fn``'s own scope (not of nested functions, lambdas or classes)."""
    todo = list(ast.iter_child_nodes(fn))
    while todo:
        n = todo.pop()
        yield n
        if not isinstance(n, _SCOPES):
            todo.extend(ast.iter_child_nodes(n))


def _pairs(node: ast.AST) -> List[Tuple[str, ast.expr]]:
    """``(name, value)`` bound by an assignment statement (plain names only)."""
    if isinstance(node, ast.AnnAssign) and node.simple and node.value is not None:
        return [(node.target.id, node.value)]   # type: ignore[union-attr]
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        t, v = node.targets[0], node.value
        if isinstance(t, ast.Name):
            return [(t.id, v)]
        if isinstance(t, (ast.Tuple, ast.List)) and isinstance(v, (ast.Tuple, ast.List)) \
                and len(t.elts) == len(v.elts) and all(isinstance(e, ast.Name) for e in t.elts):
            return [(e.id, x) for e, x in zip(t.elts, v.elts)]   # type: ignore[attr-defined]
    return []


def _makes_shared(value: ast.expr, names: set) -> bool:
    """``shared(...)`` / ``pool(...)`` (also as an attribute), a name in ``names``, or
    arithmetic whose direct operands include one of those."""
    if isinstance(value, ast.Call):
        f = value.func
        return (isinstance(f, ast.Name) and f.id in _MAKERS) or (isinstance(f, ast.Attribute)
                                                                  and f.attr in _MAKERS)
    if isinstance(value, ast.BinOp):
        return _makes_shared(value.left, names) or _makes_shared(value.right, names)
    if isinstance(value, ast.UnaryOp):
        return _makes_shared(value.operand, names)
    return isinstance(value, ast.Name) and value.id in names   # not through calls: float(x) is local


def _shared_names(fn: ast.AST) -> set:
    """Names a function binds to shared variables it makes itself or uses as shared
    variables (``x.reset()``...), closed over its assignments (``x = shared(..)``, then
    ``y = x * 2``...)."""
    nodes = list(_own_nodes(fn))
    assigns = [p for n in nodes for p in _pairs(n)]
    # names used as shared variables (e.g. an argument): a method only shared variables have
    names: set = {n.func.value.id for n in nodes   # type: ignore[attr-defined]
                  if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                  and n.func.attr in _SHARED_METHODS and isinstance(n.func.value, ast.Name)}
    grew = True
    while grew:
        grew = False
        for name, value in assigns:
            if name not in names and _makes_shared(value, names):
                names.add(name)
                grew = True
    return names


class _FunctionGuard(ast.NodeTransformer):
    """Inside one function: ``x = <expr>`` for a name in ``names`` becomes
    ``try: old = x / except NameError: old = None`` (free when ``x`` is bound),
    ``x = __nbmpi_rebind__value__(<expr>, old, "x")``."""

    def __init__(self, names: set):
        self.names = names

    def visit_FunctionDef(self, node: ast.AST) -> ast.AST:  # noqa: N802 - nested: its own names
        return _guard_function(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.AST) -> ast.AST:  # noqa: N802
        return node

    visit_Lambda = visit_ClassDef

    def _guarded(self, node: ast.stmt, name: str, value_owner: Any) -> List[ast.stmt]:
        read = ast.parse(f"try:\n    {_OLD} = {name}\nexcept NameError:\n    {_OLD} = None").body
        clear = ast.parse(f"{_OLD} = None").body
        for st in read + clear:   # all on the assignment's line (tracebacks stay right)
            for n in ast.walk(st):
                if hasattr(n, "lineno"):
                    n.lineno, n.end_lineno = node.lineno, node.end_lineno   # type: ignore[attr-defined]
                    n.col_offset, n.end_col_offset = node.col_offset, node.end_col_offset   # type: ignore
        value = value_owner.value
        call = ast.Call(func=ast.Name(id=HELPER + "value__", ctx=ast.Load()),
                        args=[value, ast.Name(id=_OLD, ctx=ast.Load()), ast.Constant(value=name)], keywords=[])
        value_owner.value = ast.fix_missing_locations(ast.copy_location(call, value))
        return read + [node] + clear

    def visit_Assign(self, node: ast.Assign) -> Any:  # noqa: N802
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and node.targets[0].id in self.names:
            return self._guarded(node, node.targets[0].id, node)
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign) -> Any:  # noqa: N802
        if node.value is not None and node.simple and node.target.id in self.names:   # type: ignore[union-attr]
            return self._guarded(node, node.target.id, node)   # type: ignore[union-attr]
        return node


def _guard_function(fn: ast.AST) -> ast.AST:
    """Guard ``fn``'s own assignments to its shared names (nested functions get their own)."""
    g = _FunctionGuard(_shared_names(fn))
    fn.body = [r for st in fn.body for r in _as_list(g.visit(st))]   # type: ignore[attr-defined]
    return fn


def _as_list(r: Any) -> list:
    return r if isinstance(r, list) else [r]


_CACHE_NAME = re.compile(r"_+\d*|_i+\d*|_o+\d*")   # IPython's output/input cache (``_``, ``__``, ``_3``...)


class RebindGuard(ast.NodeTransformer):
    """Rewrites module-level assignments to plain names, and inside functions the
    assignments to names the function binds to shared variables (see the module doc).
    Never descends into lambda or class bodies."""

    def visit_FunctionDef(self, node: ast.AST) -> ast.AST:  # noqa: N802 - ast API
        return _guard_function(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.AST) -> ast.AST:  # noqa: N802
        return node

    visit_Lambda = visit_ClassDef

    def visit_Assign(self, node: ast.Assign) -> ast.AST:  # noqa: N802
        if all(isinstance(t, ast.Name) for t in node.targets):
            names = [t.id for t in node.targets if not _CACHE_NAME.fullmatch(t.id)]
            if not names:
                return node
            node.value = self._call(HELPER, node.value, names[0] if len(names) == 1 else tuple(names))
        elif (len(node.targets) == 1 and isinstance(node.targets[0], (ast.Tuple, ast.List))
              and node.targets[0].elts and all(isinstance(e, ast.Name) for e in node.targets[0].elts)):
            names = tuple(e.id for e in node.targets[0].elts)
            if not all(_CACHE_NAME.fullmatch(n) for n in names):
                node.value = self._call(HELPER + "unpack__", node.value, names)
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST:  # noqa: N802
        if node.value is not None and node.simple and isinstance(node.target, ast.Name) \
                and not _CACHE_NAME.fullmatch(node.target.id):
            node.value = self._call(HELPER, node.value, node.target.id)
        return node

    @staticmethod
    def _call(helper: str, value: ast.expr, names: Any) -> ast.expr:
        call = ast.Call(func=ast.Name(id=helper, ctx=ast.Load()), args=[value, ast.Constant(value=names)],
                        keywords=[])
        return ast.fix_missing_locations(ast.copy_location(call, value))


def _install_helpers() -> None:
    # in builtins, so the rewritten code finds them in any namespace (also after %reset)
    setattr(builtins, HELPER, _rebind)
    setattr(builtins, HELPER + "unpack__", _rebind_unpack)
    setattr(builtins, HELPER + "value__", _rebind_value)


def guard_tree(tree: ast.Module) -> ast.Module:
    """Rewrite ``tree`` in place (and return it) if the guard is enabled."""
    if enabled():
        _install_helpers()
        RebindGuard().visit(tree)
    return tree


def compile_guarded(source: Union[str, bytes], filename: str) -> Any:
    """``compile(source, filename, "exec")`` with the guard's rewrite applied (bytes are
    decoded as ``compile`` does: coding cookie, else UTF-8)."""
    # dont_inherit: this module's own `from __future__` imports must not leak into the program
    return compile(guard_tree(ast.parse(source, filename)), filename, "exec", dont_inherit=True)


def run_path(path: str) -> None:
    """Run the script ``path`` as ``__main__`` with the guard (like ``runpy.run_path``
    for a plain ``.py`` file: ``sys.modules["__main__"]`` is the script's module while
    it runs, so classes it defines pickle as usual)."""
    import types

    with open(path, "rb") as f:
        code = compile_guarded(f.read(), path)
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __builtins__=builtins, __loader__=None, __spec__=None,
                         __package__=None, __cached__=None)
    if enabled():
        bind(main.__dict__)
    saved: Optional[Any] = sys.modules.get("__main__")
    sys.modules["__main__"] = main
    try:
        exec(code, main.__dict__)  # noqa: S102 - running the user's program is the point
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def install_ipython(ip: Any) -> None:
    """Register the guard on the IPython shell ``ip`` (an engine of a pool): every later
    cell's top-level code is rewritten. Idempotent."""
    ip.ast_transformers[:] = [t for t in ip.ast_transformers if not isinstance(t, RebindGuard)]
    if enabled():
        _install_helpers()
        bind(ip.user_ns)   # after %reset the builtins fallback still works
        ip.ast_transformers.append(RebindGuard())
