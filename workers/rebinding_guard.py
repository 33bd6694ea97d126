"""Make ``x = a`` an error when ``x`` names a shared variable and ``a`` is rank-local.

The CFL seed (C++) makes assigning a purely local value to a shared variable
an error through its assignment operator. Python has no such hook: ``x = a``
just rebinds the name, and afterwards every rank holds its own ``x``. This
module restores the rule where SPMD program text is run by nbmpi, by
rewriting the program's syntax tree before it runs:

* top-level code of ``%%distributed`` cells (an IPython AST transformer that
  :func:`install_ipython` registers on every engine of a pool);
* scripts run with ``nbmpi run`` (and controller jobs, which run the same way)
  and ``nbmpi run -c CODE`` (:func:`run_path`, :func:`compile_guarded`).

Every simple assignment ``x = <expr>`` (also ``x = y = <expr>``, ``x: T =
<expr>`` and ``a, b = <expr>`` with plain names) at module level, including
inside top-level ``for``/``while``/``if``/``with``/``try`` blocks, becomes
``x = __nbmpi_rebind__(<expr>, "x")``. At run time that call raises
:class:`~nbmpi.workers.errors.SharedVariableError` if ``x`` currently holds a
:class:`~nbmpi.workers.fused_reductions.SharedVar` (or pool) and the new value
is not a shared variable; otherwise it returns the value unchanged (about
0.1 µs per assignment). ``x = shared(...)``, ``x = y`` with ``y`` shared,
``x += a`` and every other use are unaffected; ``del x`` releases the name.

Not covered, because Python gives no hook there without slowing every
assignment down: names local to functions or classes, ``for x in ...`` loop
targets, ``global`` names assigned inside functions, ``exec`` of other code,
and ``nbmpi run -m module``. ``NBMPI_REBIND_GUARD=0`` turns the guard off.
"""
from __future__ import annotations

import ast
import builtins
import os
import sys
from typing import Any, Callable, Optional, Tuple, Union

HELPER = "__nbmpi_rebind__"
_getframe = sys._getframe
#: ``NBMPI_REBIND_GUARD=0`` disables the rewrite (the code then runs exactly as written).
ENV = "NBMPI_REBIND_GUARD"


def enabled() -> bool:
    """Whether the guard is on (``NBMPI_REBIND_GUARD`` is unset or not ``0``)."""
    return os.environ.get(ENV, "").strip() != "0"


_SharedVar: Any = None


def _shared_type() -> Any:
    global _SharedVar
    from .fused_reductions import SharedVar

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


def _rebind_unpack(value: Any, names: Tuple[str, ...]) -> Any:
    """Run-time check of ``a, b = value``: unpacks here (as the assignment would) and
    checks each name against its own value."""
    SharedVar = _SharedVar or _shared_type()
    values = tuple(value)
    ns = _getframe(1).f_locals
    for name, v in zip(names, values):
        old = ns.get(name)
        if old is not None and isinstance(old, SharedVar) and not isinstance(v, SharedVar):
            raise _error(name, old, v)
    return values


def _error(name: str, old: Any, value: Any) -> Exception:
    from .errors import SharedVariableError
    from .runtime import world

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


class RebindGuard(ast.NodeTransformer):
    """Rewrites module-level assignments to plain names (see the module doc). Never
    descends into function, lambda or class bodies."""

    def visit_FunctionDef(self, node: ast.AST) -> ast.AST:  # noqa: N802 - ast API
        return node

    visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = visit_FunctionDef

    def visit_Assign(self, node: ast.Assign) -> ast.AST:  # noqa: N802
        if all(isinstance(t, ast.Name) for t in node.targets):
            names = [t.id for t in node.targets]
            node.value = self._call(HELPER, node.value, names[0] if len(names) == 1 else tuple(names))
        elif (len(node.targets) == 1 and isinstance(node.targets[0], (ast.Tuple, ast.List))
              and node.targets[0].elts and all(isinstance(e, ast.Name) for e in node.targets[0].elts)):
            names = tuple(e.id for e in node.targets[0].elts)
            node.value = self._call(HELPER + "unpack__", node.value, names)
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST:  # noqa: N802
        if node.value is not None and node.simple and isinstance(node.target, ast.Name):
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


def guard_tree(tree: ast.Module) -> ast.Module:
    """Rewrite ``tree`` in place (and return it) if the guard is enabled."""
    if enabled():
        _install_helpers()
        RebindGuard().visit(tree)
    return tree


def compile_guarded(source: Union[str, bytes], filename: str) -> Any:
    """``compile(source, filename, "exec")`` with the guard's rewrite applied (bytes are
    decoded as ``compile`` does: coding cookie, else UTF-8)."""
    return compile(guard_tree(ast.parse(source, filename)), filename, "exec")


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
