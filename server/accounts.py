"""Which UNIX account runs each user's jobs and pools: the controller's isolation of users.

The users file (:mod:`nbmpi.server.auth`) maps each token to a user; an entry may also
name the user's UNIX account::

    {"<token of alice>": {"user": "alice", "account": "alice"},
     "<token of bob>":   {"user": "bob", "account": "bob"}}

(a plain ``"<token>": "alice"`` entry is a user without an account). The service is in
one of three modes (:attr:`Accounts.mode`), fixed when it starts:

* ``single``: one user (the default); everything runs as the service's own account,
  as it always did; no root needed.
* ``accounts``: several users, each with their own account, the service run by root.
  Every rank, engine and helper process of a user's job or pool is started as that
  account (:class:`~nbmpi.workers.launch.identity.Identity`: groups cleared, gid,
  uid dropped in the child before ``exec``, the account's HOME); the job's or pool's
  directory is given to it with mode 0700; the data directory is traversable but not
  listable (0711) and the records database and users file are root's alone (0600), so a
  job cannot read them nor another user's directory.
* ``shared-account``: several users in one account, only with ``nbmpi serve
  --unsafe-shared-account``: a job can read every other user's files and the tokens.
  ``/api/health`` and the dashboard say so.

Several users without that option and without an account each are refused at start
(:func:`Accounts.load` raises :class:`AccountError` saying what to add), and a user
added to the file later is refused a job or pool until the service can isolate them.
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, Dict, Literal, Optional, Tuple

from nbmpi.workers.launch.identity import Identity
from nbmpi.workers.launch.identity import open_beneath as open_in_job   # noqa: F401 - for the routers

Mode = Literal["single", "accounts", "shared-account"]

#: What ``/api/health`` and the dashboard say in the unsafe mode.
SHARED_WARNING = ("UNSAFE: this service runs every user's jobs in one UNIX account (--unsafe-shared-account): "
                  "a job can read the other users' jobs, the records and the tokens")


class AccountError(ValueError):
    """The users file and the way the service runs do not isolate users; the message says what to do."""


def parse_entry(value: Any) -> Tuple[str, Optional[str]]:
    """``(user, account)`` of one users-file entry: ``"alice"`` or ``{"user": ..., "account": ...}``.
    Raises ValueError naming what is wrong."""
    if isinstance(value, str):
        user, account = value, None
    elif isinstance(value, dict) and set(value) <= {"user", "account"}:
        user, account = value.get("user"), value.get("account")
        if account is not None and (not isinstance(account, str) or not account):
            raise ValueError(f"the account of user {user!r} must be a non-empty string (a UNIX account name)")
    else:
        raise ValueError('an entry must be a user name or {"user": NAME, "account": UNIX_ACCOUNT}')
    if not isinstance(user, str) or not user:
        raise ValueError("the user name for a token must be a non-empty string")
    return user, account


def read_accounts(path: Path) -> Dict[str, Optional[str]]:
    """User -> account (None: none given) of the users file ``path`` (missing: no users)."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return {}
    except ValueError as exc:
        raise AccountError(f"users file {path} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise AccountError(f"users file {path} must hold a JSON object mapping tokens to users")
    out: Dict[str, Optional[str]] = {}
    for value in data.values():
        try:
            user, account = parse_entry(value)
        except ValueError as exc:
            raise AccountError(f"users file {path}: {exc}") from None
        if out.get(user) and account and out[user] != account:
            raise AccountError(f"users file {path}: user {user!r} has two accounts ({out[user]!r}, {account!r})")
        out[user] = out.get(user) or account
    return out


def _identities(table: Dict[str, Optional[str]], path: Path) -> Dict[str, Identity]:
    """Each user's :class:`Identity`; AccountError unless every user has a distinct non-root account."""
    missing = sorted(u for u, a in table.items() if not a)
    if missing:
        raise AccountError(f"users file {path}: users {missing} have no \"account\"; give each user their own "
                           "UNIX account ({\"user\": NAME, \"account\": ACCOUNT}), or pass "
                           "--unsafe-shared-account to run all users in this service's account")
    found: Dict[str, Identity] = {}
    for user, account in table.items():
        try:
            ident = Identity.of(account)
        except ValueError as exc:
            raise AccountError(f"user {user!r}: {exc}") from None
        if ident.uid == 0:
            raise AccountError(f"user {user!r}: account {account!r} is root; give the user an unprivileged account")
        found[user] = ident
    uids: Dict[int, str] = {}
    for user, ident in found.items():
        if ident.uid in uids:
            raise AccountError(f"users {uids[ident.uid]!r} and {user!r} share the account {ident.name!r}; "
                               "give each user their own, or pass --unsafe-shared-account")
        uids[ident.uid] = user
    return found


class Accounts:
    """The service's isolation mode and each user's account (see the module docstring). Thread-safe.

    Build with :meth:`load` when the service starts. :meth:`identity` is called for every job
    and pool, re-reads the users file when it changed, and raises :class:`AccountError` when the
    user cannot be run isolated in this mode."""

    def __init__(self, path: Path, mode: Mode, identities: Dict[str, Identity], unsafe_shared_account: bool = False):
        self.path = Path(path)
        self.mode: Mode = mode
        #: The operator allowed several users in one account (a single-user service then becomes
        #: ``shared-account`` when users are added to the file, instead of refusing them).
        self.unsafe_shared_account = unsafe_shared_account
        self._identities = identities
        self._lock = threading.Lock()
        self._mtime = self._stat()
        self._problem: Optional[AccountError] = None

    @classmethod
    def load(cls, users_path: Path, unsafe_shared_account: bool = False) -> "Accounts":
        """The accounts of ``users_path`` for a service that starts now; AccountError when it must not
        start (several users, not isolated, no ``unsafe_shared_account``)."""
        table = read_accounts(users_path)
        if len(table) <= 1 and not any(table.values()):
            return cls(users_path, "single", {}, unsafe_shared_account)
        try:
            if os.geteuid() != 0:
                raise AccountError(f"users file {users_path} names {len(table)} users (or an account): running "
                                   "each user's jobs as their own UNIX account needs this service to run as root")
            return cls(users_path, "accounts", _identities(table, Path(users_path)))
        except AccountError:
            if unsafe_shared_account:
                return cls(users_path, "shared-account", {}, True)
            raise

    def _stat(self) -> Optional[int]:
        try:
            return os.stat(self.path).st_mtime_ns
        except OSError:
            return None

    def _refresh(self) -> Optional[AccountError]:
        """Re-read the users file if it changed (caller holds the lock); the reason the service now
        cannot run its users, or None."""
        mtime = self._stat()
        if mtime != self._mtime:
            self._mtime = mtime
            self._problem = None
            try:
                table = read_accounts(self.path)
                if self.mode == "accounts":
                    self._identities = _identities(table, self.path)
                elif self.mode == "single" and len(table) > 1 and self.unsafe_shared_account:
                    self.mode = "shared-account"
                elif self.mode == "single" and len(table) > 1:
                    raise AccountError(f"the users file {self.path} now names {len(table)} users but this service "
                                       "started with one: restart nbmpi serve so that it isolates them "
                                       "(an account per user, as root) or pass --unsafe-shared-account")
            except AccountError as exc:
                self._problem = exc
        return self._problem

    def identity(self, user: str) -> Optional[Identity]:
        """The account ``user``'s processes run as (None: the service's own). Raises AccountError."""
        with self._lock:
            problem = self._refresh()
            if problem is not None:
                raise AccountError(str(problem))
            if self.mode != "accounts":
                return None
            try:
                return self._identities[user]
            except KeyError:
                raise AccountError(f"user {user!r} has no account in the users file {self.path}") from None

    def hand_over(self, path: Path, user: str) -> Optional[Identity]:
        """Give ``path`` (a directory the service just made for ``user``) to the user's account,
        mode 0700; nothing in the single-account modes. Returns the identity."""
        ident = self.identity(user)
        if ident is not None:
            ident.own(path)
        return ident

    def state(self) -> Tuple[Mode, Optional[str]]:
        """The mode now (the users file re-read if it changed) and what the service must tell
        everyone about it (None when nothing): the unsafe shared account, or why users are refused."""
        with self._lock:
            problem = self._refresh()
            mode = self.mode
        return self._told(mode, problem)

    def state_if_current(self) -> Optional[Tuple[Mode, Optional[str]]]:
        """:meth:`state` when the users file is unchanged since it was last read and no other thread
        holds the lock; None otherwise (then call :meth:`state`, off the event loop: it reads the file).
        Never waits: one ``stat``; the event loop calls it, so ``/api/health`` needs no thread."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if self._stat() != self._mtime:
                return None
            problem, mode = self._problem, self.mode
        finally:
            self._lock.release()
        return self._told(mode, problem)

    @staticmethod
    def _told(mode: Mode, problem: Optional[AccountError]) -> Tuple[Mode, Optional[str]]:
        if problem is not None:
            return mode, f"jobs and pools are refused: {problem}"
        return mode, SHARED_WARNING if mode == "shared-account" else None

    def warning(self) -> Optional[str]:
        """The second half of :meth:`state`."""
        return self.state()[1]


def protect_data_dir(data_dir: Path, db_path: Path, users_path: Path) -> None:
    """Modes of a service isolating users by account: the data directory and ``jobs/`` traversable
    by the accounts but not listable (0711), the database and the users file root's alone (0600).
    The caller also sets the umask to 077 so files SQLite creates later are root's alone too.
    AccountError when a directory above ``data_dir`` stops the accounts (:func:`check_reachable`)."""
    check_reachable(data_dir)
    for d in (data_dir, data_dir / "jobs", data_dir / "pools"):
        if d.is_dir():
            os.chmod(d, 0o711)
    for f in (db_path, users_path, Path(f"{db_path}-wal"), Path(f"{db_path}-shm"), Path(f"{db_path}-journal")):
        if f.exists():
            os.chmod(f, 0o600)


def check_reachable(data_dir: Path) -> None:
    """AccountError unless every directory above ``data_dir`` lets other accounts pass (``o+x``):
    the accounts must reach their job directories inside it."""
    for d in [*reversed(Path(data_dir).parents)]:
        if not os.stat(d).st_mode & 0o001:
            raise AccountError(f"the users' accounts cannot reach the data directory {data_dir}: {d} is not "
                               f"traversable by others; chmod o+x {d} or choose a --data-dir elsewhere")


def check_runnable() -> None:
    """AccountError unless other accounts can run this Python and import nbmpi: the ranks of every
    user run ``sys.executable -m nbmpi.workers.launch.rank_entry`` as the user's account."""
    import sys

    import nbmpi.workers

    for what, path, bits in (("the Python interpreter", os.path.realpath(sys.executable), 0o005),
                             ("the nbmpi package", os.path.realpath(os.path.dirname(nbmpi.workers.__file__)),
                              0o005)):
        for d in [*reversed(Path(path).parents), Path(path)]:
            mode = os.stat(d).st_mode
            need = bits if d == Path(path) else 0o001
            if mode & need != need:
                raise AccountError(f"the users' accounts cannot use {what} {path}: {d} is not readable or "
                                   f"traversable by others; install nbmpi (and its Python) where every "
                                   "account can read it, e.g. a virtual environment under /opt")
