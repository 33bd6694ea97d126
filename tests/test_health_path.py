"""``/api/health`` waits for no thread (issue 25.6): while the users file is unchanged it answers on the
event loop, so neither the default executor, nor AnyIO's thread pool (sync routes), nor the health
thread being busy delays it; a changed users file is still read (and its new mode answered). The
index build asks for the lowest priority.

In process: the real application of :func:`nbmpi.server.app.create_app` (real SQLite file, real users
file) asked through ``httpx.ASGITransport``; structure only, no timing."""
from __future__ import annotations

import asyncio
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import anyio.to_thread
import httpx

from nbmpi.server.accounts import SHARED_WARNING, Accounts
from nbmpi.server.app import create_app
from nbmpi.server.auth import hash_token
from nbmpi.server.routers import service


def _users(path, *names):
    path.write_text(json.dumps({hash_token(f"token-of-{n}-{'x' * 24}"): n for n in names}))


def _touch_later(path, seconds: int = 5) -> None:
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + seconds * 10**9))


async def _health_with_every_pool_taken(app, release: threading.Event) -> dict:
    """GET /api/health while the loop's default executor, AnyIO's thread pool and the health thread are
    all taken by tasks that wait for ``release``; the answer (asked with a 30 s timeout)."""
    loop = asyncio.get_running_loop()
    default = ThreadPoolExecutor(1, thread_name_prefix="test-default")
    loop.set_default_executor(default)
    held = [loop.run_in_executor(None, release.wait, 60),
            loop.run_in_executor(service._HEALTH_THREAD, release.wait, 60)]
    limiter = anyio.to_thread.current_default_thread_limiter()
    borrowers = [object() for _ in range(int(limiter.total_tokens))]
    for b in borrowers:
        await limiter.acquire_on_behalf_of(b)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://nbmpi") as c:
            r = await asyncio.wait_for(c.get("/api/health"), 30)
        assert r.status_code == 200, r.text
        return r.json()
    finally:
        for b in borrowers:
            limiter.release_on_behalf_of(b)
        release.set()
        await asyncio.gather(*held)
        default.shutdown()


def test_health_answers_with_every_thread_pool_taken(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    _users(data / "users.json", "alice")
    app = create_app(data, max_ranks=2, enable_pools=False)
    try:
        health = asyncio.run(_health_with_every_pool_taken(app, threading.Event()))
        assert health["status"] == "ok" and health["isolation"] == "single", health
    finally:
        app.state.service.scheduler.sessions.kw["bind"].dispose()


def test_state_if_current_follows_the_users_file(tmp_path):
    users = tmp_path / "users.json"
    _users(users, "alice")
    acc = Accounts.load(users, unsafe_shared_account=True)
    assert acc.state_if_current() == acc.state() == ("single", None)
    _users(users, "alice", "bob")          # changed: only state() (off the loop) may read it
    _touch_later(users)
    assert acc.state_if_current() is None
    assert acc.state() == ("shared-account", SHARED_WARNING)
    assert acc.state_if_current() == ("shared-account", SHARED_WARNING)
    with acc._lock:                        # another thread is reading it: never wait for it
        assert acc.state_if_current() is None


def test_index_build_command_asks_for_the_lowest_priority():
    from nbmpi.server.trace_index import build_command

    cmd = build_command("/nonexistent/trace", 2)
    assert cmd[-1] == "--nice" and "nbmpi.workers.tracing.index" in cmd


def test_lowest_priority_in_a_session_of_its_own():
    import subprocess
    import sys

    code = ("import os; from nbmpi.workers.tracing.index import lowest_priority; failed = lowest_priority(); "
            "print(failed, os.nice(0), os.sched_getscheduler(0) == os.SCHED_IDLE, os.getsid(0) == os.getpid())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         start_new_session=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[]", "19", "True", "True"], out.stdout
