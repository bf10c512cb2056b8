"""Push: a raw `git push` that concerns a connected agent reaches its MCP session
(resource updated on its inbox, and tools/list_changed) within a second, over
stdio and streamable HTTP, on the current protocol (subscriptions/listen) and the
legacy one (resources/subscribe + notifications on the session)."""

import json
import time

import anyio
import pytest
from mcp_helpers import http_agent, http_server, stdio_agent

from gitdrop import tokens

pytestmark = [pytest.mark.anyio,
              pytest.mark.filterwarnings("ignore:resources/subscribe is removed")]

INBOX = "gitdrop://inbox/core/spartan"
LIMIT = 1.0  # seconds from the push to the notification


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def room(hub):
    lobby = hub.room("lobby")
    for agent, roles in (("core/juno", ["lead"]), ("core/spartan", []), ("ops/kilo", [])):
        lobby.register(agent, roles)
    return lobby


def push_message(clone, to, text):
    """A message committed by hand and pushed through the hook; returns when the push
    was accepted (monotonic time)."""
    clone.pull()
    clone.commit(f"{text}\n\nGitdrop-Op: send\nGitdrop-To: {to}", allow_empty=True)
    ok, err = clone.push()
    assert ok, err
    return time.monotonic()


class Events:
    """What a session was told, with when."""

    def __init__(self):
        self.seen: list[tuple[str, str, float]] = []
        self.changed = anyio.Event()

    def add(self, kind, uri=""):
        self.seen.append((kind, uri, time.monotonic()))
        self.changed.set()

    async def legacy_handler(self, message):
        method = getattr(message, "method", "")
        if method == "notifications/resources/updated":
            self.add("resource", str(message.params.uri))
        elif method == "notifications/tools/list_changed":
            self.add("tools")

    async def listen(self, sub):
        async for ev in sub:
            self.add("resource" if hasattr(ev, "uri") else "tools", getattr(ev, "uri", ""))

    async def wait_for(self, kinds, since, timeout=5.0):
        with anyio.fail_after(timeout):
            while True:
                got = {k: t for k, uri, t in self.seen if t >= since and
                       (k != "resource" or uri == INBOX)}
                if set(kinds) <= set(got):
                    return {k: got[k] for k in kinds}
                self.changed = anyio.Event()
                await self.changed.wait()


async def check_push(agent, events, clone, subscribe_legacy):
    if subscribe_legacy:
        await agent.client.subscribe_resource(INBOX)
    push_message(clone, "ops/kilo", "not for spartan")
    await anyio.sleep(0.3)
    assert events.seen == []  # nothing that concerns spartan landed yet
    pushed = push_message(clone, "core/spartan", "for spartan")
    got = await events.wait_for(["resource", "tools"], pushed - 5)
    for kind, t in got.items():
        assert t - pushed < LIMIT, f"{kind} notification {t - pushed:.3f}s after the push"
    inbox = json.loads((await agent.client.read_resource(INBOX)).contents[0].text)
    assert [m["text"] for m in inbox["messages"]] == ["for spartan"]
    assert inbox["messages"][0]["from"] == "core/juno"


@pytest.mark.alone   # a latency under a second: no other test's load
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_push_over_stdio(room, hub, clone, mode):
    c = clone("core/juno")
    events = Events()
    handler = events.legacy_handler if mode == "legacy" else None
    async with stdio_agent(hub.path, "core/spartan", mode, tools="agent",
                           message_handler=handler) as spartan:
        await push_reaches(spartan, events, c, mode)


async def push_reaches(agent, events, c, mode):
    """check_push on the session's own channel: its notifications (legacy), or a
    listen stream subscribed to its inbox (2026-07-28)."""
    if mode == "legacy":
        await check_push(agent, events, c, True)
        return
    async with agent.client.listen(resource_subscriptions=[INBOX],
                                   tools_list_changed=True) as sub:
        async with anyio.create_task_group() as tg:
            tg.start_soon(events.listen, sub)
            await check_push(agent, events, c, False)
            tg.cancel_scope.cancel()


@pytest.mark.alone   # a latency under a second: no other test's load
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_push_over_http(room, hub, clone, mode):
    c = clone("core/juno")
    token = tokens.mint(hub.path, "core/spartan")
    events = Events()
    handler = events.legacy_handler if mode == "legacy" else None
    with http_server(hub.path, tools="agent") as url:
        async with http_agent(url, "core/spartan", mode, token=token,
                              message_handler=handler) as spartan:
            await spartan.ok("who")  # the session is known as spartan's from here on
            await push_reaches(spartan, events, c, mode)


@pytest.mark.alone   # a latency under a second: no other test's load
async def test_http_push_goes_to_its_agent_only_and_follows_mcp_calls(room, hub):
    """Another agent's listen stream hears nothing of spartan's news; a message sent
    by another MCP session notifies like a push."""
    spartan_token = tokens.mint(hub.path, "core/spartan")
    kilo_token = tokens.mint(hub.path, "ops/kilo")
    juno_token = tokens.mint(hub.path, "core/juno")
    mine, theirs = Events(), Events()
    with http_server(hub.path, tools="agent") as url:
        async with http_agent(url, "core/spartan", "auto", token=spartan_token) as spartan, \
                http_agent(url, "ops/kilo", "auto", token=kilo_token) as kilo, \
                http_agent(url, "core/juno", "auto", token=juno_token) as juno:
            async with spartan.client.listen(resource_subscriptions=[INBOX],
                                             tools_list_changed=True) as s1, \
                    kilo.client.listen(resource_subscriptions=[INBOX],
                                       tools_list_changed=True) as s2:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(mine.listen, s1)
                    tg.start_soon(theirs.listen, s2)
                    sent = time.monotonic()
                    await juno.ok("send", to_agent="spartan", message="over MCP")
                    got = await mine.wait_for(["resource", "tools"], sent)
                    assert max(got.values()) - sent < LIMIT
                    await anyio.sleep(0.3)
                    assert theirs.seen == []
                    tg.cancel_scope.cancel()
            # listening needs the token, like every call
            async with http_agent(url, "anon", "auto") as anon:
                with pytest.raises(Exception):
                    async with anon.client.listen(tools_list_changed=True):
                        pass


async def test_a_server_on_a_git_url_writes_through_the_hub(room, hub, clone, tmp_path,
                                                            monkeypatch):
    """`--hub file://...` (a remote hub): the server's writes are pushed to the hub
    (through its hook), and news from the hub still reaches the session."""
    monkeypatch.setenv("GITDROP_CACHE", str(tmp_path / "cache"))
    c = clone("ops/kilo")
    events = Events()
    async with stdio_agent(f"file://{hub.path}", "core/spartan", "legacy", tools="agent",
                           message_handler=events.legacy_handler) as spartan:
        await spartan.client.subscribe_resource(INBOX)
        sent = await spartan.ok("send", to_agent="juno", message="via a mirror")
        assert hub.room("lobby").view().commit == sent["commit"]  # it reached the hub
        pushed = push_message(c, "core/spartan", "back to you")
        await events.wait_for(["resource", "tools"], pushed - 5, timeout=15)
        box = await spartan.ok("check_inbox")
        assert [m["text"] for m in box["messages"]] == ["back to you"]
