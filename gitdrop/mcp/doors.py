"""What the MCP server's HTTP door needs before the SDK sees a request.

- Connections (uvicorn's protocol, `http_protocol`, gitdrop/transports/conns.py):
  a whole request within HEAD_SECONDS, at most PER_ADDRESS an address, and all
  together below what the open-file limit leaves.
- Sessions (`SessionGuard`, ASGI): the SDK opens a session for any `initialize`,
  token or not, up to 10,000, each kept 30 minutes. An `initialize` without a
  token is one of its address's budget (`ToolBox.sessions`), and refused on a
  server that registers nobody without a token; a session is bound to the agent
  whose token first came with it, so its id alone, or another agent's token,
  reaches nothing. Until a token comes it is bound to the address that opened it.
- Tokens rotated or revoked (`Binding`): a session lives as long as the token it
  is bound to. A request with that token once it is no longer valid is refused
  (401) and ends the session; a stream to its holder (news on a GET stream, a
  subscriptions/listen stream) ends before the next piece it would send.
"""

import json
import typing


OWNERS_MAX = 20000       # sessions remembered with their agent
GONE_MAX = 1024          # sessions ended for their token, remembered to say why
# Sessions one agent keeps open at once; its next initialize ends its oldest. The
# SDK keeps 10,000 in all, each 30 minutes: one token's holder opened them all, and
# every other agent was refused (503) until they expired.
PER_AGENT = 32


class Binding(typing.NamedTuple):
    """Whose an HTTP session is: an agent and the digest of the token it came with
    ("" both until one comes), and the address that opened it."""
    agent: str
    token: str
    peer: str


