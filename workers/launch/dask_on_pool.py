"""Dask on a pool: the pool's ranks as the workers of a ``distributed`` cluster, and distributed
arrays as ``dask.array`` s (and back) without gathering them into one process.

Like ipyparallel's ``Client.become_dask()``: :func:`start` (also ``%distributed dask``) starts a Dask
scheduler inside the pool's ipyparallel controller (its hub: it ends with the controller) and one Dask
worker per rank inside the rank's engine process
(:mod:`nbmpi.workers.launch.dask_worker`: its own event loop in a thread, one task thread, no MPI
calls from tasks), and returns a ``distributed.Client`` connected to it from the calling process.
Worker ``rank-R`` runs in rank R's process, so ``client.run(os.getpid)`` gives the ranks' pids.

Arrays: :func:`to_dask` turns a DistArray of the ranks' namespace into a ``dask.array`` whose chunk
``r`` is rank r's block, put into rank r's worker memory by the rank itself (no byte goes through
the caller); :func:`from_dask` turns a ``dask.array`` into a ``"block"`` DistArray of the ranks'
namespace: the array is rechunked so chunk r holds rank r's rows and each chunk is computed on rank
r's worker (which fetches the source chunks it needs from the other workers), then each rank takes
its chunk from its own worker.

End: stopping the pool (:meth:`~nbmpi.workers.launch.engine_pool.EnginePool.stop`, ``%distributed
stop``, a restart) closes the client and ends the scheduler and workers with the controller and the
ranks; :func:`stop` ends Dask alone and keeps the pool. Pools attached from the controller
(``%distributed connect``) are refused: their owner would have to end the scheduler.

Every function here is called by the process that owns the pool (the notebook kernel), blocks, and
raises :class:`~nbmpi.workers.launch.engine_pool.EnginePoolError` saying what failed and what to do.
"""
from __future__ import annotations

import os
import uuid
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from .engine_pool import EnginePool, EnginePoolError

if TYPE_CHECKING:   # imported lazily: dask is needed only when a pool becomes a Dask cluster
    import dask.array
    import distributed

__all__ = ["DaskOnPool", "start", "stop", "to_dask", "from_dask", "running"]

#: The pools of this process that run Dask (to_dask / from_dask without ``pool=`` use the only one).
_active: List["DaskOnPool"] = []


class DaskOnPool:
    """A running Dask cluster on a pool: the client, the scheduler's address and dashboard port, and
    ``workers`` (rank -> ``{"address", "pid", "name"}``). Made by :func:`start`; owner-thread use only."""

    def __init__(self, pool: EnginePool, client: "distributed.Client", scheduler: str,
                 workers: Dict[int, Dict[str, Any]], dashboard_port: Optional[int]):
        self.pool, self.client, self.scheduler = pool, client, scheduler
        self.workers, self.dashboard_port = workers, dashboard_port

    def dashboard_path(self) -> Optional[str]:
        """The scheduler's dashboard through the Jupyter server (``jupyter-server-proxy``), relative to
        the server's base URL: e.g. ``/proxy/41234/status`` (None if the scheduler serves no dashboard)."""
        from .jupyter_proxy import proxied_path

        return None if self.dashboard_port is None else proxied_path(self.dashboard_port, "status")

    def describe(self) -> str:
        """What ``%distributed dask`` prints: the workers (rank, pid), the scheduler, the dashboard's path."""
        pids = ", ".join(f"rank {r}: pid {w['pid']}" for r, w in sorted(self.workers.items()))
        text = (f"Dask on pool {self.pool.name!r}: {len(self.workers)} workers, one per rank ({pids}); "
                f"scheduler {self.scheduler}; the client is `dask_client`")
        if self.dashboard_path():
            text += f"\nDask dashboard (through Jupyter, jupyter-server-proxy): {self.dashboard_path()}"
        return text

    def close(self) -> None:
        """Close the client (the scheduler and workers end with the pool's processes). Idempotent."""
        if self in _active:
            _active.remove(self)
        try:
            self.client.close(timeout=10)
        except Exception:  # noqa: BLE001 - the scheduler may already be gone
            pass


