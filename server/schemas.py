"""Request and response bodies of the controller's HTTP API (pydantic v2).

Requests reject unknown fields (``extra="forbid"``), bound every size and refuse
strings that cannot be stored or run (NUL, lone surrogates: :mod:`nbmpi.server.text`;
environment names the OS cannot take), so a malformed request is answered 422
with the offending field named, never 500.
Limits that depend on the service's configuration (``--max-ranks``) are
checked by the routes and also answered 422.
"""
from __future__ import annotations

import re
from typing import Any, Dict, List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from .config import MAX_CODE_BYTES
from .text import printable, problem

JobState = Literal["queued", "running", "succeeded", "failed", "cancelled", "timed_out", "lost"]
PoolState = Literal["starting", "running", "stopping", "stopped", "failed"]
#: A valid environment variable name.
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: JSON schema pattern of a string without NUL (request strings also refuse lone surrogates).
NO_NUL = "^[^\\x00]*$"
#: The JSON schema of one program argument or environment value (what the validators enforce).
ARG_SCHEMA = {"type": "string", "maxLength": 4096, "pattern": NO_NUL}
#: A plain script file name (no directories).
SCRIPT_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}\.py$")


#: JSON schema: a job names its ranks, its pool, or both (not null).
RANKS_OR_POOL = [{"required": ["ranks"], "properties": {"ranks": {"type": "integer"}}},
                 {"required": ["pool"], "properties": {"pool": {"type": "integer"}}}]
#: Largest record id and rank count a request may name.
MAX_ID = 2**53 - 1   # exact as a JSON number (a double) as well
MAX_RANKS = 1 << 20


def _where(field: str, key: Any) -> str:
    return f"{field}[{key!r}]" if isinstance(key, str) else f"{field}[{key}]"


def _check_strings(field: str, value: Any) -> None:
    """Raise ValueError naming ``field`` (and the item) if a string in ``value`` cannot be stored or run."""
    if isinstance(value, str):
        why = problem(value)
        if why:
            raise ValueError(f"{field} {why}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_strings(_where(field, i), item)
    elif isinstance(value, dict):
        for key, item in value.items():
            why = problem(key) if isinstance(key, str) else None
            if why:
                raise ValueError(f"a name in {field} ({printable(key)!r}) {why}")
            _check_strings(_where(field, printable(key)), item)


class _Strict(BaseModel):
    """A request body: unknown fields and strings that cannot be stored or run are refused (422)."""
    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="after")
    @classmethod
    def _storable(cls, v: Any, info: ValidationInfo) -> Any:
        _check_strings(info.field_name, v)
        return v


class JobCreate(_Strict):
    """``POST /api/v1/jobs``: run ``code`` on ``ranks`` ranks (a batch MPI run), or on a pool.
    Give ``ranks``, ``pool``, or both (then they must agree)."""
    model_config = ConfigDict(extra="forbid", json_schema_extra={"anyOf": RANKS_OR_POOL})
    code: str = Field(min_length=1, max_length=MAX_CODE_BYTES,
                      description="Python source of the program (what a script file would hold); UTF-8 text "
                                  "without NUL characters (Python runs no source with one).")
    script_name: str = Field("job.py", description="File name the code is saved as (ends in .py).",
                             json_schema_extra={"pattern": SCRIPT_NAME.pattern})
    ranks: Optional[int] = Field(None, ge=1, le=MAX_RANKS, description="Number of ranks. Required without a "
                                 "pool; with a pool it defaults to (and must equal) the pool's ranks.")
    pool: Optional[int] = Field(None, ge=1, le=MAX_ID, description="Run on the ranks of this pool (id).")
    timeout: Optional[float] = Field(None, gt=0, le=7 * 86400, description="Seconds; then all ranks end, "
                                     "state timed_out.")
    args: List[str] = Field(default_factory=list, max_length=256, description="sys.argv[1:] of the program.",
                            json_schema_extra={"items": ARG_SCHEMA})
    env: Dict[str, str] = Field(default_factory=dict, description="Extra environment variables of every rank.",
                                json_schema_extra={"maxProperties": 256, "additionalProperties": ARG_SCHEMA,
                                                   "propertyNames": {"pattern": ENV_NAME.pattern}})
    name: Optional[str] = Field(None, max_length=256, description="Free label.",
                                json_schema_extra={"pattern": NO_NUL})

    @field_validator("code")
    @classmethod
    def _code_size(cls, v: str) -> str:
        if len(v.encode("utf-8", "surrogatepass")) > MAX_CODE_BYTES:
            raise ValueError(f"code is larger than {MAX_CODE_BYTES} bytes; upload a smaller script")
        return v

    @field_validator("script_name")
    @classmethod
    def _script_name(cls, v: str) -> str:
        if not SCRIPT_NAME.fullmatch(v):
            raise ValueError("script_name must be a plain file name ending in .py "
                             "(letters, digits, '_', '-', '.'), e.g. 'train.py'")
        return v

    @field_validator("args")
    @classmethod
    def _args(cls, v: List[str]) -> List[str]:
        if any(len(a) > 4096 or "\x00" in a for a in v):
            raise ValueError("each argument must be at most 4096 characters without NUL bytes")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: Dict[str, str]) -> Dict[str, str]:
        if len(v) > 256:
            raise ValueError("at most 256 environment variables")
        for k, val in v.items():
            if not ENV_NAME.fullmatch(k):
                raise ValueError(f"environment variable name {printable(k)!r} is invalid (the OS takes no '=' or "
                                 "NUL in a name); use letters, digits and '_', not starting with a digit")
            if len(val) > 4096 or "\x00" in val:
                raise ValueError(f"value of {k} must be at most 4096 characters without NUL bytes")
        return v


