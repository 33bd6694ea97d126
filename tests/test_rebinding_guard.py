"""The rebinding guard's rewrite (pure AST and plain Python: no MPI needed to build or
check it; the end-to-end behaviour under mpiexec and in a Jupyter kernel is tested in
test_fused_reductions.py and test_kernel_ext.py)."""
import ast
import subprocess
import sys
import textwrap

from nbmpi.workers.fused_reductions import rebinding_guard as rg


def _fn(src: str) -> ast.AST:
    return ast.parse(textwrap.dedent(src)).body[0]


def test_function_names_guarded_are_the_shared_ones_only():
    fn = _fn("""
        def work(s, a, t):
            s.reset()                    # used as a shared variable
            u, k = shared(0.0), 3        # made shared here (tuple display)
            y = u * 2 + s                # arithmetic on shared names
            alias = y
            v = float(s) / len(a)        # a local copy: not shared (no look through calls)
            w = v * a[0]                 # arithmetic on locals only
            timer = other.reset          # attribute access, not a call on a name
            p = nbmpi.workers.pool(1.0)  # maker as an attribute
            def inner():
                q = shared(1.0)          # nested function: its own scope
            return w
        """)
    assert rg._shared_names(fn) == {"s", "u", "y", "alias", "p"}
    assert rg._shared_names(fn.body[-2]) == {"q"}


def test_rewrite_keeps_future_flags_and_line_numbers(tmp_path):
    # the guard's module uses `from __future__ import annotations`; the program must not inherit it
    code = rg.compile_guarded("def f(x: int) -> int:\n    return x\nRESULT = f.__annotations__\n", "<t>")
    ns: dict = {}
    exec(code, ns)
    assert ns["RESULT"] == {"x": int, "return": int}
    # a guarded statement keeps its line in tracebacks
    prog = tmp_path / "p.py"
    prog.write_text("from nbmpi.workers import shared\ndef f():\n    s = shared(0.0)\n    s = (1.0 +\n"
                    "         2.0)\nf()\n")
    proc = subprocess.run([sys.executable, "-c", "from nbmpi.workers.fused_reductions import rebinding_guard as g; "
                           f"g.run_path({str(prog)!r})"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "SharedVariableError" in proc.stderr, proc.stderr
    assert 'p.py", line 4, in f' in proc.stderr, proc.stderr


def test_unpacking_an_iterator_is_not_consumed_and_cache_names_are_free():
    src = ("import itertools\nfrom nbmpi.workers import shared\n_ = shared(1.0)\n"
           "_ = [1, 2]\n__ = shared(0.0)\n_, b = 1, 2\nit = iter(range(5))\n"
           "try:\n    a, c = it\nexcept ValueError:\n    pass\nREST = list(it)\n")
    ns: dict = {}
    rg.bind(ns)
    exec(rg.compile_guarded(src, "<t>"), ns)
    assert ns["_"] == 1 and ns["REST"] == [3, 4], ns["REST"]   # unpacking read 3 items, as Python does
