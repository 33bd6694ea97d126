"""Bearer-token authentication of the controller.

The users file (``DATA_DIR/users.json`` unless ``nbmpi serve --users`` says
otherwise) is a JSON object mapping tokens to user names::

    {"3q2...": "alice", "Zx9...": "bob"}

or, to run each user's jobs as their own UNIX account (:mod:`nbmpi.server.accounts`)::

    {"3q2...": {"user": "alice", "account": "alice"}, "Zx9...": {"user": "bob", "account": "bob"}}

On first start, if the file does not exist, one token is generated for the
user running the service, the file is written with mode 0600 (owner only)
and the token is printed. The file is re-read whenever it changes on disk, so
users can be added without a restart. Tokens are compared in constant time
(:func:`hmac.compare_digest`, against every known token, no early exit).
"""
from __future__ import annotations

import getpass
import hmac
import json
import os
import secrets
import threading
from pathlib import Path
from typing import Dict, Optional, Tuple

from .accounts import parse_entry
from .config import write_private

#: Shortest token accepted in a users file (characters).
MIN_TOKEN_LENGTH = 16


def new_token() -> str:
    """A fresh random token (43 URL-safe characters, 256 bits)."""
    return secrets.token_urlsafe(32)


def ensure_users_file(path: Path) -> Tuple[Optional[str], bool]:
    """Create the users file with one token for the current OS user if it is missing.

    Returns ``(token, created)``: the new token and True on first start; else
    ``(first token of the file, False)``.
    """
    path = Path(path)
    if path.exists():
        users = load_users(path)
        return (next(iter(users)) if users else None), False
    token = new_token()
    write_private(path, json.dumps({token: getpass.getuser()}, indent=2) + "\n")
    return token, True


def load_users(path: Path) -> Dict[str, str]:
    """Read and check a users file: a JSON object ``{token: user name}``."""
    try:
        data = json.loads(Path(path).read_text())
    except ValueError as exc:
        raise ValueError(f"users file {path} is not valid JSON ({exc}); expected "
                         '{"<token>": "<user name>", ...}') from None
    if not isinstance(data, dict):
        raise ValueError(f"users file {path} must hold a JSON object mapping tokens to user names")
    users: Dict[str, str] = {}
    for tok, entry in data.items():
        try:   # "alice", or {"user": "alice", "account": UNIX_ACCOUNT} (see nbmpi.server.accounts)
            user, _ = parse_entry(entry)
        except ValueError as exc:
            raise ValueError(f"users file {path}: {exc}") from None
        users[tok] = user
        if len(tok) < MIN_TOKEN_LENGTH:
            raise ValueError(f"users file {path}: token of user {user!r} is shorter than "
                             f"{MIN_TOKEN_LENGTH} characters; generate one with "
                             "python -c 'import secrets; print(secrets.token_urlsafe(32))'")
    return users


class Authenticator:
    """Maps a bearer token to its user; reloads the users file when it changes."""

    def __init__(self, users_path: Path):
        self.path = Path(users_path)
        self._lock = threading.Lock()
        self._mtime: Optional[float] = None
        self._users: Dict[str, str] = {}
        self._reload()

    def _reload(self) -> None:
        try:
            mtime = os.stat(self.path).st_mtime_ns
        except FileNotFoundError:
            self._users, self._mtime = {}, None
            return
        if mtime != self._mtime:
            self._users = load_users(self.path)
            self._mtime = mtime

    def user_for(self, token: Optional[str]) -> Optional[str]:
        """The user owning ``token``, or None. Constant-time over all known tokens."""
        with self._lock:
            try:
                self._reload()
            except ValueError:
                pass  # keep the last good table; the error shows at the next start
            users = list(self._users.items())
        if not token:
            return None
        given = token.encode()
        found: Optional[str] = None
        for known, user in users:
            if hmac.compare_digest(given, known.encode()):
                found = user
        return found