class SessionGuard:
    """ASGI wrapper of the SDK's streamable HTTP app (see the module's doc)."""

    def __init__(self, app, box):
        self.app, self.box = app, box
        self.owners: dict[str, Binding] = {}   # session id -> whose it is
        self.gone: dict[str, tuple] = {}   # session id -> the refusal that ended it
        self.of_agent: dict[str, dict[str, None]] = {}   # agent -> its sessions, oldest first

    def forget(self, sid: str) -> None:
        """The session ended (DELETE, expiry): its binding goes with it."""
        bound = self.owners.pop(sid, None)
        if bound is not None and bound.agent:
            mine = self.of_agent.get(bound.agent, {})
            mine.pop(sid, None)
            if not mine:
                self.of_agent.pop(bound.agent, None)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.lower(): v for k, v in scope.get("headers", ())}
        peer = (scope.get("client") or ("",))[0] or ""
        auth = headers.get(b"authorization", b"").decode("latin-1")
        caller = self.box.identify({"authorization": auth} if auth else {}, peer)
        sid = headers.get(b"mcp-session-id", b"").decode("latin-1")
        if sid:
            return await self._in_session(scope, receive, send, sid, caller)
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
        elif scope.get("method") == "POST" and len(self.of_agent.get(caller.agent, ())) >= \
                PER_AGENT:
            receive, opens = await _opens_session(receive)
            if opens:   # the agent's oldest session makes room for it
                oldest = next(iter(self.of_agent[caller.agent]))
                await self._end(scope, oldest, (404, f"this session was ended: "
                                f"{caller.agent} opened more than {PER_AGENT} sessions, and "
                                "the oldest goes first", "open a new session (initialize)"))
        binding = Binding(caller.agent, caller.token if caller.agent else "", peer)

        async def noted(message):
            if message["type"] == "http.response.start" and message.get("status", 500) < 400:
                for k, v in message.get("headers", ()):
                    if k.lower() == b"mcp-session-id":
                        self._bind(v.decode("latin-1"), binding)
            await send(message)
        return await self.app(scope, receive, self._watched(noted, lambda: binding))

    def _bind(self, sid: str, binding: Binding) -> None:
        if len(self.owners) >= OWNERS_MAX:   # the oldest go first
            for old in list(self.owners)[:OWNERS_MAX // 10]:
                self.forget(old)
        self.owners[sid] = binding
        if binding.agent:
            self.of_agent.setdefault(binding.agent, {})[sid] = None

    async def _in_session(self, scope, receive, send, sid: str, caller):
        """A request on an open session: served if it comes from the session's own."""
        if sid in self.gone:   # the SDK would only say "Session not found"
            return await _refuse(send, *self.gone[sid])
        bound = self.owners.get(sid)
        if bound is None:   # none this door opened: the SDK answers (404)
            return await self.app(scope, receive, send)
        refusal = _refusal(bound, caller)
        if refusal is not None:
            status, why, fix, ends = refusal
            if ends:
                await self._end(scope, sid, (status, why, fix))
            return await _refuse(send, status, why, fix)
        if not bound.agent and caller.agent:   # registered on it: now bound to the token
            self._bind(sid, Binding(caller.agent, caller.token, bound.peer))
        # The session's binding as it is when each piece goes out: a GET stream opened
        # before the session's register carries its agent's news after it.
        return await self.app(scope, receive, self._watched(send, lambda: self.owners.get(sid)))

    def _watched(self, send, binding):
        """`send` for a response to a token's holder: a stream (news on a session's
        GET stream, a subscriptions/listen stream) ends, what it was about to send
        unsent, once that token is no longer valid (rotated or revoked). Checked as
        each piece goes out (binding() says whose it is then): one stat of the token
        file while it is unchanged."""
        ended = False

        async def watched(message):
            nonlocal ended
            if ended:
                return
            if message["type"] == "http.response.body" and _void(binding(), self.box.verifier):
                ended = True
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)
        return watched

    async def _end(self, scope, sid: str, why: tuple) -> None:
        """End the SDK's session as its client's DELETE would: its streams close,
        and what the server kept for it is let go (Push.end, forget); its later
        requests get `why` (status, reason, fix)."""
        if len(self.gone) >= GONE_MAX:
            del self.gone[next(iter(self.gone))]
        self.gone[sid] = why
        kept = (b"host", b"origin", b"mcp-protocol-version")
        headers = [(k, v) for k, v in scope.get("headers", ()) if k.lower() in kept]
        ending = dict(scope, method="DELETE", headers=headers + [(b"mcp-session-id",
                                                                     sid.encode("latin-1"))])

        async def nothing():
            return {"type": "http.request", "body": b"", "more_body": False}

        async def dropped(_message):
            pass
        await self.app(ending, nothing, dropped)
        self.forget(sid)


def _void(bound: Binding | None, verifier) -> bool:
    """Whether a session's or stream's token is no longer valid."""
    return bound is not None and bool(bound.agent) and verifier.holder(bound.token) != bound.agent


def _refusal(bound: Binding, caller):
    """(status, why, fix, whether the session ends) for a request the session's
    binding refuses, or None. Only the session's own token, or its agent's new one,
    ends it: a stranger who knows its id must not be able to."""
    if not bound.agent:
        if bound.peer and caller.peer != bound.peer:
            return (404, "no session with this id is open for your address (a session "
                    "opened without a token is its opener's alone)",
                    "open your own session (initialize)", False)
        return None
    if caller.token == bound.token:
        if caller.agent == bound.agent:
            return None
        return (401, "the token this session was opened with is no longer valid (rotated "
                "or revoked), so the session has ended", "open a new session with the "
                "agent's current token (the hub's owner mints one: gitdrop token "
                f"{bound.agent})", True)
    if caller.error and caller.presented:   # a stranger's bad token: the session goes on
        return 401, caller.error, "send your own valid token on a session you opened", False
    if caller.agent == bound.agent:
        return (404, f"this session has ended: {bound.agent}'s token was rotated after it "
                "was opened", "open a new session (initialize) with the current token", True)
    return (403, "this session belongs to another agent", "send your own bearer token on a "
            "session you opened", False)


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
    except (ValueError, RecursionError):   # nested past the parser's depth: not one
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
