"""SPMD program (2 ranks) for tests/test_distarray_releases.py: time loops recording many dead temporaries in
one force point, each read by several operations (so fusion materializes them), some sent to the other rank
(halo reads, an in-place shifted copy) before they die. Every result must equal NumPy's bit for bit, and the
buffers allocated during the force point must stay bounded: each dead temporary's buffer goes back to the
pool after its last use and later temporaries of the same force point reuse it.

Prints ``rank R: CASE hiding=H equal=E allocated=A released=L steps=S sent=M kinds=K``, then ``rank R: ALL OK``."""
import numpy as np

import nbmpi.workers.distarray as dnp
from nbmpi.workers import world

comm = world()
rank = comm.Get_rank()
R, C, STEPS = 240, 160, 24          # 120 x 160 float64 per rank: 150 KiB, above the pool's 64 KiB minimum


def chain_step(u, xp):
    """Three temporaries, each read by two later operations (none can be inlined)."""
    d = u * 1.5 - 0.25
    e = d * d + d
    f = d - e * 0.5
    return u + 0.01 * (e - f)


def halo_step(u, xp):
    """A temporary read at shifted rows (its boundary rows are sent to the neighbour), then dead."""
    t = u * 0.5 + 0.25
    v = u * 1.0
    v[1:-1] = v[1:-1] + 0.1 * (t[:-2] + t[2:] - 2.0 * t[1:-1])
    return v


def shift_step(u, xp):
    """A temporary copied to shifted rows (a redistribution sending its rows from its own memory), read
    again, then dead."""
    t = u * 0.5 + 0.25
    s = xp.zeros_like(u)
    s[:-1] = t[1:]
    return u + 0.1 * s - 0.05 * t


def run(step, hiding):
    x0 = np.linspace(0.0, 1.0, R * C).reshape(R, C)
    want = x0.copy()
    for _ in range(STEPS):
        want = step(want, np)
    dnp.configure(latency_hiding=hiding)
    u = dnp.from_numpy(x0)
    dnp.evaluate()
    dnp.context_for().buffers.clear()  # every buffer the loop takes is fresh or released in its force point
    s0 = dnp.stats()              # (zeros_like's buffers are taken in the force point, filled there)
    for _ in range(STEPS):
        u = step(u, dnp)
    got = u.to_numpy()            # the one force point of the loop
    s1 = dnp.stats()
    assert s1["flushes"] == s0["flushes"] + 1, "the loop was evaluated in more than one force point"
    alloc = s1["buffers_allocated"] - s0["buffers_allocated"]
    rel = s1["buffers_released"] - s0["buffers_released"]
    kinds = "+".join(sorted(set(s1["last"]["kinds"])))
    sent = s1["messages_sent"] - s0["messages_sent"]
    print(f"rank {rank}: {step.__name__} hiding={hiding} equal={np.array_equal(got, want)} allocated={alloc} "
          f"released={rel} steps={STEPS} sent={sent} kinds={kinds}", flush=True)


dnp.configure(threshold=100000)
for hiding in (True, False):
    for step in (chain_step, halo_step, shift_step):
        run(step, hiding)
comm.Barrier()
print(f"rank {rank}: ALL OK", flush=True)
