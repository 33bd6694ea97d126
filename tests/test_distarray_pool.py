"""The distributed arrays' buffer pool (workers/distarray/pool_memory.py: BufferCache, pool_bytes), one process:
a request takes a kept buffer of its shape, else the smallest one of at least its bytes and at most twice them
(a prefix view), whose whole buffer comes back when the view is given back; a lent view that dies unreturned
leaves no entry; NBMPI_DISTARRAY_POOL_BYTES and its default. The same behaviour under mpiexec, with arrays, is in
tests/distarray_fresh_buffer_cases.py."""
from __future__ import annotations

import gc

import numpy as np
import pytest

from nbmpi.workers.distarray.pool_memory import POOL_BYTES_ENV, BufferCache, pool_bytes

KIB = 1 << 10


def test_same_shape_first_then_the_smallest_buffer_that_fits():
    pool = BufferCache(max_bytes=1 << 30)
    a, b, c = np.empty(40 * KIB), np.empty(25 * KIB), np.empty(30 * KIB)   # 320, 200, 240 KiB
    for x in (a, b, c):
        pool.give(x)
    assert pool.take((40 * KIB,), np.float64) is a                          # same shape: itself
    v = pool.take((100, 240), np.float64)                                   # 187.5 KiB: b (200) is smallest
    assert v.shape == (100, 240) and v.dtype == np.float64 and v.flags.c_contiguous
    assert np.shares_memory(v, b) and not np.shares_memory(v, c)
    assert pool.take((100, 240), np.float64) is not None                    # then c (240 <= 2 x 187.5)
    assert pool.take((100, 240), np.float64) is None and pool.bytes == 0 and pool.reused == 3


def test_a_lent_view_comes_back_as_its_whole_buffer_in_any_dtype():
    pool = BufferCache(max_bytes=1 << 30)
    root = np.empty((64, 1024))                                             # 512 KiB
    pool.give(root)
    v = pool.take((300, 300), np.int32)                                     # 351.6 KiB of int32
    assert np.shares_memory(v, root) and v.dtype == np.int32 and pool.bytes == 0
    v[:] = 7
    assert (root.reshape(-1).view(np.int32)[:90000] == 7).all()
    pool.give(v)
    assert list(pool.free.values()) == [root] and pool.bytes == root.nbytes and not pool._lent


def test_requests_under_half_a_buffer_or_under_the_minimum_take_nothing():
    pool = BufferCache(max_bytes=1 << 30)
    pool.give(np.empty(64 * KIB))                                           # 512 KiB
    assert pool.take((32 * KIB - 1,), np.float64) is None                   # just under half
    assert pool.take((1000,), np.float64) is None                           # under min_bytes (64 KiB)
    assert pool.take((32 * KIB,), np.float64) is not None                   # exactly half


def test_a_lent_view_that_dies_unreturned_leaves_no_entry():
    pool = BufferCache(max_bytes=1 << 30)
    pool.give(np.empty(64 * KIB))
    v = pool.take((50 * KIB,), np.float64)
    assert len(pool._lent) == 1
    del v
    gc.collect()
    assert not pool._lent and pool.bytes == 0                               # its buffer went with it


def test_the_limit_drops_the_oldest_and_never_keeps_a_larger_buffer():
    pool = BufferCache(max_bytes=600 * KIB)
    first, second = np.empty(40 * KIB), np.empty(40 * KIB)                  # 320 KiB each
    pool.give(first)
    pool.give(second)
    assert list(pool.free.values()) == [second] and pool.bytes == 320 * KIB
    pool.give(np.empty(100 * KIB))                                          # 800 KiB > limit: not kept
    assert pool.bytes == 320 * KIB


@pytest.mark.parametrize("value, expected", [("1073741824", 1 << 30), ("512M", 512 << 20), ("4G", 4 << 30),
                                             ("4GiB", 4 << 30), ("1.5g", 3 << 29), ("0", 0), ("64k", 64 << 10)])
def test_pool_bytes_reads_the_variable(value, expected):
    assert pool_bytes({POOL_BYTES_ENV: value}) == expected


@pytest.mark.parametrize("value", ["lots", "4X", "-1G", "G", "inf", "nan"])
def test_pool_bytes_rejects_what_is_not_a_byte_count(value):
    with pytest.raises(ValueError, match=POOL_BYTES_ENV):
        pool_bytes({POOL_BYTES_ENV: value})


def test_pool_bytes_default_is_one_gib():
    assert pool_bytes({}) == 1 << 30 and pool_bytes({POOL_BYTES_ENV: ""}) == 1 << 30
