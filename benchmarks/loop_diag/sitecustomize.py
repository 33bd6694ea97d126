"""Event-loop diagnostics for the trace_index benchmark (imported by Python at start when this
directory is on ``PYTHONPATH``; does nothing unless ``NBMPI_LOOPDIAG=DIR`` is set).

In a process that runs an asyncio loop: a timer every 10 ms writes one line ``B due lateness run_ns
runqueue_ns majflt`` to ``DIR/loop-PID.txt`` (how late the loop ran it, and the loop thread's
``/proc/thread-self/schedstat`` run and runqueue-wait times and the process's major faults, so a late
loop is told apart: waiting for a CPU, running Python, or asleep on the GIL or I/O); every callback
over 5 ms is written as ``S start seconds repr``. With ``NBMPI_LOOPDIAG_STACKS=1`` as well, every thread's
stack is written to ``DIR/stacks-PID.txt`` whenever the timer is more than 40 ms late (``faulthandler``'s
watchdog, a C thread that needs no GIL: it shows who held the GIL or what the loop thread waited on).
Diagnostics only: it patches ``asyncio.Handle._run``.
"""
import os

_DIR = os.environ.get("NBMPI_LOOPDIAG")
if _DIR:
    import asyncio.events
    import time

    _slow, _count, _out = [], [0], [None]
    _stacks = None
    if os.environ.get("NBMPI_LOOPDIAG_STACKS") == "1":
        import faulthandler
        _stacks = open(os.path.join(_DIR, f"stacks-{os.getpid()}.txt"), "w")
    _orig = asyncio.events.Handle._run

    def _beat(loop, due):
        now = time.perf_counter()
        if _out[0] is None:
            _out[0] = open(os.path.join(_DIR, f"loop-{os.getpid()}.txt"), "w")
        with open("/proc/thread-self/schedstat") as g:
            run, wait, _n = g.read().split()
        with open("/proc/self/stat") as g:
            majflt = g.read().rsplit(")", 1)[1].split()[9]
        _out[0].write(f"B {due:.6f} {now - due:.6f} {run} {wait} {majflt}\n")
        _count[0] += 1
        if _count[0] % 100 == 0:
            for x in _slow:
                _out[0].write(f"S {x[0]:.6f} {x[1]:.6f} {x[2]!r}\n")
            _slow.clear()
            _out[0].flush()
        loop.call_at(loop.time() + 0.01, _beat, loop, time.perf_counter() + 0.01)
        if _stacks is not None:   # re-armed at every beat: it fires only when the next beat is 40 ms late
            _stacks.write(f"--- armed {now:.6f}\n")
            _stacks.flush()
            faulthandler.dump_traceback_later(0.05, repeat=False, file=_stacks)

    def _run(self):
        if not getattr(_run, "started", False):   # the first callback of the loop starts the timer
            _run.started = True
            self._loop.call_at(self._loop.time() + 0.01, _beat, self._loop, time.perf_counter() + 0.01)
        t = time.perf_counter()
        _orig(self)
        dt = time.perf_counter() - t
        if dt > 0.005:
            _slow.append((t, dt, repr(self)[:300]))

    asyncio.events.Handle._run = _run
