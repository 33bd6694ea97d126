"""The controller's records in SQLite (SQLAlchemy 2), journal mode WAL.

Two tables: ``jobs`` and ``pools``. Each row names its owner (user name from
the users file), its state, timestamps (Unix seconds), the paths of its files
(job directory, logs, trace) and the backend that runs it with that
backend's opaque state (``backend_state``: a JSON object only the backend
reads, e.g. a process group for the local backend or a Slurm job id). Exit
codes per rank are stored as a JSON list. A job submitted with an
``Idempotency-Key`` keeps it (unique per owner) with a digest of its request. Every state change is committed at
once, so a restart of the service finds every record
(:meth:`nbmpi.server.scheduler.Scheduler.recover` decides what happens to
jobs that were running).

Older databases are upgraded in place at open (missing columns are added).
Rows are read whatever they hold: text that is not UTF-8 is decoded with U+FFFD
and a JSON column that is not JSON reads as None.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, List, Optional

from sqlalchemy import JSON, Float, Integer, String, Text, create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

#: Job states. ``queued`` and ``running`` are live; the others are final.
JOB_STATES = ("queued", "running", "succeeded", "failed", "cancelled", "timed_out", "lost")
FINAL_JOB_STATES = frozenset(JOB_STATES[2:])
#: Pool states (``state`` is the real state; ``target`` what the owner asked for).
POOL_STATES = ("starting", "running", "stopping", "stopped", "failed")


class Base(DeclarativeBase):
    pass


class Job(Base):
    """One job: a program run on ``ranks`` ranks, as a batch mpiexec run or on a pool."""
    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    owner: Mapped[str] = mapped_column(String(128), index=True)
    name: Mapped[Optional[str]] = mapped_column(String(256), nullable=True)
    state: Mapped[str] = mapped_column(String(16), index=True, default="queued")
    ranks: Mapped[int] = mapped_column(Integer)
    pool_id: Mapped[Optional[int]] = mapped_column(Integer, nullable=True)
    script_name: Mapped[str] = mapped_column(String(256), default="job.py")
    args: Mapped[List[str]] = mapped_column(JSON, default=list)
    env: Mapped[dict] = mapped_column(JSON, default=dict)
    timeout: Mapped[Optional[float]] = mapped_column(Float, nullable=True)
    created_at: Mapped[float] = mapped_column(Float, default=time.time)
    started_at: Mapped[Optional[float]] = mapped_column(Float, nullable=True)
    finished_at: Mapped[Optional[float]] = mapped_column(Float, nullable=True)
    exit_code: Mapped[Optional[int]] = mapped_column(Integer, nullable=True)
    rank_exit_codes: Mapped[Optional[List[Optional[int]]]] = mapped_column(JSON, nullable=True)
    #: Name of the backend that runs the job, and its opaque state (None until submitted to it).
    backend: Mapped[Optional[str]] = mapped_column(String(32), nullable=True)
    backend_state: Mapped[Optional[dict]] = mapped_column(JSON, nullable=True)
    job_dir: Mapped[str] = mapped_column(Text, default="")
    script_path: Mapped[str] = mapped_column(Text, default="")
    log_dir: Mapped[str] = mapped_column(Text, default="")
    trace_path: Mapped[Optional[str]] = mapped_column(Text, nullable=True)
    summary_path: Mapped[Optional[str]] = mapped_column(Text, nullable=True)
    message: Mapped[Optional[str]] = mapped_column(Text, nullable=True)
    #: The submitter's ``Idempotency-Key`` (unique per owner) and the digest of the request it came with.
    idempotency_key: Mapped[Optional[str]] = mapped_column(String(255), nullable=True)
    request_digest: Mapped[Optional[str]] = mapped_column(String(64), nullable=True)


class PoolRow(Base):
    """One MPI pool (ipyparallel engines on MPI ranks) started by the controller."""
    __tablename__ = "pools"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    owner: Mapped[str] = mapped_column(String(128), index=True)
    name: Mapped[Optional[str]] = mapped_column(String(256), nullable=True)
    ranks: Mapped[int] = mapped_column(Integer)
    target: Mapped[str] = mapped_column(String(16), default="running")
    state: Mapped[str] = mapped_column(String(16), default="starting")
    idle_timeout: Mapped[Optional[float]] = mapped_column(Float, nullable=True)
    created_at: Mapped[float] = mapped_column(Float, default=time.time)
    started_at: Mapped[Optional[float]] = mapped_column(Float, nullable=True)
    stopped_at: Mapped[Optional[float]] = mapped_column(Float, nullable=True)
    last_used_at: Mapped[Optional[float]] = mapped_column(Float, nullable=True)
    work_dir: Mapped[str] = mapped_column(Text, default="")
    connection: Mapped[Optional[dict]] = mapped_column(JSON, nullable=True)
    message: Mapped[Optional[str]] = mapped_column(Text, nullable=True)
    backend: Mapped[Optional[str]] = mapped_column(String(32), nullable=True)
    backend_state: Mapped[Optional[dict]] = mapped_column(JSON, nullable=True)


def _text(raw: bytes) -> str:
    """SQLite text as str; bytes that are not UTF-8 (written by hand or another program) become U+FFFD."""
    return raw.decode("utf-8", "replace")


def _json_or_none(text: str) -> Any:
    """A JSON column's value; None when the stored text is not JSON (the view shows it as missing)."""
    try:
        return json.loads(text)
    except ValueError:
        return None


def make_engine(path: Path) -> Engine:
    """A SQLAlchemy engine on the SQLite file ``path`` with WAL, a busy timeout and
    foreign-thread use allowed (the service's request threads and its scheduler share it)."""
    engine = create_engine(f"sqlite:///{Path(path)}", connect_args={"check_same_thread": False, "timeout": 30},
                           json_deserializer=_json_or_none)

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.text_factory = _text   # a row with bytes that are not UTF-8 must still load
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.close()

    Base.metadata.create_all(engine)
    _add_missing_columns(engine)
    with engine.begin() as conn:   # one job per owner and key (NULL keys are all distinct)
        conn.exec_driver_sql("CREATE UNIQUE INDEX IF NOT EXISTS ix_jobs_owner_idempotency_key "
                             "ON jobs (owner, idempotency_key)")
    return engine


def _add_missing_columns(engine: Engine) -> None:
    """Upgrade a database written by an older version: add the columns it lacks (all nullable)."""
    with engine.begin() as conn:
        for table in Base.metadata.sorted_tables:
            have = {row[1] for row in conn.exec_driver_sql(f"PRAGMA table_info({table.name})")}
            for col in table.columns:
                if col.name not in have:
                    ddl = col.type.compile(dialect=engine.dialect)
                    conn.exec_driver_sql(f"ALTER TABLE {table.name} ADD COLUMN {col.name} {ddl}")


def session_factory(engine: Engine) -> sessionmaker:
    """Sessions that keep loaded attributes after commit (records are read after writes)."""
    return sessionmaker(engine, expire_on_commit=False)
