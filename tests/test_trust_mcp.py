"""Trust through the MCP doors: the attack file's inputs over streamable HTTP (with
and without a token) and stdio, with the real SDK client. Every refusal names its
rule and the next step, and leaves no commit behind."""

import pytest
from mcp_helpers import http_agent, http_server, stdio_agent

import attacks
from conftest import git

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def tips(hub):
    return git("for-each-ref", "--format=%(refname) %(objectname)", cwd=hub.path).stdout


async def hostile_calls(agent, hub):
    """Calls every session must refuse; the room does not move."""
    before = tips(hub)
    for value in attacks.TRAILER_INJECTIONS:
        await agent.refused("send", "usage", to_agent="spartan", message="hi", reply_to=value)
        await agent.refused("send", "usage", to_agent="spartan", message="hi", key=value)
        await agent.refused("send", "usage", to_agent="spartan", message="hi", task_id=value)
    await agent.refused("send", "usage", to_agent="@core\nGitdrop-To: all", message="hi")
    for text in attacks.BAD_TEXTS:
        await agent.refused("send", "format", to_agent="spartan", message=text)
    for name in ("../hub", "x.lock", "a..b", "evil\n"):
        await agent.refused("share_context", "usage", key=name, value="v")
    assert tips(hub) == before


async def test_http_without_a_token(hub):
    lobby = hub.room("lobby")
    lobby.register("core/juno", ["lead"])
    with http_server(hub.path) as url:
        async with http_agent(url, "anon", "auto") as anon:
            before = tips(hub)
            # a newline once bricked the lobby: registered with an author git cannot read
            await anon.refused("register", "usage", agent_name="evil", team="core\n")
            await anon.refused("register", "usage", agent_name="ev\nil", team="core")
            # the hub's own identity is not for the taking, nor is another team's lead
            await anon.refused("register", "reserved-name", agent_name="admin", team="hub")
            await anon.refused("register", "reserved-name", agent_name="boss", role="lead")
            await anon.refused("register", "lead-only", agent_name="mallory", team="core",
                               role="lead")
            assert tips(hub) == before
            reg = await anon.ok("register", agent_name="eve", team="web")
            anon.authenticate(reg["token"])
            # a plain agent creates no room and takes over no team
            await anon.refused("create_room", "lead-only", name="eves", teams="core")
            await anon.refused("register_team", "lead-only", team_name="core", leader="eve")
            await anon.refused("register_team", "lead-only", team_name="ops",
                               leader="ops/puppet")
        lobby.register("core/spartan")
        async with http_agent(url, "juno", "legacy") as juno:
            from gitdrop import tokens
            juno.authenticate(tokens.mint(hub.path, "core/juno"))
            await hostile_calls(juno, hub)
            await juno.ok("send", to_agent="spartan", message="still works")
    assert [m["text"] for m in lobby.inbox("core/spartan")["messages"]] == ["still works"]
    assert "web" not in lobby.view().room["leads"]
    assert git("fsck", "--full", "--strict", cwd=hub.path).returncode == 0


async def test_stdio(hub):
    lobby = hub.room("lobby")
    lobby.register("core/juno", ["lead"])
    lobby.register("core/spartan")
    async with stdio_agent(hub.path, "core/juno", "auto") as juno:
        await hostile_calls(juno, hub)
        await juno.ok("send", to_agent="spartan", message="fine", key="k1")
        await juno.ok("send", to_agent="spartan", message="fine", key="k1")    # replayed
        await juno.refused("send", "idempotency-key", to_agent="spartan", message="other",
                           key="k1")
    assert [m["text"] for m in lobby.inbox("core/spartan")["messages"]] == ["fine"]