class JobInfo(BaseModel):
    """A job record."""
    id: int
    owner: str
    name: Optional[str]
    state: JobState
    ranks: int
    pool: Optional[int]
    script_name: str
    args: List[str]
    timeout: Optional[float]
    created_at: float = Field(description="Unix seconds.")
    started_at: Optional[float]
    finished_at: Optional[float]
    exit_code: Optional[int] = Field(description="Worst exit code of the ranks that ended on their own "
                                     "(124 timed out, 130 cancelled); null while live.")
    rank_exit_codes: Optional[List[Optional[int]]] = Field(
        description="Exit code of each rank; null for a rank that was terminated or never reported.")
    message: Optional[str]
    log_dir: str
    trace_available: bool


class JobList(BaseModel):
    jobs: List[JobInfo]


class PoolCreate(_Strict):
    """``POST /api/v1/pools``: start an MPI pool of ``ranks`` engines."""
    ranks: int = Field(ge=1, le=MAX_RANKS)
    name: Optional[str] = Field(None, max_length=128, pattern=r"^[A-Za-z0-9_.-]+$")
    idle_timeout: Optional[float] = Field(None, gt=0, le=30 * 86400,
                                          description="Seconds without a job before the pool is stopped.")


class PoolInfo(BaseModel):
    """A pool record; ``connection`` is what ``%distributed connect`` needs."""
    id: int
    owner: str
    name: Optional[str]
    ranks: int
    target: Literal["running", "stopped"]
    state: PoolState
    idle_timeout: Optional[float]
    created_at: float
    started_at: Optional[float]
    stopped_at: Optional[float]
    last_used_at: Optional[float]
    message: Optional[str]
    connection: Optional[Dict[str, Any]]


class PoolList(BaseModel):
    pools: List[PoolInfo]


class Health(BaseModel):
    status: Literal["ok"]
    #: How users are kept apart: "single" (one user), "accounts" (each user's own UNIX account),
    #: "shared-account" (several users in one account: unsafe, see ``warning``).
    isolation: Literal["single", "accounts", "shared-account"] = "single"
    warning: Optional[str] = None
    #: How nothing a job or pool starts outlives it, in one phrase: "cgroup: ..." (a cgroup per job
    #: and pool, everything in it ended with it) or "subreaper only: ..." (each rank's guard).
    containment: Optional[str] = None


class Version(BaseModel):
    version: str
    api: str


class Cancelled(BaseModel):
    id: int
    state: JobState


class FieldError(BaseModel):
    """One invalid field of a request: where (``loc``), what is wrong (``msg``), the error's ``type``."""
    loc: List[Union[str, int]]
    msg: str
    type: str


class ErrorBody(BaseModel):
    """The body of every error answer (4xx and 5xx): ``detail`` says what was wrong and what to do;
    for invalid fields (422) ``errors`` lists each one."""
    detail: str
    errors: Optional[List[FieldError]] = None


class Me(BaseModel):
    """The user a token belongs to."""
    user: str


class TimelineWindow(BaseModel):
    """A window of a job's timeline figure (``GET /api/v1/dashboard/jobs/{id}/timeline``).

    ``available`` is false (with ``reason``) while nothing was streamed. ``version`` changes
    whenever a rank streamed new events or started or stopped waiting; asked with ``since`` equal
    to it, the answer is ``unchanged`` and carries nothing else. ``sources``: the column data of
    the figure's named sources (segments, arrows, arrow heads, matrix, fractions) for the window
    ``meta`` describes (level of detail: ``shown`` rows of ``in_window`` segments). ``sentence``
    names the straggler; ``blocked`` says where each rank waits and for whom (``waits`` raw).
    """
    job: int
    state: JobState
    live: bool
    available: bool
    reason: Optional[str] = None
    version: Optional[int] = None
    unchanged: bool = False
    meta: Optional[Dict[str, Any]] = None
    sources: Optional[Dict[str, Dict[str, List[Any]]]] = None
    sentence: Optional[str] = None
    straggler: Optional[Dict[str, Any]] = None
    blocked: List[str] = Field(default_factory=list)
    waits: List[Dict[str, Any]] = Field(default_factory=list)
    analysis: Optional[Dict[str, Any]] = None


class JobFigure(TimelineWindow):
    """A job's whole timeline figure: ``item`` is Bokeh's JSON item (``Bokeh.embed.embed_item``), its
    timeline sources empty: the page sets them from ``sources``."""
    item: Optional[Dict[str, Any]] = None
