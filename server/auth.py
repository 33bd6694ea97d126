"""Bearer-token authentication of the controller; the users file holds only hashes of tokens.

The users file (``DATA_DIR/users.json`` unless ``nbmpi serve --users`` says
otherwise) is a JSON object mapping a token's hash to its user name::

    {"sha256:9f1c...:5be0...": "alice", "sha256:77aa...:0c41...": "bob"}

A hash is ``sha256:<salt hex>:<hex of sha256(salt + token)>`` (:func:`hash_token`);
a token is 256 random bits (:func:`new_token`), so one salted SHA-256 is
enough to make the file useless for logging in. The token itself is shown
once, when it is made (``nbmpi serve`` on first start, ``nbmpi users add``),
and kept by its user (``nbmpi serve`` also writes it to the client
configuration file, mode 0600). Tokens are checked in constant time
(:func:`hmac.compare_digest` against every entry, no early exit).

A users file written by an older version maps plain tokens to user names.
Such entries are migrated on load: each plain token is replaced by its hash,
the file is rewritten (mode 0600) and a line on stderr says so; the tokens
keep working. The file is re-read whenever it changes on disk, so users can
be added (``nbmpi users add NAME``) without a restart.

An entry's value is a user name, or ``{"user": NAME, "account": UNIX_ACCOUNT}`` to run
that user's jobs as their own UNIX account (:mod:`nbmpi.server.accounts`).
"""
from __future__ import annotations

import getpass
import hashlib
import hmac
import json
import os
import secrets
import sys
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from .accounts import parse_entry
from .config import write_private

#: Shortest plain token accepted in a users file (characters).
MIN_TOKEN_LENGTH = 16
#: The detail of every 401 answer.
UNAUTHORIZED = ("missing or unknown token: send 'Authorization: Bearer TOKEN' with your token (shown once when "
                "it was made; `nbmpi users add NAME` makes a new one)")
#: Prefix of a hashed entry of the users file.
HASH_SCHEME = "sha256"


def new_token() -> str:
    """A fresh random token (43 URL-safe characters, 256 bits), never starting with ``-``: a command line
    (``nbmpi ... --token T``, ``%distributed connect URL --token T``) would read that as an option."""
    while True:
        token = secrets.token_urlsafe(32)
        if not token.startswith("-"):
            return token


def hash_token(token: str, salt: Optional[bytes] = None) -> str:
    """The users-file entry of ``token``: ``sha256:<salt hex>:<digest hex>`` (a fresh salt unless given)."""
    salt = secrets.token_bytes(16) if salt is None else salt
    return f"{HASH_SCHEME}:{salt.hex()}:{hashlib.sha256(salt + token.encode()).hexdigest()}"


def _parse_hash(entry: str) -> Optional[Tuple[bytes, bytes]]:
    """``(salt, digest)`` of a hashed entry, None if ``entry`` is not one."""
    parts = entry.split(":")
    if len(parts) != 3 or parts[0] != HASH_SCHEME:
        return None
    try:
        salt, digest = bytes.fromhex(parts[1]), bytes.fromhex(parts[2])
    except ValueError:
        return None
    return (salt, digest) if len(digest) == 32 and salt else None


def is_hashed(entry: str) -> bool:
    """Whether a users-file key is a token hash (else it is an old plain token)."""
    return _parse_hash(entry) is not None


def token_matches(token: str, entry: str) -> bool:
    """Whether ``token`` is the one hashed as ``entry`` (constant time in the token's content)."""
    parsed = _parse_hash(entry)
    if parsed is None:
        return False
    salt, digest = parsed
    return hmac.compare_digest(hashlib.sha256(salt + token.encode()).digest(), digest)


def _read(path: Path) -> Dict[str, str]:
    try:
        data = json.loads(Path(path).read_text())
    except ValueError as exc:
        raise ValueError(f"users file {path} is not valid JSON ({exc}); expected "
                         '{"sha256:<salt>:<hash>": "<user name>", ...}; add users with `nbmpi users add NAME`'
                         ) from None
    if not isinstance(data, dict):
        raise ValueError(f"users file {path} must hold a JSON object mapping token hashes to user names")
    for key, entry in data.items():
        try:   # "alice", or {"user": "alice", "account": UNIX_ACCOUNT} (see nbmpi.server.accounts)
            user, _ = parse_entry(entry)
        except ValueError as exc:
            raise ValueError(f"users file {path}: {exc}") from None
        if not is_hashed(key) and len(key) < MIN_TOKEN_LENGTH:
            raise ValueError(f"users file {path}: token of user {user!r} is neither a hash "
                             f"({HASH_SCHEME}:<salt>:<hash>) nor a plain token of at least {MIN_TOKEN_LENGTH} "
                             "characters; make a new one with `nbmpi users add NAME`")
    return data


