"""Strings the controller can store, run and answer: the checks requests pass and the repair of answers.

A request's string cannot be stored or run when it holds a NUL (no OS
argument, environment entry or file name can carry one, and Python refuses
source with one) or a lone surrogate (``"\\udfff"`` in JSON: not encodable as
UTF-8, so neither SQLite text nor a file can hold it). :func:`problem` names
what is wrong; the request schemas (:mod:`nbmpi.server.schemas`) refuse such
input with a 422 naming the field.

Records written by an older version (or by hand) may still hold such strings,
or bytes that are not UTF-8. Answers go through :func:`printable` /
:func:`printable_json`, which show a surrogate as its ``\\uXXXX`` escape, so
no stored row can make an answer fail.
"""
from __future__ import annotations

import re
from typing import Any, Optional

_SURROGATE = re.compile("[\ud800-\udfff]")


def problem(text: str) -> Optional[str]:
    """Why ``text`` cannot be stored or run (``"contains a NUL character at index 3"``), None if it can."""
    nul = text.find("\x00")
    if nul >= 0:
        return (f"contains a NUL character (at index {nul}), which cannot be stored or run (no file name, "
                "argument, environment variable or Python source may hold one)")
    m = _SURROGATE.search(text)
    if m:
        return (f"contains a lone surrogate U+{ord(m.group()):04X} (at index {m.start()}), which is not valid "
                "Unicode text: send UTF-8 text (in JSON, a \\ud8xx escape must be followed by its \\udcxx pair)")
    return None


def printable(text: str) -> str:
    """``text`` with every lone surrogate written as its ``\\uXXXX`` escape (encodable as UTF-8)."""
    if not isinstance(text, str) or not _SURROGATE.search(text):
        return text
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def printable_json(value: Any) -> Any:
    """A JSON-like ``value`` (dicts, lists, strings, numbers) with every string :func:`printable`."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable(str(k)): printable_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [printable_json(v) for v in value]
    return value
