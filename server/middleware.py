"""Pure ASGI middleware of the controller: authenticate and bound a request before its body is read,
and put the security headers on every answer.

:class:`RequestGuard` runs before the application sees a request:

* every path under ``/api/v1/`` needs ``Authorization: Bearer TOKEN``; without a
  valid one the answer is 401 at once, from the headers alone: not one byte of
  the body is read;
* a ``Content-Length`` above the limit is answered 413 at once; every body,
  chunked or not, is counted while it streams to the application, and the
  moment it passes the limit the client gets 413 and the application sees the
  client gone (:class:`starlette.requests.ClientDisconnect`), so no request
  holds more than the limit in memory. The upload endpoint keeps its own
  (smaller) limit on the script on top of this one. After a streaming 413 the
  guard lingers (at most :data:`LINGER_SECONDS`, :data:`LINGER_BYTES`),
  reading and discarding what the client still sends, before it ends the
  answer: a connection closed with unread bytes is reset, and a reset can
  destroy the answer before the client has read it.

:class:`SecurityHeaders` adds ``X-Content-Type-Options: nosniff`` and
``Referrer-Policy: no-referrer`` to every answer and a Content-Security-Policy
that allows this origin only: the dashboard's for ``/dashboard...`` (its page,
assets and BokehJS), the API docs' for ``/docs...``, and ``default-src 'none'``
for everything else (JSON cannot be made to run as a page). Headers a route set
itself are kept.
"""
from __future__ import annotations

import asyncio
from typing import Callable, Dict, Iterable, Optional, Tuple

from .auth import UNAUTHORIZED, Authenticator
from .errors import error

Scope = dict
Message = dict
Receive = Callable[[], "Message"]
Send = Callable[["Message"], None]

#: Paths whose every request needs a valid bearer token (checked before the body is read).
AUTHENTICATED_PREFIX = "/api/v1/"
#: How long, and for how many bytes, a refused body is read and discarded after its 413 was sent.
LINGER_SECONDS = 1.0
LINGER_BYTES = 64 << 20


def _header(scope: Scope, name: bytes) -> Optional[str]:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def bearer_token(scope: Scope) -> Optional[str]:
    """The token of the request's ``Authorization: Bearer TOKEN`` header, None without one."""
    value = _header(scope, b"authorization")
    if not value:
        return None
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


class RequestGuard:
    """Authenticates ``/api/v1/`` requests from their headers and limits every body to ``max_body``
    bytes while it streams (see the module docstring). Non-blocking; one instance per application."""

    def __init__(self, app, auth: Authenticator, max_body: int):
        self.app = app
        self.auth = auth
        self.max_body = int(max_body)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if scope["path"].startswith(AUTHENTICATED_PREFIX) and self.auth.user_for(bearer_token(scope)) is None:
            return await error(401, UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
        length = _header(scope, b"content-length")
        if length is not None:
            if not length.strip().isdigit():
                return await error(400, f"invalid Content-Length {length[:40]!r}: expected a number of bytes"
                                   )(scope, receive, send)
            if int(length) > self.max_body:
                return await error(413, self._too_big(f"{int(length)} bytes"))(scope, receive, send)
        await _Limited(self, scope, receive, send).run()

    def _too_big(self, size: str) -> str:
        return (f"request body of {size} exceeds the limit of {self.max_body} bytes; send a smaller body "
                "(a job's code is at most half of it)")


class _Limited:
    """One request passed to the application with its body counted as it arrives."""

    def __init__(self, guard: RequestGuard, scope: Scope, receive: Receive, send: Send):
        self.guard, self.scope, self._receive, self._send = guard, scope, receive, send
        self.seen = 0
        self.started = False      # the application began its answer
        self.refused = False      # this guard answered 413 instead

    async def run(self) -> None:
        await self.guard.app(self.scope, self.receive, self.send)

    async def receive(self) -> Message:
        if self.refused:
            return {"type": "http.disconnect"}
        message = await self._receive()
        if message["type"] == "http.request":
            self.seen += len(message.get("body", b""))
            if self.seen > self.guard.max_body:
                self.refused = True
                if not self.started:
                    await self._refuse()
                return {"type": "http.disconnect"}
        return message

    async def _refuse(self) -> None:
        """Send the 413 with its whole body, linger while discarding the rest of the request, then end it."""
        detail = self.guard._too_big(f"more than {self.guard.max_body} bytes (still streaming)")

        async def hold_last(message: Message) -> None:   # the answer's end waits for the lingering
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                message = {**message, "more_body": True}
            await self._send(message)

        await error(413, detail, headers={"Connection": "close"})(self.scope, self._noop, hold_last)
        await self._linger()
        await self._send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _linger(self) -> None:
        loop = asyncio.get_running_loop()
        deadline, drained = loop.time() + LINGER_SECONDS, 0
        while drained < LINGER_BYTES:
            left = deadline - loop.time()
            if left <= 0:
                return
            try:
                message = await asyncio.wait_for(self._receive(), left)
            except asyncio.TimeoutError:
                return
            if message["type"] != "http.request" or not message.get("more_body", False):
                return
            drained += len(message.get("body", b""))

    async def send(self, message: Message) -> None:
        if self.refused:
            return                # the client already has its 413; the application's answer is dropped
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)

    @staticmethod
    async def _noop() -> Message:
        return {"type": "http.disconnect"}


def _policy(path: str, policies: Iterable[Tuple[str, str]], default: str) -> str:
    for prefix, csp in policies:
        if path == prefix or path.startswith(prefix + "/"):
            return csp
    return default


class SecurityHeaders:
    """Adds the security headers (see the module docstring) to every answer of ``app``.
    ``policies``: ``(path prefix, Content-Security-Policy)`` pairs; other paths get ``default``."""

    def __init__(self, app, policies: Dict[str, str], default: str = "default-src 'none'; frame-ancestors 'none'"):
        self.app = app
        self.policies = sorted(policies.items(), key=lambda kv: -len(kv[0]))
        self.default = default

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        csp = _policy(scope["path"], self.policies, self.default)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers") or [])
                have = {k.lower() for k, _ in headers}
                for name, value in ((b"content-security-policy", csp), (b"x-content-type-options", "nosniff"),
                                    (b"referrer-policy", "no-referrer")):
                    if name not in have:
                        headers.append((name, value.encode("latin-1")))
                message = dict(message, headers=headers)
            await send(message)

        await self.app(scope, receive, send_with_headers)
