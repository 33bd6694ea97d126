"""The UNIX account a launch runs as, when a controller run by root serves several users.

An :class:`Identity` is a UNIX account looked up once (``pwd``): its uid, primary gid and
home. The processes nbmpi starts for a user (mpiexec and every rank, pool engines and
their ipyparallel controller, ``sbatch``) get :meth:`Identity.popen_options` (subprocess
drops the groups, gid and uid in the child before ``exec``: ``setgroups([])``,
``setgid``, ``setuid``) and :meth:`Identity.environment` (HOME, USER, LOGNAME, SHELL
of the account; the launching service's own secrets removed). :meth:`Identity.own`
gives a directory to the account with mode 0700 so no other account can read it.

``None`` for an identity means "as the launching process itself" everywhere in
:mod:`nbmpi.workers.launch`: one user, the default, needs no root.
"""
from __future__ import annotations

import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .environment import SERVICE_VARIABLES

#: Variables of the launching service that never reach a rank running as another account
#: (the service's tokens, configuration, data directory, and root's own session).
SERVICE_ONLY = SERVICE_VARIABLES | frozenset({
    "HOME", "USER", "LOGNAME", "SHELL", "MAIL", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "XDG_DATA_HOME",
    "XDG_CACHE_HOME", "XDG_STATE_HOME", "SUDO_USER", "SUDO_UID", "SUDO_GID", "SUDO_COMMAND", "SSH_AUTH_SOCK",
    "KRB5CCNAME", "DBUS_SESSION_BUS_ADDRESS"})


@dataclass(frozen=True)
class Identity:
    """One UNIX account: ``name``, ``uid``, ``gid`` (primary group), ``home``, ``shell``."""
    name: str
    uid: int
    gid: int
    home: str
    shell: str

    @classmethod
    def of(cls, account: str) -> "Identity":
        """Look ``account`` up; ValueError naming it when this host has no such account."""
        try:
            pw = pwd.getpwnam(account)
        except KeyError:
            raise ValueError(f"no UNIX account {account!r} on this host: create it (useradd {account}) "
                             "or fix the account in the users file") from None
        return cls(pw.pw_name, pw.pw_uid, pw.pw_gid, pw.pw_dir, pw.pw_shell or "/bin/sh")

    def is_current(self) -> bool:
        """True when this process already runs as the account (no switch needed)."""
        return os.geteuid() == self.uid

    def popen_options(self) -> Dict[str, Any]:
        """Keyword arguments of :class:`subprocess.Popen` that start the child as this account:
        supplementary groups cleared, gid, then uid (needs root unless :meth:`is_current`)."""
        if self.is_current():
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}

    def environment(self, base: Mapping[str, str]) -> Dict[str, str]:
        """``base`` without :data:`SERVICE_ONLY`, with this account's HOME, USER, LOGNAME, SHELL."""
        env = {k: v for k, v in base.items() if k not in SERVICE_ONLY}
        env.update(HOME=self.home, USER=self.name, LOGNAME=self.name, SHELL=self.shell)
        return env

    def own(self, path: Union[str, Path], mode: int = 0o700) -> None:
        """Give ``path`` (a directory or file this service made) and, for a directory, what it holds
        to this account, with ``mode`` on ``path`` itself (0700: nobody else may read it). Never
        follows a symbolic link, also when the account changes the tree meanwhile (``os.fwalk``
        on directory descriptors). Raises OSError when ``path`` itself is a link."""
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fchown(fd, self.uid, self.gid)
            os.fchmod(fd, mode)
            is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
        finally:
            os.close(fd)
        if not is_dir:
            return
        for _, dirs, files, dir_fd in os.fwalk(path, follow_symlinks=False):
            for name in dirs + files:
                try:
                    os.chown(name, self.uid, self.gid, dir_fd=dir_fd, follow_symlinks=False)
                except FileNotFoundError:   # removed meanwhile
                    pass


def open_beneath(root: Union[str, Path], *parts: str) -> int:
    """Open ``root/parts...`` read-only and return the descriptor, never following a symbolic link
    at or below ``root``. For files a service running as root reads from a directory it gave to an
    account (:meth:`Identity.own`): the account may have replaced a file or folder there by a link
    to another user's files. FileNotFoundError when missing, OSError (ELOOP, ENOTDIR) for a link,
    ValueError for a part that is not a plain name. The caller closes the descriptor."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for i, part in enumerate(parts):
            if part in ("", ".", "..") or "/" in part:
                raise ValueError(f"not a plain file name: {part!r}")
            last = i == len(parts) - 1
            nxt = os.open(part, os.O_RDONLY | os.O_NOFOLLOW | (0 if last else os.O_DIRECTORY), dir_fd=fd)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_no_link(path: Union[str, Path], mode: str = "rb"):
    """``open(path, mode)`` (``"rb"``, ``"wb"``, ``"ab"``, ``"w"``) that fails (ELOOP) when ``path``
    is a symbolic link, creating files with mode 0600. For files a service running as root makes
    or reads directly in a directory it gave to an account, which may have put a link there."""
    flags = {"r": os.O_RDONLY, "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
             "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND}[mode[0]]
    return open(os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600), mode)


def popen_options(identity: Optional[Identity]) -> Dict[str, Any]:
    """:meth:`Identity.popen_options`, or nothing for ``None`` (run as this process)."""
    return identity.popen_options() if identity is not None else {}


def start_options(cmd: Sequence[str], identity: Optional[Identity],
                  cgroup: Optional[str] = None) -> Tuple[List[str], Dict[str, Any]]:
    """The command and :class:`subprocess.Popen` keyword arguments that start ``cmd`` as ``identity``
    (None: this process's account) and, with ``cgroup`` (a job's or pool's, see
    :mod:`nbmpi.workers.launch.cgroups`; needs root), inside that cgroup before it can fork:
    the command is then wrapped (:func:`~nbmpi.workers.launch.cgroups.enter_command`), which
    enters the cgroup first and drops to the account after."""
    if cgroup is None:
        return list(cmd), popen_options(identity)
    from .cgroups import enter_command

    if identity is None or identity.is_current():
        return enter_command(cgroup, cmd), {}
    return enter_command(cgroup, cmd, identity.uid, identity.gid), {}


def base_environment(identity: Optional[Identity]) -> Dict[str, str]:
    """The environment a launch for ``identity`` starts from: this process's own, or the
    account's (:meth:`Identity.environment`)."""
    return identity.environment(os.environ) if identity is not None else dict(os.environ)
