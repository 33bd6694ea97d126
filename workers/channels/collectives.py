"""The reductions of :class:`~nbmpi.workers.channels.channel.ArrayChannel`:
``reduce``, ``allreduce`` and ``bcast`` as binomial trees of point-to-point
messages between the participants' persistent buffers.

* ``reduce(op, root)``: the result lands in place in ``root``'s buffer; the
  other ranks' buffers are NOT modified (interior ranks accumulate in the first
  of two scratch buffers and receive into the second).
* ``allreduce(op)``: reduce to the first participant, then ``bcast``.
* ``bcast(root)``: ``root``'s buffer is copied into all others.

Each step is one persistent request per (role, peer), created on first use and
restarted for each message (:meth:`_Collectives._send_step`,
:meth:`_Collectives._recv_step`), waited for with the channel's timeout and
traced as one event. The combining kernel is checked on one element before any
communication (:meth:`_Collectives._kernel`), so an op that does not type for
the dtype fails on every rank alike.

:class:`_Collectives` is a mixin of ``ArrayChannel``: its methods work on the
channel's own attributes. Collective over the participants, blocking.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Optional, Tuple, Union

import numpy as np

from ..tracing import tracer as _tracing
from ..core.errors import ChannelError
from ..core.kernels import combiner, describe_op

__all__: list = []

TAG_REDUCE, TAG_BCAST = 12, 13
K_REDUCE = _tracing.register_kind("reduce")
K_BCAST = _tracing.register_kind("bcast")
_SEND, _RECV = _tracing.DIR_SEND, _tracing.DIR_RECV
_now = time.perf_counter_ns
#: "timeout not given" (use the channel's): the one sentinel of every ArrayChannel operation.
_UNSET: Any = object()
#: (kernel id, dtype) pairs already compiled and tried once (see _Collectives._kernel).
_CHECKED_KERNELS: set = set()


class _Collectives:
    """Mixin of ``ArrayChannel``: traced tree steps, the combining kernel, reduce/bcast/allreduce."""

    def _send_step(self, kind: int, tag: int, buf: np.ndarray, role: str, peer: int, timeout, op: str,
                   synchronous: bool = False) -> None:
        key = (role, peer)
        req = self._reqs.get(key)
        if req is None:
            init = self.comm.Ssend_init if synchronous else self.comm.Send_init
            req = self._reqs[key] = init([buf.reshape(-1).view(np.uint8), self._byte_type], peer, tag)
        t0 = _now()
        req.Start()
        self._wait(req, timeout, peer, op, sending=True)
        self._trace_p2p(kind, _SEND, peer, tag, buf.nbytes, t0)

    def _recv_step(self, kind: int, tag: int, buf: np.ndarray, role: str, peer: int, timeout, op: str) -> None:
        key = (role, peer)
        req = self._reqs.get(key)
        if req is None:
            req = self._reqs[key] = self.comm.Recv_init([buf.reshape(-1).view(np.uint8), self._byte_type],
                                                        peer, tag)
        t0 = _now()
        req.Start()
        self._wait(req, timeout, peer, op)
        self._trace_p2p(kind, _RECV, peer, tag, buf.nbytes, t0)

    def _kernel(self, op, opname: str):
        if self.dtype.kind not in "biufc" or self.dtype.fields is not None:
            raise ChannelError(f"rank {self.rank}: {opname} on {self.name}: dtype {self.dtype} cannot be "
                               "reduced; reductions need a numeric dtype")
        if isinstance(op, str) and op in ("min", "max") and self.dtype.kind == "c":
            raise ChannelError(f"rank {self.rank}: {opname} on {self.name}: op {op!r} is not defined for "
                               f"complex dtype {self.dtype} (complex numbers are unordered); use 'sum', "
                               "'prod' or a numba.njit function that compares e.g. abs()")
        try:
            kernel = combiner(op)
        except ValueError as exc:
            raise ChannelError(f"rank {self.rank}: {opname} on {self.name}: {exc}") from None
        key = (id(kernel), self.dtype.str)
        if key not in _CHECKED_KERNELS:
            # Compile and run it on one element BEFORE communicating: a user function that
            # does not type for this dtype fails here on every rank, not mid-tree on some.
            one = np.ones(1, dtype=self.dtype)
            try:
                kernel(np.empty_like(one), one, one.copy())
            except Exception as exc:  # noqa: BLE001 - numba typing/lowering errors
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise ChannelError(
                    f"rank {self.rank}: {opname} on {self.name}: op {describe_op(op)!r} cannot combine "
                    f"elements of dtype {self.dtype} ({type(exc).__name__}: {first}); it must be a binary "
                    "function f(a, b) of two scalars of the channel's dtype returning one") from exc
            _CHECKED_KERNELS.add(key)
        return kernel

    def _scratch_bufs(self) -> Tuple[np.ndarray, np.ndarray]:
        if self._scratch is None:
            self._scratch = (np.empty_like(self._flat), np.empty_like(self._flat))
        return self._scratch

    def reduce(self, op: Union[str, Callable] = "sum", root: int = 0,
               timeout: Optional[float] = _UNSET) -> Optional[np.ndarray]:
        """Combine all participants' buffers with ``op`` into ``root``'s buffer, in place.

        Collective over the participants; blocking until this rank's part of
        the binomial tree is done. ``op``: ``'sum'``, ``'prod'``, ``'min'``,
        ``'max'`` or a ``numba.njit`` binary function ``f(a, b) -> value``
        (assumed associative and commutative). Only ``root``'s buffer changes.
        Returns the buffer on ``root``, ``None`` elsewhere.
        """
        opname = f"reduce(op={describe_op(op)}, root={root})"
        self._usable(opname)
        lroot = self._root(root, opname)
        kernel = self._kernel(op, opname)
        self._reduce_tree(kernel, lroot, self._timeout(timeout), opname)
        return self._buffer if self._lrank == lroot else None

    def _reduce_tree(self, kernel, lroot: int, timeout, opname: str) -> None:
        n, me = self._n, self._lrank
        vrank = (me - lroot) % n
        acc_is_buffer = vrank == 0
        have_acc = acc_is_buffer
        acc = self._flat
        mask = 1
        while mask < n:
            if vrank & mask == 0:
                vsrc = vrank | mask
                if vsrc < n:
                    src = (vsrc + lroot) % n
                    acc_s, recv_s = self._scratch_bufs()
                    self._recv_step(K_REDUCE, TAG_REDUCE, recv_s, "reduce-recv", src, timeout, opname)
                    if have_acc:
                        kernel(acc, acc, recv_s)
                    else:
                        kernel(acc_s, self._flat, recv_s)
                        acc, have_acc = acc_s, True
            else:
                dst = ((vrank & ~mask) + lroot) % n
                role = "reduce-send-buf" if acc is self._flat else "reduce-send-acc"
                self._send_step(K_REDUCE, TAG_REDUCE, acc, role, dst, timeout, opname)
                break
            mask <<= 1

    def bcast(self, root: int = 0, timeout: Optional[float] = _UNSET) -> np.ndarray:
        """Copy ``root``'s buffer into every participant's buffer (binomial tree). Collective, blocking.

        Returns this rank's buffer.
        """
        opname = f"bcast(root={root})"
        self._usable(opname)
        self._bcast_tree(self._root(root, opname), self._timeout(timeout), opname)
        return self._buffer

    def _bcast_tree(self, lroot: int, timeout, opname: str) -> None:
        n, me = self._n, self._lrank
        vrank = (me - lroot) % n
        mask = 1
        while mask < n:
            if vrank & mask:
                src = ((vrank - mask) + lroot) % n
                self._recv_step(K_BCAST, TAG_BCAST, self._flat, "bcast-recv", src, timeout, opname)
                break
            mask <<= 1
        mask >>= 1
        while mask > 0:
            if vrank + mask < n:
                dst = ((vrank + mask) + lroot) % n
                self._send_step(K_BCAST, TAG_BCAST, self._flat, "bcast-send", dst, timeout, opname)
            mask >>= 1

    def allreduce(self, op: Union[str, Callable] = "sum", timeout: Optional[float] = _UNSET) -> np.ndarray:
        """Combine all buffers with ``op``; the result is in place in every participant's buffer.

        Collective, blocking. Reduce to the first participant, then bcast.
        """
        opname = f"allreduce(op={describe_op(op)})"
        self._usable(opname)
        kernel = self._kernel(op, opname)
        t = self._timeout(timeout)
        self._reduce_tree(kernel, 0, t, opname)
        self._bcast_tree(0, t, opname)
        return self._buffer
