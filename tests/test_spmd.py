"""The SPMD agreement module (``nbmpi.workers.core.spmd``): first_difference locally (examples and
properties), and agree / gather / all_ok / KeyCheck / translate_ranks under real mpiexec with 2 and 3
ranks. Every rank prints the texts it got; the test asserts they are the same text on every rank."""
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import assert_ok
from nbmpi.workers.core.spmd import Difference, first_difference


# -- first_difference: local --------------------------------------------------------------------------
def test_first_difference_examples():
    assert first_difference([[1, 2, 3], [1, 2, 3]]) is None
    assert first_difference([[1]]) is None
    d = first_difference([[1, 2, 3], [1, 2, 4], [1, 2, 4]])
    assert d == Difference(2, (3, 4, 4), 4, (1, 2), (0,), ())
    assert d.text() == "item 2: rank(s) [0] had 3, rank(s) [1, 2] had 4"
    # a tie: the lowest rank's item is the reference
    d = first_difference([["a"], ["b"]])
    assert (d.reference, d.agreeing, d.differing) == ("a", (0,), (1,))
    # a sequence that ended counts as "nothing" at that position
    d = first_difference([[1, 2], [1], [1, 2]])
    assert (d.index, d.items, d.ended, d.differing) == (1, (2, None, 2), (1,), (1,))
    assert d.text() == "item 1: rank(s) [1] had nothing (its sequence ended), rank(s) [0, 2] had 2"
    # NumPy arrays compare by dtype and values
    import numpy as np
    assert first_difference([[np.arange(3)], [np.arange(3)]]) is None
    d = first_difference([[np.arange(3)], [np.arange(3.0)], [np.arange(3)]])
    assert d.differing == (1,)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2), max_size=5), min_size=1, max_size=5))
def test_first_difference_properties(seqs):
    d = first_difference(seqs)
    n = max(len(s) for s in seqs)
    END = object()
    col = [[s[i] if i < len(s) else END for s in seqs] for i in range(n)]
    differs = [i for i in range(n) if any(c is not col[i][0] and c != col[i][0] for c in col[i])]
    if not differs:
        assert d is None
        return
    i = differs[0]
    assert d.index == i
    items = col[i]
    assert sorted(d.agreeing + d.differing) == list(range(len(seqs))) and d.differing
    counts = [sum(1 for b in items if b is a or (a is not END and b is not END and a == b)) for a in items]
    top = max(counts)
    assert len(d.agreeing) == top
    assert d.agreeing[0] == min(r for r in range(len(seqs)) if counts[r] == top)  # ties: the lowest rank
    assert d.ended == tuple(r for r in range(len(seqs)) if items[r] is END)
    assert first_difference([list(s) for s in seqs]) == d   # deterministic: same lists, same Difference


# -- agreement under mpiexec ------------------------------------------------------------------------
PROGRAM = r'''
import json
import numba
import numpy as np
from nbmpi.workers import world, Aggregator, AggregationError, CommTimeout
from nbmpi.workers.core import spmd

comm = world()
rank, size = comm.Get_rank(), comm.Get_size()


results = {}


def out(label, value):
    results[label] = str(value)


# the same call everywhere: None, one small allreduce
out("agree-same", spmd.agree(comm, ("put", (4, 2), "float64")))
# rank 0 differs from the majority (3 ranks) / a tie between two ranks (2 ranks: rank 0's is the reference)
d = spmd.agree(comm, ("put", (4, 2) if rank == 0 else (4, 3), "float64"))
out("agree-differ", d.text())
out("agree-differing", list(d.differing))
# sequences of different length: the first difference is where the shorter one ended
seq = ["a", "b"] + (["c"] if rank == size - 1 else [])
d = spmd.first_difference(spmd.gather(comm, seq))
out("seq", d.text())
# gather: every rank's object in rank order
out("gather", spmd.gather(comm, {"rank": rank, "sq": rank * rank}))
# all_ok: a collective AND
out("all-ok-true", spmd.all_ok(comm, True))
out("all-ok-one-false", spmd.all_ok(comm, rank != size - 1))
# KeyCheck: non-blocking, completed later
kc = spmd.KeyCheck(comm, spmd.digest(("flush", 3)), count=7 + (rank == 1))
out("keycheck", kc.wait(None, rank, "test key check"))
kc = spmd.KeyCheck(comm, spmd.number_key((1, 2.5, (3,))), count=2)
out("keycheck-same", kc.wait(None, rank, "test key check"))

# translate_ranks: ranks of a sub-communicator (reversed order) <-> world ranks
sub = comm.Split(rank % 2, key=-rank)
out("to-sub", spmd.translate_ranks(comm, range(size), sub))
out("to-world", spmd.translate_ranks(sub, range(sub.Get_size()), comm))
sub.Free()

# a caller: an Aggregator created differently on the last rank raises on every rank, same text
@numba.njit
def handler(items, state):
    pass
try:
    Aggregator(np.dtype([("k", np.int64)]), handler, buffer_items=64 if rank == size - 1 else 32, name="histo")
    out("aggregator", "no error")
except AggregationError as e:
    out("aggregator", str(e).split(": ", 1)[1])

# the timeout path: rank 0 checks alone and times out, naming itself and the operation; the others
# join that check later (collective requests are never cancelled), on a communicator of its own
dup = comm.Dup()
if rank == 0:
    try:
        spmd.agree(dup, "late", timeout=0.3, op="test agreement")
        out("timeout", "no timeout")
    except CommTimeout as e:
        out("timeout", f"{type(e).__name__} rank={e.rank} peer={e.peer} op={e.op!r} waited>=0.3:{e.waited >= 0.3}")
comm.Barrier()
if rank != 0:
    spmd.KeyCheck(dup, spmd.digest("late")).wait(60, rank, "joining the late check")
comm.Barrier()
every = comm.gather(results, root=0)   # one line, printed by rank 0: the ranks' lines could interleave
if rank == 0:
    print("RESULTS " + json.dumps(every), flush=True)
'''


