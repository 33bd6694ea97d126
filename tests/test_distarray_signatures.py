"""The caches of the lazy graph (workers/distarray/graph.py) against what they replace.

* ``_view_sig`` is cached on the view (``View.sig``): every cached signature must equal the one computed afresh,
  and views differing only in their base shape or in one entry must get different signatures (else the
  agreement of a force point would miss ranks that recorded different views);
* a base's ``sig_head`` is the start of its leaves' signatures: equal to the fields it stands for;
* ``leaves`` of an Op is cached on the Op: a node rebuilt by ``substitute`` must list its own leaves, the
  original keeps its own, and a chain deeper than the recursion limit still works.

Run in this process on one rank (real arrays of every distribution; nothing is exchanged).
"""
from __future__ import annotations

import sys

import numpy as np
import pytest

import nbmpi.workers.distarray as dnp
from nbmpi.workers.distarray import graph
from nbmpi.workers.distarray.graph import Const, Op, leaves, node_sig, substitute

DISTS = ["block", "cyclic", ("block-cyclic", 2)]


def _fresh_view_sig(v):
    out = list(v.base_shape) + [-1]
    for e in v.entries:
        out.append(graph._ENTRY_CODE[e[0]])
        out.extend(e[1:])
    return tuple(out)


def _views(arr):
    n = arr.shape[0]
    for k in range(n - 3):     # offsets changing every step, as in Gauss and LU
        yield arr[k:k + 3]._view
        yield arr[k + 1:, k:]._view
        yield arr[k, k:]._view
        yield arr[k:n:2, 1]._view
        yield arr[::-1][k:]._view


@pytest.mark.parametrize("dist", DISTS, ids=str)
def test_view_signatures_cached_equal_fresh(dist):
    for shape in [(9, 5), (10, 5)]:
        a = dnp.zeros(shape, dist=dist)
        views = list(_views(a))
        for v in views:
            assert v.sig is None                     # made when first asked
        for _ in range(2):                           # the second pass reads the views' cached signatures
            for v in views:
                assert graph._view_sig(v) == _fresh_view_sig(v), v
                assert v.sig == _fresh_view_sig(v)
    a, b = dnp.zeros((9, 5), dist=dist), dnp.zeros((10, 5), dist=dist)
    va, vb = a[1:4]._view, b[1:4]._view
    assert va.entries == vb.entries and graph._view_sig(va) != graph._view_sig(vb)
    assert graph._view_sig(a[1:4]._view) != graph._view_sig(a[2:5]._view)
    assert graph._view_sig(a[1:4, 0]._view) != graph._view_sig(a[1:4, 1]._view)


@pytest.mark.parametrize("dist", DISTS, ids=str)
def test_leaf_signature_head_names_the_base(dist):
    a = dnp.zeros((11, 3), dist=dist, dtype=np.float32)
    b = a._base
    d = b.dist
    leaf = a[2:7]._leaf()
    want = (0, b.serial, graph._KIND_CODE[d.kind], d.nrows, d.block, b.dtype.num, b.origin_code,
            _fresh_view_sig(leaf.view))
    assert node_sig(leaf) == want
    other = dnp.zeros((11, 3), dist=dist, dtype=np.float32)
    assert node_sig(other[2:7]._leaf()) != want          # another base: another serial


def _op(name, *args):
    return Op(name, args, np.float64, tuple(np.dtype(np.float64) for _ in args), args[0].shape)


@pytest.mark.parametrize("dist", DISTS, ids=str)
def test_leaves_cached_per_op_and_rebuilt_by_substitute(dist):
    a, b, c = (dnp.zeros((8, 4), dist=dist) for _ in range(3))
    la, lb, lc = a[1:5]._leaf(), b[0:4]._leaf(), c[2:6]._leaf()
    shared = _op("multiply", la, Const(2.0))
    top = _op("add", shared, _op("subtract", lb, shared))
    assert leaves(top) == (la, lb, la)
    assert leaves(shared) == (la,)
    assert leaves(top) is leaves(top)                    # cached
    new = substitute(top, lambda l: lc if l.base is a._base else None)
    assert leaves(new) == (lc, lb, lc)
    assert leaves(top) == (la, lb, la)                   # the original keeps its own
    assert node_sig(new) != node_sig(top)
    assert leaves(la) == (la,) and leaves(Const(1.0)) == ()


def test_leaves_of_a_chain_deeper_than_the_recursion_limit():
    a = dnp.zeros(6)
    la = a._leaf()
    node = la
    depth = sys.getrecursionlimit() + 100
    for _ in range(depth):
        node = _op("negative", node)
    assert leaves(node) == (la,)
