"""MCP sessions over HTTP end when they should, and leave nothing behind: a token
rotated or revoked ends the sessions and streams bound to it (no more news, a clear
refusal), a session that ends is forgotten by the server, a session opened without
a token is its opener's address's alone; and a page of a list tool stays under the
1 MiB answer the SDK's client accepts."""

import contextlib
import threading
import time

import anyio
import httpx2
import pytest
from mcp.shared.exceptions import MCPError
from mcp_helpers import http_agent, http_server

from gitdrop import tokens

pytestmark = [pytest.mark.anyio,
              pytest.mark.filterwarnings("ignore:resources/subscribe is removed")]

INBOX = "gitdrop://inbox/core/spartan"
QUIET = 1.0   # seconds in which news that should not come does not


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def lobby(hub):
    room = hub.room("lobby")
    room.register("core/juno", ["lead"])
    room.register("core/spartan")
    return room


class News:
    """What a session was told: legacy notifications, or a listen stream's events."""

    def __init__(self):
        self.seen: list[str] = []
        self.stream_ended = ""

    async def legacy(self, message):
        method = getattr(message, "method", "")
        if method.startswith("notifications/"):
            self.seen.append(method)

    async def listen(self, sub):
        try:
            async for ev in sub:
                self.seen.append(type(ev).__name__)
            self.stream_ended = "closed"
        except Exception as e:   # the SDK's SubscriptionLost: the server ended it
            self.stream_ended = type(e).__name__

    async def after(self, before: int, timeout: float = 5.0) -> list[str]:
        """What came after the first `before` items, once something did."""
        with anyio.fail_after(timeout):
            while len(self.seen) <= before:
                await anyio.sleep(0.02)
        return self.seen[before:]


def inbox_of(agent: str) -> str:
    return f"gitdrop://inbox/{agent}"


async def _news_stop(agent, news, lobby, void) -> None:
    """The agent's session hears its news; once void() has made its token invalid,
    it hears none, and its next call is refused saying why."""
    await agent.client.subscribe_resource(inbox_of(agent.name))
    lobby.send("core/juno", agent.name, "before")
    assert "notifications/resources/updated" in await news.after(0)
    void()
    heard = len(news.seen)
    lobby.send("core/juno", agent.name, "after")
    await anyio.sleep(QUIET)
    assert news.seen[heard:] == [], f"news reached {agent.name}'s session of a void token"
    with pytest.raises(MCPError, match="no longer valid.*Next: open a new session"):
        await agent.call("who")


async def test_a_rotated_or_revoked_token_ends_its_legacy_session_and_its_news(hub, lobby):
    """The token was rotated (gitdrop token core/spartan): the session opened with
    the old one heard its agent's news on its GET stream, and went on calling. So
    did a session whose GET stream opened before its register, once its token was
    revoked."""
    old = tokens.mint(hub.path, "core/spartan")
    with http_server(hub.path, tools="agent") as url:
        news = News()
        async with http_agent(url, "core/spartan", "legacy", token=old,
                              message_handler=news.legacy) as spartan:
            await spartan.ok("who")
            await _news_stop(spartan, news, lobby,
                             lambda: tokens.mint(hub.path, "core/spartan"))
        news = News()
        async with http_agent(url, "web/newbie", "legacy",
                              message_handler=news.legacy) as newbie:
            newbie.authenticate((await newbie.ok("register", agent_name="newbie",
                                                 team="web"))["token"])
            await newbie.ok("who")
            await _news_stop(newbie, news, lobby,
                             lambda: tokens.revoke(hub.path, "web/newbie"))


