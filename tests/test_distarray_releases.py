"""Buffers of dead temporaries given back to the pool inside a force point (workers/distarray/releases.py), under
real mpiexec on 2 ranks (tests/distarray_release_cases.py): time loops of 24 steps recorded into one force point,
each step making temporaries read by several operations (materialized), some of them sent to the other rank
(halo reads packed into messages, a shifted copy sent from the temporary's own memory) before they die. With and
without latency hiding the results equal NumPy's bit for bit, and the force point allocates a bounded number of
fresh buffers (one group's worth plus a few), not one per temporary (73 and 49 without the releases)."""
from __future__ import annotations

import re

import pytest

from conftest import REPO, assert_ok

CASES = ["chain_step", "halo_step", "shift_step"]
#: A fused group holds at most 12 tasks (fusion.MAX_GROUP_TASKS): the chain's group writes 12 temporaries before
#: the first of them can be given back; the halo and shift steps need a handful.
#: The count starts before the loop is recorded: zeros_like's buffers are taken (and filled) in the force point.
#: With latency hiding, the rank receiving shift_step's shifted rows posts every step's receive at the start of
#: the force point, straight into that step's zeros_like buffer: one buffer per step, 24 + 3 (the fill done at the
#: call took the same 24 while recording).
BOUND = {("chain_step", "True"): 20, ("halo_step", "True"): 10, ("shift_step", "True"): 30,
         ("chain_step", "False"): 20, ("halo_step", "False"): 10, ("shift_step", "False"): 10}
LINE = re.compile(r"rank (\d): (\w+) hiding=(True|False) equal=(True|False) allocated=(\d+) released=(\d+) "
                  r"steps=(\d+) sent=(\d+) kinds=(\S+)")


@pytest.mark.parametrize("n", [2])
def test_dead_temporaries_release_their_buffers_inside_the_force_point(run_mpi, kernel_cache, n):
    code = (REPO / "tests" / "distarray_release_cases.py").read_text()
    p = run_mpi(code, n=n, timeout=290, env={"NBMPI_DISTARRAY_CACHE": kernel_cache})
    assert_ok(p)
    rows = [m.groups() for m in LINE.finditer(p.stdout)]
    assert len(rows) == n * len(CASES) * 2, p.stdout
    sent = {}
    for rank, case, hiding, equal, alloc, released, steps, msgs, kinds in rows:
        where = (rank, case, hiding, p.stdout)
        assert equal == "True", where
        assert int(alloc) <= BOUND[(case, hiding)] < int(steps) * 2, where
        assert int(released) >= int(steps) * 2 - BOUND[(case, hiding)], where
        sent[(case, hiding)] = sent.get((case, hiding), 0) + int(msgs)
        if case == "shift_step":
            assert "redistribute" in kinds.split("+"), where
    for hiding in ("True", "False"):
        # the to_numpy gather sends one message per rank; the halo and the shifted copy send more
        assert sent[("halo_step", hiding)] > n and sent[("shift_step", hiding)] > n, (sent, p.stdout)
    for r in range(n):
        assert f"rank {r}: ALL OK" in p.stdout, p.stdout
