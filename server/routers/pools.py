"""Routes of pools: create (blocks until running), list, get, stop.

Every route needs a bearer token; a user only sees their own pools (another
user's id is answered 404). A service started with ``--no-pools`` answers 501.
"""
from __future__ import annotations

from fastapi import APIRouter, Depends

from ..dependencies import current_user, get_pools, user_pool
from ..errors import DOCUMENTED
from ..pool_manager import PoolManager
from ..records import PoolRow
from ..schemas import ErrorBody, PoolCreate, PoolInfo, PoolList
router = APIRouter(prefix="/api/v1/pools", tags=["pools"],
                   responses={**DOCUMENTED, 501: {"model": ErrorBody, "description": "Pools are disabled on "
                                                                                     "this service"}})


@router.post("", response_model=PoolInfo, status_code=201,
             responses={409: {"model": ErrorBody, "description": "Not enough free ranks"}})
def create_pool(req: PoolCreate, user: str = Depends(current_user),
                pools: PoolManager = Depends(get_pools)) -> PoolInfo:
    """Start an MPI pool of ``ranks`` engines (blocks until it runs or failed); the answer's
    ``connection`` is what ``%distributed connect`` uses."""
    return pools.create(user, req)


@router.get("", response_model=PoolList)
def list_pools(user: str = Depends(current_user), pools: PoolManager = Depends(get_pools)) -> PoolList:
    """The caller's pools (real state, reconciled with the engines)."""
    return PoolList(pools=pools.list(user))


@router.get("/{pool_id:int}", response_model=PoolInfo)
def get_pool(row: PoolRow = Depends(user_pool), pools: PoolManager = Depends(get_pools)) -> PoolInfo:
    """One pool with its connection info."""
    return pools.info(row.owner, row.id)


@router.delete("/{pool_id:int}", response_model=PoolInfo,
               responses={200: {"description": "The pool after it stopped. The record is kept: GET keeps "
                                               "answering it (state stopped), and a repeated DELETE changes "
                                               "nothing"}})
def delete_pool(row: PoolRow = Depends(user_pool), pools: PoolManager = Depends(get_pools)) -> PoolInfo:
    """Stop a pool (its engines end); the record stays, state ``stopped`` (it is not removed)."""
    return pools.delete(row.owner, row.id)