async def test_a_revoked_token_ends_its_listen_stream(hub, lobby):
    """Revoked (tokens.revoke): a subscriptions/listen stream opened with it heard
    the agent's news on; it ends instead, and the next call names rule token."""
    token = tokens.mint(hub.path, "core/spartan")
    news = News()
    with http_server(hub.path, tools="agent") as url:
        async with http_agent(url, "spartan", "auto", token=token) as spartan:
            await spartan.ok("who")
            async with spartan.client.listen(resource_subscriptions=[INBOX],
                                             tools_list_changed=True) as sub:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(news.listen, sub)
                    await anyio.sleep(0.2)   # listening
                    lobby.send("core/juno", "core/spartan", "before the revocation")
                    assert "ResourceUpdated" in await news.after(0)
                    assert tokens.revoke(hub.path, "core/spartan")
                    heard = len(news.seen)
                    lobby.send("core/juno", "core/spartan", "after the revocation")
                    await anyio.sleep(QUIET)
                    assert news.seen[heard:] == [], "news reached a revoked token's stream"
                    assert news.stream_ended, "the stream of a revoked token stayed open"
                    tg.cancel_scope.cancel()
            await spartan.refused("who", "token")


_ACCEPT = {"Accept": "application/json, text/event-stream"}


def _initialize() -> dict:
    return {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"}}}


def _who(ident: int) -> dict:
    return {"jsonrpc": "2.0", "id": ident, "method": "tools/call",
            "params": {"name": "who", "arguments": {}}}


def _open(c: httpx2.Client, url: str, headers: dict) -> str:
    r = c.post(url, json=_initialize(), headers=headers)
    assert r.status_code == 200, r.text
    sid = r.headers["mcp-session-id"]
    c.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"},
           headers={**headers, "mcp-session-id": sid})
    return sid


def _there() -> httpx2.Client:
    """A client that connects from 127.0.0.2: another address of this machine."""
    return httpx2.Client(timeout=30, transport=httpx2.HTTPTransport(local_address="127.0.0.2"))


async def test_a_session_without_a_token_is_its_openers_address_alone(hub, lobby):
    """A session opened without a token (before its register): anyone who knew its
    id used it, from any address, and could bind it to a token of theirs."""
    with http_server(hub.path, tools="agent") as url, \
            httpx2.Client(timeout=30) as here, _there() as there:
        anonymous = _open(here, url, _ACCEPT)
        r = there.post(url, json=_who(2), headers={**_ACCEPT, "mcp-session-id": anonymous})
        assert r.status_code == 404 and "your address" in r.text, r.text
        assert "Next: open your own session" in r.text
        r = here.post(url, json=_who(3), headers={**_ACCEPT, "mcp-session-id": anonymous})
        assert r.status_code == 200 and "rule token" in r.text, r.text   # its own: served


async def test_a_rotated_token_s_session_ends_for_it_and_no_stranger_ends_it(hub, lobby):
    """The agent's new token on a session of its old one: served, as if rotating
    changed nothing for it. It now finds the session ended, saying why (later
    requests too, not the SDK's bare 404); a stranger's bad token ends nothing."""
    old = tokens.mint(hub.path, "core/spartan")
    own = {**_ACCEPT, "Authorization": f"Bearer {old}"}
    with http_server(hub.path, tools="agent") as url, \
            httpx2.Client(timeout=30) as here, _there() as there:
        sid = _open(here, url, own)
        bad = {**_ACCEPT, "Authorization": "Bearer gd_made_up", "mcp-session-id": sid}
        r = there.post(url, json=_who(4), headers=bad)
        assert r.status_code == 401 and "not valid" in r.text, r.text
        r = there.post(url, json=_who(5), headers={**own, "mcp-session-id": sid})
        assert r.status_code == 200 and "core/spartan" in r.text, r.text   # not ended
        new = {**_ACCEPT, "Authorization": f"Bearer {tokens.mint(hub.path, 'core/spartan')}"}
        r = here.post(url, json=_who(6), headers={**new, "mcp-session-id": sid})
        assert r.status_code == 404 and "token was rotated" in r.text, r.text
        r = here.post(url, json=_who(7), headers={**own, "mcp-session-id": sid})
        assert r.status_code == 404 and "Next: open a new session" in r.text, r.text
        r = here.post(url, json=_initialize(), headers=new)   # a new session works
        assert r.status_code == 200, r.text


