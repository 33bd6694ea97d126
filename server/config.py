"""Where the controller keeps its state, and the client configuration file.

* Data directory (``nbmpi serve --data-dir``, else ``$NBMPI_DATA_DIR``, else
  ``$XDG_DATA_HOME/nbmpi`` or ``~/.local/share/nbmpi``): created on first start
  with mode 0700. It holds the SQLite database ``nbmpi.db``, the users file
  ``users.json`` and one directory per job under ``jobs/``.
* Client configuration (``$NBMPI_CONFIG``, else ``$XDG_CONFIG_HOME/nbmpi/client.json``
  or ``~/.config/nbmpi/client.json``): ``{"url": ..., "token": ...}``, written by
  ``nbmpi serve`` with mode 0600 and read by the ``nbmpi submit/jobs/...`` client.
  The client takes the server URL and token from, in order: command-line
  options, ``$NBMPI_SERVER`` / ``$NBMPI_TOKEN``, this file.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional

from nbmpi.workers.launch.environment import CONFIG_ENV, DATA_DIR_ENV, SERVER_ENV, TOKEN_ENV  # noqa: F401

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
#: Largest accepted job code (bytes of UTF-8).
MAX_CODE_BYTES = 1 << 20


def default_data_dir() -> Path:
    """The data directory when none is given on the command line."""
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "nbmpi"


def ensure_data_dir(path: Path) -> Path:
    """Create ``path`` (mode 0700) and its ``jobs/`` subdirectory if missing; return it resolved."""
    path = Path(path).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    (path / "jobs").mkdir(exist_ok=True, mode=0o700)
    return path


def client_config_path() -> Path:
    """Path of the client configuration file."""
    env = os.environ.get(CONFIG_ENV)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "nbmpi" / "client.json"


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, readable and writable by the owner only (0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def write_client_config(url: str, token: str, path: Optional[Path] = None) -> Path:
    """Record the server URL and a token for the CLI client (mode 0600). Returns the path."""
    path = Path(path) if path else client_config_path()
    write_private(path, json.dumps({"url": url, "token": token}, indent=2) + "\n")
    return path


def read_client_config(path: Optional[Path] = None) -> Dict[str, Any]:
    """The client configuration file's content, ``{}`` if there is none."""
    path = Path(path) if path else client_config_path()
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise SystemExit(f"nbmpi: cannot read the client configuration {path}: {exc}; "
                         "fix or delete it, or pass --server and --token") from None


@dataclass(frozen=True)
class ClientSettings:
    """Server URL and token the CLI client uses."""
    url: str
    token: Optional[str]


def client_settings(url: Optional[str] = None, token: Optional[str] = None) -> ClientSettings:
    """Resolve the URL and token: arguments, then environment, then the config file, then defaults."""
    cfg = read_client_config() if not (url and token) else {}
    url = url or os.environ.get(SERVER_ENV) or cfg.get("url") or f"http://{DEFAULT_HOST}:{DEFAULT_PORT}"
    token = token or os.environ.get(TOKEN_ENV) or cfg.get("token")
    return ClientSettings(url=url.rstrip("/"), token=token)