def running(pool: Optional[EnginePool] = None) -> DaskOnPool:
    """The Dask cluster of ``pool`` (default: the only pool of this process running Dask)."""
    found = [d for d in _active if pool is None or d.pool is pool]
    if not found:
        where = f"pool {pool.name!r}" if pool is not None else "any pool of this process"
        raise EnginePoolError(f"Dask is not running on {where}; start it with `%distributed dask` or "
                              "nbmpi.workers.launch.dask_on_pool.start(pool)")
    if len(found) > 1:
        raise EnginePoolError(f"Dask runs on {len(found)} pools ({', '.join(d.pool.name for d in found)}); "
                              "pass pool= to say which one")
    return found[0]


def _wait(pool: EnginePool, ar, timeout: float, what: str) -> list:
    """Results of an ipyparallel AsyncResult on every rank; EnginePoolError on a timeout or a rank's error."""
    try:
        return ar.get(timeout=timeout)
    except TimeoutError:
        dead = pool.dead_ranks()
        why = pool.describe_dead(dead) if dead else f"not every rank answered within {timeout:.0f} s"
        raise EnginePoolError(f"pool {pool.name!r}: could not {what}: {why}; a rank may be busy in a cell "
                              "(interrupt it) or the pool broken (`%distributed restart`)") from None
    except Exception as e:  # noqa: BLE001 - ipyparallel's RemoteError / CompositeError
        lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
        raise EnginePoolError(f"pool {pool.name!r}: could not {what}: {lines[-1] if lines else e!r}") from None


def _start_scheduler(pool: EnginePool, timeout: float) -> str:
    """Start (or find) the Dask scheduler in the pool's ipyparallel controller; return its address."""
    ipc = pool.client()
    host = "127.0.0.1" if pool.ip in ("127.0.0.1", "localhost") else ""
    args = dict(host=host or None, port=0, dashboard_address=f"{host}:0")
    fut = ipc._send(ipc._query_stream, "become_dask_request", {"scheduler_args": args})
    if not fut.wait(timeout):
        raise EnginePoolError(f"pool {pool.name!r}: the controller did not start a Dask scheduler within "
                              f"{timeout:.0f} s; its log ends with:\n{pool._log_tail('controller')}")
    content = fut.result()["content"]
    if content.get("status") != "ok":
        raise EnginePoolError(f"pool {pool.name!r}: the controller could not start a Dask scheduler: "
                              f"{content.get('ename')}: {content.get('evalue')}")
    return content["address"]


def start(pool: EnginePool, timeout: float = 60.0) -> "distributed.Client":
    """Make ``pool`` a Dask cluster (one worker per rank, in the ranks' processes) and return a
    ``distributed.Client`` to it. Blocking; idempotent (a second call returns the same client). The
    pool's ranks must be idle (not running a cell). Owned, running pools only."""
    if pool.attached:
        raise EnginePoolError(f"pool {pool.name!r} is attached from the controller; Dask runs only on pools "
                              "this process owns (start one with `%distributed start -n N`)")
    current = pool._dask
    if current is not None and current.client.status == "running":
        return current.client
    try:
        from distributed import Client
    except ImportError:
        raise EnginePoolError("Dask on a pool needs the `distributed` and `dask` packages: "
                              "pip install 'nbmpi[dask]'") from None

    from . import dask_worker

    scheduler = _start_scheduler(pool, timeout)
    host = "127.0.0.1" if pool.ip in ("127.0.0.1", "localhost") else None
    ar = pool.client()[pool.ranks].apply_async(dask_worker.start_worker, scheduler, host,
                                               os.path.join(pool.work_dir, "dask"), timeout)
    infos = _wait(pool, ar, timeout + 5, "start a Dask worker on every rank")
    client = Client(scheduler, timeout=timeout)   # the default: `.compute()` runs on the pool
    try:
        client.wait_for_workers(len(pool.ranks), timeout=timeout)
        port = client.scheduler_info().get("services", {}).get("dashboard")
    except BaseException:
        client.close(timeout=10)
        raise
    d = DaskOnPool(pool, client, scheduler, {i["rank"]: i for i in infos}, port)
    pool._dask = d
    _active.append(d)
    return client