@contextlib.contextmanager
def served_here(hub_path, **options):
    """`gitdrop serve --transport http`'s app (server.http_app) served by uvicorn on a
    thread of this process, so that a test sees what the server keeps per session:
    yields (url, Push, SessionGuard). `options`: the SDK app's."""
    import uvicorn
    from gitdrop.mcp.server import build, http_app
    from gitdrop.transports.httpd import listen
    server, _box, push = build(hub_path, "lobby", None, "http", "agent", "open")
    guard = http_app(server, "127.0.0.1", **options)
    sock = listen("127.0.0.1", 0)
    port = sock.getsockname()[1]
    served = uvicorn.Server(uvicorn.Config(guard, log_level="warning"))

    async def main():
        push.start()
        try:
            await served.serve(sockets=[sock])
        finally:
            push.stop()
    thread = threading.Thread(target=anyio.run, args=(main,), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not served.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/mcp", push, guard
    finally:
        served.should_exit = True
        thread.join(10)
        sock.close()


async def _until(what, timeout: float = 5.0) -> bool:
    with anyio.move_on_after(timeout):
        while not what():
            await anyio.sleep(0.02)
    return what()


async def test_ended_sessions_leave_nothing_behind(hub, lobby):
    """Push kept every legacy session (about 17 KB each) and the door its binding for
    ever: a client opening and closing sessions in a loop grew the server without
    bound. Now a session's entries go when it ends: by its client's DELETE, or when
    it expires."""
    token = tokens.mint(hub.path, "core/spartan")
    with served_here(hub.path, session_idle_timeout=1.0) as (url, push, guard):
        def kept():
            return len(push.legacy), len(push.subs), len(guard.owners)
        for _ in range(8):
            async with http_agent(url, "spartan", "legacy", token=token) as spartan:
                await spartan.ok("who")
                await spartan.client.subscribe_resource(INBOX)
                assert kept() == (1, 1, 1)
        assert await _until(lambda: kept() == (0, 0, 0)), kept()   # ended by DELETE
        with httpx2.Client(timeout=30) as c:   # a client gone without a DELETE
            own = {**_ACCEPT, "Authorization": f"Bearer {token}"}
            sid = _open(c, url, own)
            assert c.post(url, json=_who(2), headers={**own, "mcp-session-id": sid}
                          ).status_code == 200
            assert kept() == (1, 0, 1)
            assert await _until(lambda: kept() == (0, 0, 0)), kept()   # expired


# A task's description or a contract's spec near max_file, of '"': escaped on the wire
# twice (structured content, and the text copy), about 6 bytes each. A status line is
# plain (its file would escape the quotes).
BIG = '"' * (60 * 1024)
LONG = "s" * (60 * 1024)


async def _pages(agent, tool: str, key: str, **args) -> list[list[dict]]:
    """Every page of a paged tool, from offset 0 on by the number each returned."""
    pages, offset, more = [], 0, 1
    while more:
        with anyio.fail_after(10):   # an answer past the client's limit is lost: it waits
            r = await agent.ok(tool, offset=offset, **args)
        assert r[key], r
        pages.append(r[key])
        offset, more = offset + len(r[key]), r["more"]
    return pages


async def test_a_page_stays_under_the_clients_limit_and_misses_nothing(hub, lobby):
    """50 tasks of 60 KB descriptions made one list_tasks answer megabytes, past the
    1 MiB the SDK's HTTP client takes (so it lost it, and waited); the same for who with long
    status lines. A page now stops at 256 KB of records, and paging on by what it
    returned skips and repeats nothing. list_contracts and get_shared_context, which
    have no pages, leave the bulk out past 256 KB and say which call reads it."""
    tasks = [lobby.create_task("core/juno", f"t{i}", body=f"{i}" + BIG)["id"]
             for i in range(7)]
    agents = [f"web/a{i}" for i in range(10)]
    for a in agents:
        lobby.register(a)
        lobby.set_status(a, LONG)
    kinds = ("function", "event", "schema", "other", "dom_id", "css_class")
    for i, kind in enumerate(kinds):
        lobby.declare_contract("core/juno", f"api.c{i}", BIG, kind, "")
        lobby.set_context("core/juno", f"note{i}", BIG)
    token = tokens.mint(hub.path, "core/spartan")
    with http_server(hub.path, tools="agent") as url:
        async with http_agent(url, "spartan", "legacy", token=token) as spartan:
            for ready in (False, True):
                pages = await _pages(spartan, "list_tasks", "tasks", ready=ready)
                assert len(pages) > 1
                assert sorted(t["id"] for p in pages for t in p) == sorted(map(str, tasks))
            pages = await _pages(spartan, "who", "agents")
            assert len(pages) > 1
            assert sorted(a["agent"] for p in pages for a in p) == \
                sorted(agents + ["core/juno", "core/spartan"])
            with anyio.fail_after(10):
                contracts = (await spartan.ok("list_contracts"))["contracts"]
            assert [c["name"] for c in contracts] == [f"api.c{i}" for i in range(6)]
            cut = [c for c in contracts if c["spec"].startswith("[left out")]
            assert cut and "list_contracts with owner='core/juno' and type=" in cut[0]["spec"]
            one = await spartan.ok("list_contracts", type=cut[0]["type"])
            assert one["contracts"][0]["spec"].rstrip("\n") == BIG
            with anyio.fail_after(10):
                notes = (await spartan.ok("get_shared_context"))["context"]
            assert sorted(notes) == [f"note{i}" for i in range(6)]
            cut = [k for k, v in notes.items() if v.startswith("[left out")]
            assert cut and f"get_shared_context with key='{cut[0]}'" in notes[cut[0]]
            one = await spartan.ok("get_shared_context", key=cut[0])
            assert one["context"] == {cut[0]: BIG}


async def test_one_agent_keeps_at_most_its_share_of_sessions(hub, lobby):
    """Sessions opened with a token were not counted: one agent opened 10,000 (the
    SDK's cap) and every other agent was refused with 503 for the next 30 minutes.
    An agent's next session past PER_AGENT ends its oldest."""
    from gitdrop.mcp import doors
    spartan = tokens.mint(hub.path, "core/spartan")
    juno = tokens.mint(hub.path, "core/juno")
    with served_here(hub.path) as (url, _push, guard), httpx2.Client(timeout=30) as c:
        own = {**_ACCEPT, "Authorization": f"Bearer {spartan}"}
        sids = [_open(c, url, own) for _ in range(doors.PER_AGENT + 5)]
        assert len(guard.of_agent["core/spartan"]) == doors.PER_AGENT
        r = c.post(url, json=_who(2), headers={**own, "mcp-session-id": sids[0]})
        assert r.status_code == 404 and f"more than {doors.PER_AGENT}" in r.text, r.text
        r = c.post(url, json=_who(2), headers={**own, "mcp-session-id": sids[-1]})
        assert r.status_code == 200, r.text
        _open(c, url, {**_ACCEPT, "Authorization": f"Bearer {juno}"})   # others unhurt
        # a body nested past the parser's depth, without a token: the SDK's parse
        # error, not a 500 and a traceback in the log for each
        deep = b"[" * 5000 + b"]" * 5000
        r = c.post(url, content=deep, headers={**_ACCEPT, "content-type": "application/json"})
        assert 400 <= r.status_code < 500, (r.status_code, r.text[:200])


def test_every_loopback_address_is_one_client_for_the_budgets():
    """A process here may connect from any 127.x.y.z: each got a budget of its own,
    and 240 agents were registered past the limit in 3 s."""
    from gitdrop.mcp.tools import Joins
    from gitdrop.transports.httpd import client_key
    joins = Joins(burst=2, every=3600)
    assert joins.take("127.0.0.1", now=0) == 0 and joins.take("127.0.0.2", now=0) == 0
    assert joins.take("127.9.9.9", now=0) > 0 and joins.take("::1", now=0) > 0
    assert joins.take("10.0.0.1", now=0) == 0   # another machine: its own
    assert client_key("2001:db8::1") == client_key("2001:db8::ffff") != client_key("2001:db9::1")
    assert client_key("::ffff:127.0.0.5") == "loopback"
