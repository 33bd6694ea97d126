"""What runs inside every engine (MPI rank) of a pool turned into a Dask cluster.

The notebook side is :mod:`nbmpi.workers.launch.dask_on_pool`; it calls these functions on the
engines through the pool's ipyparallel client (one ``apply`` per call, every rank at once).

One ``distributed.Worker`` per rank, in the engine process, on an event loop of its own in a daemon
thread (``nbmpi-dask-worker``). So the worker keeps answering the scheduler and serving its data
while the rank's main thread runs a cell (MPI work, a blocking receive): ipyparallel's
``become_dask`` puts the worker on the engine's own loop, which a running cell blocks. The worker
has one task thread (``nthreads=1``). Dask tasks run in that thread: they must make no MPI call
(the ranks run at MPI thread level ``funneled``; only the main thread communicates).

Blocks of distributed arrays enter and leave the worker's memory here, without going through
another process: :func:`put_block` (``DistArray`` -> this rank's chunk, under a key the notebook
chose) and :func:`take_block` (the chunk computed on this worker -> ``DistArray``). Both hand the
data to the worker's own loop (the worker is not thread-safe) and wait for it.

The worker ends with its process (the pool's :meth:`~nbmpi.workers.launch.engine_pool.EnginePool.stop`
ends the ranks) or with :func:`stop_worker`.
"""
from __future__ import annotations

import asyncio
import os
import threading
from typing import Any, Dict, Optional, Tuple

import numpy as np

#: Seconds a call into the worker's loop may take before it fails, naming the rank and the operation.
LOOP_TIMEOUT = 60.0


class _Running:
    worker = None          # distributed.Worker
    loop: Optional[asyncio.AbstractEventLoop] = None
    thread: Optional[threading.Thread] = None
    scheduler: Optional[str] = None


_running = _Running()


def _rank() -> int:
    from ..core import runtime

    return runtime.world().Get_rank()


def _user_ns() -> Dict[str, Any]:
    from IPython import get_ipython

    return get_ipython().user_ns


def _describe() -> Dict[str, Any]:
    w = _running.worker
    return dict(rank=_rank(), pid=os.getpid(), address=w.address, name=str(w.name))


def start_worker(scheduler: str, host: Optional[str], local_directory: str, timeout: float = 60.0) -> Dict[str, Any]:
    """Start this rank's Dask worker (named ``rank-R``) connected to ``scheduler``; block until it is
    registered. Called on every engine by :func:`nbmpi.workers.launch.dask_on_pool.start`. Idempotent
    for the same scheduler. Returns ``{"rank", "pid", "address", "name"}``. Raises ``RuntimeError``
    (naming the rank and scheduler) if the worker is not up within ``timeout`` seconds."""
    if _running.worker is not None and _running.scheduler == scheduler and _running.worker.status.name == "running":
        return _describe()
    stop_worker()
    rank = _rank()
    ready = threading.Event()
    box: Dict[str, Any] = {}

    def run() -> None:
        from distributed import Worker

        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)

        async def main() -> None:
            try:
                w = await Worker(scheduler, nthreads=1, name=f"rank-{rank}", host=host, dashboard=False,
                                 local_directory=local_directory)
            except BaseException as exc:  # noqa: BLE001 - reported to the caller below
                box["error"] = exc
                ready.set()
                return
            box["worker"], box["loop"] = w, loop
            ready.set()
            await w.finished()

        try:
            loop.run_until_complete(main())
        finally:
            loop.close()

    thread = threading.Thread(target=run, name="nbmpi-dask-worker", daemon=True)
    thread.start()
    if not ready.wait(timeout):
        raise RuntimeError(f"rank {rank}: the Dask worker did not connect to the scheduler at {scheduler} within "
                           f"{timeout:.0f} s; is the scheduler reachable from this rank's host?")
    if "error" in box:
        raise RuntimeError(f"rank {rank}: the Dask worker could not start (scheduler {scheduler}): "
                           f"{box['error']!r}") from box["error"]
    _running.worker, _running.thread, _running.scheduler = box["worker"], thread, scheduler
    _running.loop = box["loop"]
    return _describe()