def stop(pool: EnginePool, timeout: float = 30.0) -> None:
    """End Dask on ``pool`` (client, workers, scheduler); the pool keeps running. Blocking; idempotent."""
    from . import dask_worker

    d, pool._dask = pool._dask, None
    if d is None:
        return
    try:   # the scheduler ends itself and its workers (the controller's own stop_distributed does not await it)
        d.client.shutdown()
    except Exception:  # noqa: BLE001 - already gone
        pass
    d.close()
    _wait(pool, pool.client()[pool.ranks].apply_async(dask_worker.stop_worker), timeout, "stop the Dask workers")
    ipc = pool.client()   # the controller forgets its scheduler, so a later start() makes a new one
    ipc._send(ipc._query_stream, "stop_distributed_request").wait(timeout)


async def _register(client, keys: Dict[str, str], nbytes: Dict[str, int]) -> list:
    """On the client's loop: tell the scheduler that ``keys`` (key -> worker address) are in memory and
    wanted by this client, and make the futures that hold them (as ``Client.scatter`` does)."""
    from distributed import Future

    await client.scheduler.update_data(who_has={k: [a] for k, a in keys.items()}, nbytes=nbytes, client=client.id)
    futures = [Future(k, client) for k in keys]
    for k in keys:
        client.futures[k].finish(type=None)
    return futures


def to_dask(name: str, pool: Optional[EnginePool] = None, timeout: float = 60.0) -> "dask.array.Array":
    """The DistArray ``name`` of the ranks' namespace as a ``dask.array``: one chunk per rank (its rows
    along axis 0, a copy in a ``"block"`` layout), held by that rank's worker. Collective on the ranks
    (they must be idle); no data passes through the caller. Later changes of the DistArray do not show."""
    import dask.array as da

    d = running(pool)
    prefix = f"nbmpi-{name}-{uuid.uuid4().hex[:8]}"
    from . import dask_worker

    infos = _wait(d.pool, d.pool.client()[d.pool.ranks].apply_async(dask_worker.put_block, name, prefix),
                  timeout, f"put the blocks of {name!r} into the Dask workers")
    futures = d.client.sync(_register, d.client, {i["key"]: i["address"] for i in infos},
                            {i["key"]: i["nbytes"] for i in infos})
    shape, dtype = tuple(infos[0]["shape"]), infos[0]["dtype"]
    parts = [da.from_delayed(f, shape=(i["rows"],) + shape[1:], dtype=dtype) for f, i in zip(futures, infos)]
    return da.concatenate(parts, axis=0)


def from_dask(x: "dask.array.Array", name: str, pool: Optional[EnginePool] = None, timeout: float = 120.0) -> None:
    """Make ``name`` in the ranks' namespace a ``"block"`` DistArray with the values of ``x`` (a
    ``dask.array`` of known shape, at least 1-d): rank r's rows are computed on rank r's worker, then
    taken from it by the rank. Collective on the ranks (they must be idle); no data passes through the
    caller. Blocking until the array exists on every rank."""
    import math

    from distributed import wait

    from ..distarray.distribution import Distribution
    from . import dask_worker

    d = running(pool)
    if x.ndim == 0 or any(isinstance(s, float) and math.isnan(s) for s in x.shape):
        raise EnginePoolError(f"from_dask needs an array of known shape with at least one axis, got shape "
                              f"{x.shape}; call x.compute_chunk_sizes() first if its chunk sizes are unknown")
    ranks = d.pool.ranks
    dist = Distribution("block", int(x.shape[0]), len(ranks))
    counts = [dist.local_count(r) for r in ranks]
    owners = [r for r, c in zip(ranks, counts) if c > 0]
    futures = {}
    if owners:
        y = x.rechunk((tuple(c for c in counts if c > 0),) + tuple((int(s),) for s in x.shape[1:]))
        blocks = y.to_delayed().reshape(-1)
        futures = {r: d.client.compute(b, workers=[d.workers[r]["address"]], allow_other_workers=False)
                   for r, b in zip(owners, blocks)}
        wait(list(futures.values()), timeout=timeout)
        failed = [(r, f.exception()) for r, f in futures.items() if f.status != "finished"]
        if failed:
            r, exc = failed[0]
            raise EnginePoolError(f"from_dask: computing the rows of rank {r} failed: {exc!r}")
    keys = {r: f.key for r, f in futures.items()}
    _wait(d.pool, d.pool.client()[ranks].apply_async(dask_worker.take_block, name, keys, tuple(x.shape),
                                                     str(x.dtype)),
          timeout, f"make {name!r} a DistArray from the Dask chunks")
    del futures   # released: the ranks hold their copies now
