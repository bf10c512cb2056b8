"""What the MCP server's HTTP door needs before the SDK sees a request.

- Connections (uvicorn's protocol, `http_protocol`): one that has sent no whole
  request within HEAD_SECONDS is closed, one address holds at most PER_ADDRESS
  (this machine's: no cap), and all together stay below what the open-file limit
  leaves. Connections left half-sent piled up until an accept failed for want of a
  file descriptor, and that ended the server.
- Sessions (`SessionGuard`, ASGI): the SDK opens a session for any `initialize`,
  token or not, up to 10,000, each kept 30 minutes. An `initialize` without a
  token is one of its address's budget (`ToolBox.sessions`), and refused on a
  server that registers nobody without a token; a session is bound to the agent
  whose token first came with it, so its id alone, or another agent's token,
  reaches nothing.
"""

import collections
import json

from ..transports.httpd import is_local

HEAD_SECONDS = 30.0
PER_ADDRESS = 256
RESERVED_FILES = 128     # descriptors kept for the hub, the log, the notifier
BACKLOG = 64             # connections accepted in one go (asyncio accepts up to the backlog
                         # at once, each holding a descriptor until its close has run)
OWNERS_MAX = 20000       # sessions remembered with their agent


def _file_limit() -> int:
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return 1024
    return 1 << 20 if soft == resource.RLIM_INFINITY else soft


def http_protocol():
    """uvicorn's HTTP protocol class with the connection limits above."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol as Base
    most = max(32, _file_limit() - RESERVED_FILES - BACKLOG)
    per = collections.Counter()

    class Guarded(Base):
        _host, _timer = None, None

        def connection_made(self, transport):
            super().connection_made(transport)
            self._host = (self.client or ("",))[0]
            per[self._host] += 1
            if len(self.connections) > most or (
                    per[self._host] > PER_ADDRESS and not is_local(self._host)):
                transport.close()   # at once: its descriptor is what is short
                return
            self._timer = self.loop.call_later(HEAD_SECONDS, self._no_request)

        def _no_request(self):
            if self.cycle is None:   # not one whole request yet
                self.transport.close()

        def connection_lost(self, exc):
            if self._timer is not None:
                self._timer.cancel()
            if self._host is not None:
                per[self._host] -= 1
                if per[self._host] <= 0:
                    del per[self._host]
            super().connection_lost(exc)
    return Guarded


class SessionGuard:
    """ASGI wrapper of the SDK's streamable HTTP app (see the module's doc)."""

    def __init__(self, app, box):
        self.app, self.box = app, box
        self.owners: dict[str, str] = {}   # session id -> agent ("" until a token comes)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.lower(): v for k, v in scope.get("headers", ())}
        peer = (scope.get("client") or ("",))[0] or ""
        auth = headers.get(b"authorization", b"").decode("latin-1")
        caller = self.box.identify({"authorization": auth} if auth else {}, peer)
        sid = headers.get(b"mcp-session-id", b"").decode("latin-1")
        if sid:
            owner = self.owners.get(sid)
            if owner and owner != caller.agent:
                return await _refuse(send, 403, "this session belongs to another agent",
                                     "send your own bearer token on a session you opened")
            if owner == "" and caller.agent:
                self.owners[sid] = caller.agent   # registered on it: now bound
            return await self.app(scope, receive, send)
        if scope.get("method") == "POST" and not caller.agent:   # no token, or a bad one
            if self.box.registration == "closed":
                return await _refuse(send, 401, caller.error or "this server opens no "
                                     "session without a token", "send Authorization: Bearer "
                                     "<token> (the hub's owner mints it: gitdrop token "
                                     "team/name)")
            receive, opens = await _opens_session(receive)
            wait = self.box.sessions.take(peer) if opens else 0
            if wait:
                return await _refuse(send, 429, f"{peer or 'this address'} opened "
                                     f"{self.box.sessions.burst} sessions without a token in a "
                                     "short time", f"wait {max(1, round(wait))}s, or send your "
                                     "token")
        agent = caller.agent

        async def noted(message):
            if message["type"] == "http.response.start":
                for k, v in message.get("headers", ()):
                    if k.lower() == b"mcp-session-id":
                        if len(self.owners) >= OWNERS_MAX:   # the oldest go first
                            for old in list(self.owners)[:OWNERS_MAX // 10]:
                                del self.owners[old]
                        self.owners[v.decode("latin-1")] = agent
            await send(message)
        return await self.app(scope, receive, noted)


async def _opens_session(receive):
    """(a receive that gives the body again, whether it is an `initialize`: the one
    request that makes the SDK keep a session). A body past a MiB is no initialize
    (the SDK refuses it anyway)."""
    got, size, more = [], 0, True
    while more and size <= 1 << 20:
        message = await receive()
        got.append(message)
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    try:
        request = json.loads(b"".join(m.get("body", b"") for m in got)) if not more else None
    except ValueError:
        request = None
    opens = any(isinstance(r, dict) and r.get("method") == "initialize"
                for r in (request if isinstance(request, list) else [request]))

    async def again():
        return got.pop(0) if got else await receive()
    return again, opens


async def _refuse(send, status: int, why: str, fix: str) -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {
        "code": -32600, "message": f"{why}. Next: {fix}"}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
