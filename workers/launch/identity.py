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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Union

#: Variables of the launching service that never reach a rank running as another account
#: (the service's tokens, configuration, data directory, and the root's session).
SERVICE_ONLY = frozenset({"NBMPI_TOKEN", "NBMPI_SERVER", "NBMPI_CONFIG", "NBMPI_DATA_DIR", "HOME", "USER",
                          "LOGNAME", "SHELL", "MAIL", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "XDG_DATA_HOME",
                          "XDG_CACHE_HOME", "XDG_STATE_HOME", "SUDO_USER", "SUDO_UID", "SUDO_GID",
                          "SUDO_COMMAND", "SSH_AUTH_SOCK", "KRB5CCNAME", "DBUS_SESSION_BUS_ADDRESS"})


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
        """Give ``path`` (a directory or file this service just made) and, for a directory, what
        it holds to this account with ``mode`` on the top directory (0700: nobody else may read).
        Symbolic links are changed themselves, never followed."""
        path = str(path)
        _chown(path, self.uid, self.gid)
        os.chmod(path, mode)
        if os.path.isdir(path) and not os.path.islink(path):
            for root, dirs, files in os.walk(path):
                for name in dirs + files:
                    _chown(os.path.join(root, name), self.uid, self.gid)


def _chown(path: str, uid: int, gid: int) -> None:
    os.chown(path, uid, gid, follow_symlinks=False)


def popen_options(identity: Optional[Identity]) -> Dict[str, Any]:
    """:meth:`Identity.popen_options`, or nothing for ``None`` (run as this process)."""
    return identity.popen_options() if identity is not None else {}


def base_environment(identity: Optional[Identity]) -> Dict[str, str]:
    """The environment a launch for ``identity`` starts from: this process's own, or the
    account's (:meth:`Identity.environment`)."""
    return identity.environment(os.environ) if identity is not None else dict(os.environ)