def load_entries(path: Path, migrate: bool = True) -> Dict[str, Any]:
    """Read and check a users file: ``{token hash: entry}``, an entry being a user name or
    ``{"user": NAME, "account": UNIX_ACCOUNT}``.

    Plain tokens of an older file are hashed and the file rewritten (when ``migrate``; a line
    on stderr names the users); without ``migrate`` they are returned hashed and the file is
    left as it is. Raises ValueError naming what is wrong with the file."""
    data = _read(path)
    plain = [key for key in data if not is_hashed(key)]
    if not plain:
        return data
    entries = {(key if is_hashed(key) else hash_token(key)): entry for key, entry in data.items()}
    if migrate:
        write_users(path, entries)
        names = ", ".join(sorted({parse_entry(data[k])[0] for k in plain}))
        print(f"nbmpi: users file {path} held {len(plain)} plain-text token(s) (users: {names}); they are now "
              "stored as salted SHA-256 hashes and keep working. Keep the tokens themselves safe: they "
              "cannot be read back from the file", file=sys.stderr, flush=True)
    return entries


def load_users(path: Path, migrate: bool = True) -> Dict[str, str]:
    """``{token hash: user name}`` of the users file (see :func:`load_entries`)."""
    return {key: parse_entry(entry)[0] for key, entry in load_entries(path, migrate).items()}


def write_users(path: Path, users: Dict[str, Any]) -> None:
    """Write the users file ``{token hash: entry}`` atomically, mode 0600."""
    write_private(Path(path), json.dumps(users, indent=2) + "\n")


def add_token(path: Path, user: str) -> str:
    """Make a new token for ``user`` (a new user, or another token of a known one), store its hash
    in the users file (created if missing) and return the token: the only time it is shown."""
    if not user or not isinstance(user, str) or any(c in user for c in "\x00\n") or len(user) > 128:
        raise ValueError(f"user name {user!r} must be 1 to 128 characters without NUL or newline")
    path = Path(path)
    entries = load_entries(path) if path.exists() else {}
    known = [e for e in entries.values() if parse_entry(e)[0] == user]
    token = new_token()
    entries[hash_token(token)] = known[0] if known else user    # a known user keeps their account
    write_users(path, entries)
    return token


def remove_user(path: Path, user: str) -> int:
    """Remove every token of ``user`` from the users file; returns how many were removed."""
    entries = load_entries(path)
    kept = {k: e for k, e in entries.items() if parse_entry(e)[0] != user}
    if len(kept) != len(entries):
        write_users(path, kept)
    return len(entries) - len(kept)


def ensure_users_file(path: Path) -> Tuple[Optional[str], bool]:
    """Create the users file with one token for the current OS user if it is missing.

    Returns ``(token, True)`` on first start (the token is shown to the operator once, only its
    hash is stored); else ``(None, False)`` after migrating plain tokens of an older file."""
    path = Path(path)
    if path.exists():
        load_users(path)
        return None, False
    return add_token(path, getpass.getuser()), True


class Authenticator:
    """Maps a bearer token to its user; reloads (and migrates) the users file when it changes.
    Thread-safe; :meth:`user_for` does not block beyond a ``stat`` of the file."""

    def __init__(self, users_path: Path):
        self.path = Path(users_path)
        self._lock = threading.Lock()
        self._mtime: Optional[int] = None
        self._users: List[Tuple[str, str]] = []
        self._reload()

    def _reload(self) -> None:
        try:
            mtime = os.stat(self.path).st_mtime_ns
        except FileNotFoundError:
            self._users, self._mtime = [], None
            return
        if mtime != self._mtime:
            self._users = list(load_users(self.path).items())
            self._mtime = os.stat(self.path).st_mtime_ns   # after a migration rewrote it

    def user_for(self, token: Optional[str]) -> Optional[str]:
        """The user owning ``token``, or None. Constant-time over all known tokens."""
        with self._lock:
            try:
                self._reload()
            except (ValueError, OSError):
                pass  # keep the last good table; the error shows at the next start
            users = list(self._users)
        if not token:
            return None
        found: Optional[str] = None
        for entry, user in users:
            if token_matches(token, entry):
                found = user
        return found