def _parse(stdout: str, n: int) -> list:
    """Every rank's results (label -> text), as rank 0 printed them."""
    m = re.search(r"^RESULTS (.*)$", stdout, re.M)
    assert m is not None, stdout
    every = json.loads(m.group(1))
    assert len(every) == n, every
    return every


def _results(every: list, label: str, n: int) -> list:
    return [every[r][label] for r in range(n)]


def _same_everywhere(every: list, label: str, n: int) -> str:
    vals = _results(every, label, n)
    assert len(set(vals)) == 1, f"{label} differs between ranks: {vals}"
    return vals[0]


@pytest.mark.parametrize("n", [2, 3])
def test_agreement_names_the_first_difference_identically_on_every_rank(run_mpi, n):
    proc = run_mpi(PROGRAM, n=n, timeout=180)
    assert_ok(proc)
    s = _parse(proc.stdout, n)
    assert _same_everywhere(s, "agree-same", n) == "None"
    if n == 3:
        assert _same_everywhere(s, "agree-differ", n) == \
            "item 0: rank(s) [0] had ('put', (4, 2), 'float64'), rank(s) [1, 2] had ('put', (4, 3), 'float64')"
        assert _same_everywhere(s, "agree-differing", n) == "[0]"
    else:  # a tie: rank 0's signature is the reference
        assert _same_everywhere(s, "agree-differ", n) == \
            "item 0: rank(s) [1] had ('put', (4, 3), 'float64'), rank(s) [0] had ('put', (4, 2), 'float64')"
        assert _same_everywhere(s, "agree-differing", n) == "[1]"
    others = list(range(n - 1))
    assert _same_everywhere(s, "seq", n) == \
        f"item 2: rank(s) [{n - 1}] had 'c', rank(s) {others} had nothing (its sequence ended)"
    assert _same_everywhere(s, "gather", n) == repr([{"rank": r, "sq": r * r} for r in range(n)])
    assert _same_everywhere(s, "all-ok-true", n) == "True"
    assert _same_everywhere(s, "all-ok-one-false", n) == "False"
    assert _same_everywhere(s, "keycheck", n) == "False"
    assert _same_everywhere(s, "keycheck-same", n) == "True"
    # Split(rank % 2, key=-rank): each colour's ranks in reverse order; other colour -> -1
    to_sub = _results(s, "to-sub", n)
    for r in range(n):
        mine = [q for q in range(n) if q % 2 == r % 2][::-1]
        assert to_sub[r] == repr([mine.index(q) if q in mine else -1 for q in range(n)])
        assert _results(s, "to-world", n)[r] == repr(mine)
    agg = _same_everywhere(s, "aggregator", n)
    assert f"histo created differently on rank(s) [{n - 1}]" in agg and "every rank must use the same" in agg
    assert s[0]["timeout"] == "CommTimeout rank=0 peer=None op='test agreement' waited>=0.3:True"