def _on_loop(fn, what: str):
    """Run ``fn()`` on the worker's event loop and return its result (blocking, :data:`LOOP_TIMEOUT`)."""
    if _running.worker is None or _running.loop is None:
        raise RuntimeError(f"rank {_rank()}: no Dask worker runs on this rank; start one with "
                           "`%distributed dask` (or nbmpi.workers.launch.dask_on_pool.start(pool))")

    async def call():
        return fn()

    fut = asyncio.run_coroutine_threadsafe(call(), _running.loop)
    try:
        return fut.result(LOOP_TIMEOUT)
    except TimeoutError:
        raise RuntimeError(f"rank {_rank()}: the Dask worker did not {what} within {LOOP_TIMEOUT:.0f} s") from None


def put_block(name: str, prefix: str) -> Dict[str, Any]:
    """Put this rank's block of the DistArray ``name`` (a variable of the ranks' namespace) into this
    rank's Dask worker under the key ``f"{prefix}-r{rank}"``. Collective (every rank of the array
    calls it): the array is first copied to a ``"block"`` layout (``a.redistribute("block")``: no
    communication when it already is one), so rank r's chunk is rows ``[offset_r, offset_r + rows_r)``
    and later writes to the array do not change the chunk. Returns ``{"rank", "key", "address", "rows", "nbytes", "shape", "dtype"}``."""
    from ..distarray import DistArray

    a = _user_ns().get(name)
    if not isinstance(a, DistArray):
        raise TypeError(f"rank {_rank()}: {name!r} is {type(a).__name__}, not a DistArray; to_dask takes the "
                        "name of a distributed array (nbmpi.workers.distarray) defined on every rank")
    if a.ndim == 0:
        raise ValueError(f"rank {_rank()}: {name!r} is 0-d; a dask.array of it has no rows to split into chunks")
    block = np.ascontiguousarray(a.redistribute("block").local)
    key = f"{prefix}-r{_rank()}"
    _on_loop(lambda: _running.worker.update_data(data={key: block}), "store the block")
    return dict(rank=_rank(), key=key, address=_running.worker.address, rows=int(block.shape[0]),
                nbytes=int(block.nbytes), shape=list(a.shape), dtype=str(a.dtype))


def take_block(name: str, keys: Dict[int, str], shape: Tuple[int, ...], dtype: str) -> Dict[str, Any]:
    """Make ``name`` (in the ranks' namespace) a ``"block"`` DistArray of ``shape`` and ``dtype`` whose
    rows on this rank are the chunk held under ``keys[rank]`` by this rank's worker (computed there by
    :func:`nbmpi.workers.launch.dask_on_pool.from_dask`; no entry: this rank has no rows). Collective.
    Returns ``{"rank", "rows"}``. Raises ``RuntimeError`` if the chunk is not in this worker's memory."""
    from ..distarray import empty
    from ..distarray.creation import from_local

    shape = tuple(int(s) for s in shape)
    key = keys.get(_rank())
    if key is None:
        block = np.empty((0,) + shape[1:], dtype=dtype)
    else:
        def fetch():
            if key not in _running.worker.data:
                raise RuntimeError(f"rank {_rank()}: chunk {key!r} is not in this rank's Dask worker; it was "
                                   "released or computed elsewhere")
            return _running.worker.data[key]

        block = np.array(_on_loop(fetch, "hand over the chunk"), dtype=dtype)   # a copy: Dask's data is immutable
    like = empty(shape, dtype=dtype, dist="block")
    _user_ns()[name] = from_local(block, like)
    return dict(rank=_rank(), rows=int(block.shape[0]))


def stop_worker(timeout: float = 10.0) -> None:
    """Close this rank's Dask worker, if one runs (blocking, up to ``timeout`` seconds)."""
    w, loop, thread = _running.worker, _running.loop, _running.thread
    _running.worker = _running.loop = _running.thread = _running.scheduler = None
    if w is None or loop is None:
        return
    try:
        asyncio.run_coroutine_threadsafe(w.close(timeout=timeout), loop).result(timeout)
    except Exception:  # noqa: BLE001 - the scheduler may already be gone; the thread is a daemon
        pass
    if thread is not None:
        thread.join(timeout)
