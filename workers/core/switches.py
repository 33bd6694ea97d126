"""On/off switches read from the environment: one reading rule for every ``NBMPI_*`` switch.

A switch is on unless its variable is set to one of :data:`OFF_WORDS` (case and surrounding blanks
ignored); unset or empty means its default. So ``NBMPI_LATENCY_HIDING=off`` and ``=0`` both turn latency
hiding off, and ``=1``/``on``/``yes`` leave it on.
"""
from __future__ import annotations

import os
from typing import Mapping, Optional

__all__ = ["OFF_WORDS", "env_switch"]

#: The values that turn a switch off.
OFF_WORDS = ("0", "off", "false", "no")


def env_switch(name: str, default: bool = True, env: Optional[Mapping[str, str]] = None) -> bool:
    """Whether the switch ``name`` is on in ``env`` (default: this process's environment); an unset or
    empty variable gives ``default``. Local, non-blocking, reads the environment on every call."""
    raw = (os.environ if env is None else env).get(name, "").strip().lower()
    if not raw:
        return default
    return raw not in OFF_WORDS
