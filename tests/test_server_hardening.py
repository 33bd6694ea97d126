"""The controller under hostile input and crashes, against a real `nbmpi serve` subprocess (random 127.0.0.1
port, temporary data directory, real SQLite, real mpiexec): hashed tokens, bodies refused before they are
read, odd strings, stored rows no answer can choke on, security headers, crash recovery and idempotent
submits."""
from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psutil
import pytest

from nbmpi.server.auth import hash_token, is_hashed
from test_server import REPO, Server, job_processes, submit, wait_state

MiB = 1 << 20


@pytest.fixture()
def server(tmp_path):
    srv = Server(tmp_path / "data", max_ranks=2).start()
    try:
        yield srv
    finally:
        srv.stop()


# -- tokens --------------------------------------------------------------------------------------
def test_users_file_holds_only_hashes_and_the_token_is_shown_once(tmp_path):
    srv = Server(tmp_path / "data").start()
    try:
        users = json.loads((srv.data_dir / "users.json").read_text())
        assert len(users) == 1 and all(is_hashed(k) for k in users)
        assert srv.token not in (srv.data_dir / "users.json").read_text()
        with srv.client() as c:
            assert c.get("/api/v1/jobs").status_code == 200
        env = dict(os.environ, NBMPI_CONFIG=str(tmp_path / "client.json"))
        cli = [sys.executable, "-m", "nbmpi.server.cli"]
        p = subprocess.run(cli + ["users", "add", "carol", "--data-dir", str(srv.data_dir)], capture_output=True,
                           text=True, timeout=60, env=env)
        assert p.returncode == 0 and "shown only now" in p.stderr, p.stderr
        carol = p.stdout.strip()
        assert carol and carol not in (srv.data_dir / "users.json").read_text()
        with srv.client(carol) as c:   # picked up without a restart
            assert c.get("/api/v1/dashboard/me").json() == {"user": "carol"}
        p = subprocess.run(cli + ["users", "list", "--data-dir", str(srv.data_dir)], capture_output=True, text=True,
                           timeout=60, env=env)
        assert "carol\t1 token(s)" in p.stdout
        p = subprocess.run(cli + ["users", "remove", "carol", "--data-dir", str(srv.data_dir)], capture_output=True,
                           text=True, timeout=60, env=env)
        assert p.returncode == 0
        with srv.client(carol) as c:
            assert c.get("/api/v1/jobs").status_code == 401
    finally:
        srv.stop()
    srv = Server(tmp_path / "data").start()   # restart: the configured token works on
    try:
        with srv.client() as c:
            assert c.get("/api/v1/jobs").status_code == 200
    finally:
        srv.stop()


def test_plain_text_users_file_is_migrated_on_load(tmp_path):
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    old_token = "old-plain-token-0123456789abcdef"
    (data / "users.json").write_text(json.dumps({old_token: "alice"}))
    (tmp_path / "client.json").write_text(json.dumps({"url": "http://127.0.0.1:1", "token": old_token}))
    srv = Server(data).start()
    try:
        users = json.loads((data / "users.json").read_text())
        assert list(users.values()) == ["alice"] and all(is_hashed(k) for k in users)
        assert old_token not in (data / "users.json").read_text()
        assert (data / "users.json").stat().st_mode & 0o777 == 0o600
        assert srv.token == old_token   # the configured token still works and is kept
        with srv.client() as c:
            assert c.get("/api/v1/dashboard/me").json() == {"user": "alice"}
        # a plain token added by hand to the running service's file is migrated as well
        users["another-plain-token-0123456789"] = "bob"
        (data / "users.json").write_text(json.dumps(users))
        with srv.client("another-plain-token-0123456789") as c:
            assert c.get("/api/v1/dashboard/me").json() == {"user": "bob"}
        assert all(is_hashed(k) for k in json.loads((data / "users.json").read_text()))
    finally:
        srv.stop()
