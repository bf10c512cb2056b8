"""The MCP server through the real SDK client: streamable HTTP (a real server on
127.0.0.1) and stdio (one server process per agent, bound with --as), on the
current protocol (2026-07-28) and the legacy one (2025-11-25). Every tool is
called, accepted and refused; tokens and identity are enforced."""

import contextlib
import json
import os

import anyio
import pytest
from mcp_helpers import http_agent, http_server, stdio_agent, together

from gitdrop import tokens
from gitdrop.mcp import tools as mcp_tools

pytestmark = pytest.mark.anyio

MODES = ["auto", "legacy"]  # auto negotiates 2026-07-28 with this server


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def scenario(juno, spartan, kilo, transport):
    """A lead (core/juno), a coder (core/spartan) and one of another team (ops/kilo)."""
    # --- messaging -------------------------------------------------------------
    who = await juno.ok("who")
    assert {a["agent"] for a in who["agents"]} == {"core/juno", "core/spartan", "ops/kilo"}
    assert next(a for a in who["agents"] if a["agent"] == "core/juno")["lead"] is True
    assert (await spartan.ok("set_status", status="parsing"))["agent"] == "core/spartan"
    assert (await kilo.ok("ping"))["agent"] == "ops/kilo"

    sent = await juno.ok("send", to_agent="spartan", message="hi spartan", cc="ops/kilo")
    assert sent["to"] == ["core/spartan"] and sent["cc"] == ["ops/kilo"]
    await juno.ok("send", from_agent="juno", to_agent="core/spartan", message="second")
    await juno.refused("send", "unknown-recipient", to_agent="nobody", message="hello?")
    await spartan.refused("send", "identity", from_agent="juno", to_agent="kilo", message="x")
    text = await spartan.refused("send", "unread-before-send", to_agent="juno", message="ok")
    assert "check_inbox" in text

    box = await spartan.ok("check_inbox", limit=1)
    assert [m["text"] for m in box["messages"]] == ["hi spartan"] and box["remaining"] == 1
    assert box["messages"][0]["from"] == "core/juno" and box["messages"][0]["via"] == "to"
    box = await spartan.ok("check_inbox", agent_name="spartan")
    assert [m["text"] for m in box["messages"]] == ["second"] and box["remaining"] == 0
    again = await spartan.ok("check_inbox", again=True)   # the answer lost: read once more
    assert again == box
    await spartan.ok("send", to_agent="juno", message="got it", reply_to=sent["commit"])
    assert [m["text"] for m in (await juno.ok("check_inbox"))["messages"]] == ["got it"]
    assert (await juno.ok("broadcast", message="standup in 5"))["to"] == ["all"]
    hist = await kilo.ok("get_history", count=3)
    assert [m["text"] for m in hist["messages"]] == ["second", "got it", "standup in 5"]
    once = await juno.ok("send", to_agent="kilo", message="retry-safe", key="k1")
    assert (await juno.ok("send", to_agent="kilo", message="retry-safe", key="k1"))["commit"] \
        == once["commit"]                       # a retried call is applied once
    assert [m["text"] for m in (await kilo.ok("check_inbox"))["messages"]
            if m["text"] == "retry-safe"] == ["retry-safe"]

    # --- tasks -----------------------------------------------------------------
    t1 = await juno.ok("create_task", title="Build the parser", assigned_to="spartan",
                       description="A PEG parser for the config files.", priority=2)
    assert t1["state"] == "assigned" and t1["assignee"] == "core/spartan"
    t2 = await juno.ok("create_task", creator="core/juno", title="Write docs", tags="docs,easy")
    assert t2["state"] == "pending"
    await kilo.refused("create_task", "identity", creator="juno", title="Impostor")
    assert (await kilo.ok("claim_task", task_id=t2["id"]))["assignee"] == "ops/kilo"
    text = await spartan.refused("claim_task", "task-state-machine", task_id=t2["id"])
    assert "ops/kilo" in text

    tid = t1["id"]
    assert (await spartan.ok("update_task", task_id=tid, status="in_progress"))["state"] == \
        "in_progress"
    await spartan.refused("update_task", "task-state-machine", task_id=tid, status="completed")
    await kilo.refused("update_task", "task-state-machine", task_id=tid, status="review")
    q = await spartan.ok("request_feedback", task_id=int(tid), question="Which grammar?")
    assert q["state"] == "feedback"
    assert (await juno.ok("respond_feedback", task_id=tid, answer="PEG"))["state"] == \
        "in_progress"
    r = await spartan.ok("submit_for_review", task_id=tid, summary="parser done",
                         files_changed="parse.py", test_results="12 passed")
    assert r["state"] == "review"
    await spartan.refused("approve_task", "task-state-machine", task_id=tid)
    await spartan.refused("reject_task", "task-state-machine", task_id=tid, reason="meh")
    assert (await juno.ok("reject_task", task_id=tid, reason="add tests"))["state"] == \
        "in_progress"
    await spartan.ok("submit_for_review", task_id=tid, summary="with tests")
    assert (await juno.ok("approve_task", task_id=tid, notes="nice"))["state"] == "completed"
    board = await spartan.ok("list_tasks")
    assert [t["id"] for t in board["tasks"]] == [t2["id"]]
    done = await spartan.ok("list_tasks", status="completed", assigned_to="spartan")
    assert done["tasks"][0]["description"] == "A PEG parser for the config files."
    assert done["tasks"][0]["answer"] == "PEG"

    # --- handshakes ---------------------------------------------------------------
    await spartan.refused("initiate_handshake", "lead-only", message="my plan")
    hs = await juno.ok("initiate_handshake", message="Parser first, then docs.",
                       agents="spartan, ops/kilo")
    assert hs["status"] == "pending" and hs["pending"] == ["core/spartan", "ops/kilo"]
    bound = await juno.ok("create_task", title="Wire it up", assigned_to="spartan",
                          handshake_id=hs["id"])
    await spartan.refused("update_task", "handshake-go", task_id=bound["id"],
                          status="in_progress")
    assert (await spartan.ok("ack_handshake", handshake_id=hs["id"]))["status"] == "pending"
    await spartan.refused("ack_handshake", "handshake-ack-once", handshake_id=hs["id"])
    await juno.refused("ack_handshake", "handshake-ack-once", handshake_id=hs["id"])
    assert (await kilo.ok("ack_handshake", handshake_id=hs["id"]))["status"] == "go"
    st = await kilo.ok("handshake_status", handshake_id=hs["id"])
    assert st["status"] == "go" and st["pending"] == [] and st["plan"].startswith("Parser")
    await spartan.ok("update_task", task_id=bound["id"], status="in_progress")

    # --- contracts and shared context -------------------------------------------------
    c1 = await spartan.ok("declare_contract", name="parse", type="function",
                          spec="parse(text: str) -> Ast")
    assert c1["version"] == 1 and c1["owner"] == "core/spartan"
    await kilo.refused("declare_contract", "contract-owner", name="parse", type="function",
                       spec="parse(b: bytes)")
    assert (await juno.ok("declare_contract", name="parse", type="function",
                          spec="parse(text: str, strict: bool) -> Ast"))["version"] == 2
    cs = await kilo.ok("list_contracts", owner="spartan")
    assert [(c["name"], c["version"], c["type"]) for c in cs["contracts"]] == \
        [("parse", 2, "function")]
    await kilo.ok("share_context", key="stack", value="python 3.11")
    assert (await spartan.ok("get_shared_context", key="stack"))["context"] == \
        {"stack": "python 3.11"}
    assert "stack" in (await juno.ok("get_shared_context"))["context"]
    lease = (await kilo.ok("path_lease", action="take", glob="docs/**"))["leases"][0]
    assert lease["holder"] == "ops/kilo" and lease["mode"] == "exclusive"

    # --- dependencies and review over MCP ---------------------------------------------
    first = await juno.ok("create_task", title="Schema", review=False)
    second = await juno.ok("create_task", title="Seed", brief=True,
                           description="## Objective\n\nSeed it.\n\n## Acceptance criteria\n\n"
                                       "- [ ] rows exist\n")
    await juno.refused("create_task", "task-brief", title="Bad", brief=True, description="x")
    await juno.ok("edit_task", task_id=second["id"], after=first["id"], priority="2")
    await juno.refused("edit_task", "task-dependency", task_id=first["id"], after=second["id"])
    await spartan.refused("claim_task", "task-dependency", task_id=second["id"])
    await spartan.ok("claim_task", task_id=first["id"])
    await spartan.ok("update_task", task_id=first["id"], status="in_progress")
    done = await spartan.ok("update_task", task_id=first["id"], status="completed")
    assert done["state"] == "completed"   # review=false: its assignee completes it
    await juno.ok("edit_task", task_id=second["id"], after="none")
    await juno.ok("update_task", task_id=second["id"], status="cancelled")

    # --- resources --------------------------------------------------------------------
    await juno.ok("send", to_agent="spartan", message="resource check")
    inbox = json.loads((await spartan.client.read_resource(
        "gitdrop://inbox/core/spartan")).contents[0].text)
    assert [m["text"] for m in inbox["messages"]][-1] == "resource check"
    with pytest.raises(Exception):
        await juno.client.read_resource("gitdrop://inbox/core/spartan")
    board = json.loads((await kilo.client.read_resource("gitdrop://tasks")).contents[0].text)
    assert {t["id"] for t in board["tasks"]} == {t2["id"], bound["id"]}
    task = json.loads((await kilo.client.read_resource(
        f"gitdrop://tasks/{tid}")).contents[0].text)
    assert task["state"] == "completed"
    room = json.loads((await kilo.client.read_resource("gitdrop://room")).contents[0].text)
    assert room["status"]["room"] == "lobby" and len(room["agents"]) == 3

    # --- teams and rooms ---------------------------------------------------------------
    team = await juno.ok("register_team", team_name="core", leader="juno", members="spartan")
    assert team["lead"] == "core/juno" and "core/spartan" in team["members"]
    await kilo.ok("register_team", team_name="ops", leader="kilo")
    # a hand-over says which rooms it reached, and back
    got = await juno.ok("register_team", team_name="core", leader="spartan")
    assert got["lead"] == "core/spartan" and got["handed_over_in"] == ["lobby"], got
    got = await spartan.ok("register_team", team_name="core", leader="juno")
    assert got["lead"] == "core/juno" and got["handed_over_in"] == ["lobby"], got
    await kilo.refused("register_team", "lead-only", team_name="core", leader="juno")
    assert {t["name"] for t in (await spartan.ok("list_teams"))["teams"]} == {"core", "ops"}
    assert (await juno.ok("create_room", name="war", teams="core"))["room"] == "war"
    await juno.refused("create_room", "format", name="war", teams="core")
    assert "war" in [r["room"] for r in (await kilo.ok("list_rooms"))["rooms"]]
    # core joined the open lobby when juno took its lead there
    assert [r["room"] for r in (await spartan.ok("get_my_rooms"))["rooms"]] == ["lobby", "war"]
    assert (await juno.ok("join_room", team_name="ops", room_name="war"))["done"] is True
    assert (await juno.ok("room_status", room_name="war"))["teams"] == ["core", "ops"]
    # another team leaves by its own lead's call (or the operator's), not by juno's
    await juno.refused("leave_room", "lead-only", team_name="ops", room_name="war")
    assert (await kilo.ok("leave_room", team_name="ops", room_name="war"))["done"] is True
    assert (await juno.ok("pin_room", room_name="war"))["done"] is True
    assert [(r["room"], r["pinned"]) for r in
            (await juno.ok("get_my_rooms", team_name="core"))["rooms"]] == [("lobby", False),
                                                                            ("war", True)]
    got = await juno.ok("room_settings", settings={"loop_cap": 50}, room_name="war")
    assert got["settings"]["loop_cap"] == 50 and got["overrides"] == {"loop_cap": 50}
    assert (await kilo.ok("room_settings"))["settings"]["loop_window"] == 60
    await kilo.refused("room_settings", "lead-only", settings={"loop_cap": 0})
    await kilo.refused("archive_room", "lead-only", room_name="war")
    await juno.ok("archive_room", room_name="war")
    archived = await juno.ok("list_rooms", status="archived")
    assert [r["room"] for r in archived["rooms"]] == ["war"]
    await kilo.refused("restore_room", "lead-only", room_name="war")   # and back, and again
    assert (await juno.ok("restore_room", room_name="war"))["done"] is True
    await juno.ok("archive_room", room_name="war")
    text = await juno.refused("room_settings", "not-found", room_name="war")
    assert "Next: a lead of the room restores it (restore_room(room_name='war'))" in text, text
    await kilo.refused("destroy_room", "lead-only", room_name="war")
    assert (await juno.ok("destroy_room", room_name="war"))["done"] is True
    assert (await juno.ok("list_rooms", status="all"))["rooms"][0]["room"] == "lobby"

    # --- leaving ---------------------------------------------------------------------------
    await kilo.ok("deregister")
    assert {a["agent"] for a in (await juno.ok("who"))["agents"]} == {"core/juno",
                                                                         "core/spartan"}
    called = juno.called | spartan.called | kilo.called
    assert called == set(mcp_tools.TOOLS), set(mcp_tools.TOOLS) - called


@pytest.mark.parametrize("mode", MODES)
async def test_every_tool_over_http(hub, mode):
    with http_server(hub.path) as url:
        async with contextlib.AsyncExitStack() as stack:
            agents = []
            for name, team, role in (("juno", "core", "lead"), ("spartan", "core", "coder"),
                                     ("kilo", "ops", "coder")):
                a = await stack.enter_async_context(http_agent(url, f"{team}/{name}", mode))
                await a.refused("who", "token")  # nothing but register without a token
                reg = await a.ok("register", agent_name=name, team=team, role=role)
                assert reg["agent"] == f"{team}/{name}" and reg["token"].startswith("gd_")
                a.authenticate(reg["token"])
                agents.append(a)
            await scenario(*agents, "http")


@pytest.mark.parametrize("mode", MODES)
async def test_every_tool_over_stdio(hub, mode):
    roles = {"core/juno": "lead", "core/spartan": "coder", "ops/kilo": "coder"}
    async with together(*(stdio_agent(hub.path, name, mode) for name in roles)) as agents:
        for a in agents:
            reg = await a.ok("register", role=roles[a.name])
            assert reg["agent"] == a.name and reg["token"] == ""  # stdio: --as is the identity
        await agents[1].refused("register", "identity", agent_name="juno", team="core")
        await scenario(*agents, "stdio")


async def test_tokens_are_enforced_over_http(hub):
    lobby = hub.room("lobby")
    lobby.register("core/juno", ["lead"])
    lobby.register("core/spartan", [])
    juno_token = tokens.mint(hub.path, "core/juno")
    with http_server(hub.path) as url:
        async with http_agent(url, "anon", "auto") as anon:
            await anon.refused("send", "token", to_agent="spartan", message="hi")
            with pytest.raises(Exception):
                await anon.client.read_resource("gitdrop://tasks")
            # an agent with a token cannot be taken over by registering again
            await anon.refused("register", "token", agent_name="core/juno")
            # nor one registered by other means (it must be given a token first)
            await anon.refused("register", "token", agent_name="spartan", team="core")
            await anon.refused("register", "token", agent_name="core/juno", token="gd_wrong")
            reg = await anon.ok("register", agent_name="core/juno", token=juno_token,
                                description="upsert with its token")
            assert reg["updated"] is True and reg["token"] == ""
        async with http_agent(url, "forged", "legacy", token="gd_forged") as forged:
            await forged.refused("who", "token")
        async with http_agent(url, "core/juno", "legacy", token=juno_token) as juno:
            await juno.ok("send", to_agent="spartan", message="hi")
            # a call for another agent is refused
            await juno.refused("send", "identity", from_agent="core/spartan", to_agent="juno",
                               message="impostor")
            await juno.refused("check_inbox", "identity", agent_name="spartan")
            await juno.refused("register", "identity", agent_name="spartan", team="core")
        # rotation: a new token replaces the old one
        new_token = tokens.mint(hub.path, "core/juno")
        async with http_agent(url, "core/juno", "auto", token=juno_token) as old:
            await old.refused("who", "token")
        async with http_agent(url, "core/juno", "auto", token=new_token) as juno:
            assert (await juno.ok("who"))["agents"]


async def test_profiles_and_stdio_binding(hub):
    """The default profile (agent) hides lead tools; --as binds before register."""
    async with stdio_agent(hub.path, "core/juno", "auto", tools="agent") as juno:
        names = {t.name for t in (await juno.client.list_tools()).tools}
        assert names == set(mcp_tools.tools_for("agent"))
        assert "create_task" not in names
        r = await juno.call("create_task", title="x")
        assert r.is_error
        text = await juno.refused("send", "not-found", to_agent="all", message="hi")
        assert "call register" in text
        await juno.ok("register", role="lead")
        assert (await juno.ok("send", to_agent="all", message="hi"))["to"] == ["all"]
        r = await juno.call("check_inbox", limit="lots")  # a bad argument: a tool error
        assert r.is_error and "'limit' must be an integer" in r.content[0].text


@pytest.mark.parametrize("mode", MODES)
async def test_check_inbox_answers_are_capped_by_size(hub, mode):
    """Messages of '"' (escaped on the wire twice: structured content and the text copy)
    past 1 MB: a default check_inbox answer that carried them all would pass the 1 MiB
    SSE event the SDK's HTTP client accepts, and be lost, already marked read. Each
    answer stays under the budget, and what it leaves out stays unread for the next."""
    lobby = hub.room("lobby")
    lobby.register("core/juno", ["lead"])
    lobby.register("core/kai", ["coder"])
    juno_token, kai_token = (tokens.mint(hub.path, a) for a in ("core/juno", "core/kai"))
    sent = [f"{i}:" + '"' * (16384 - len(f"{i}:")) for i in range(20)]
    with http_server(hub.path) as url:
        async with (http_agent(url, "core/juno", mode, token=juno_token) as juno,
                    http_agent(url, "core/kai", mode, token=kai_token) as kai):
            for text in sent:
                await juno.ok("send", to_agent="core/kai", message=text)
            got, left, answers = [], len(sent), 0
            while left:
                with anyio.fail_after(20):
                    r = await kai.call("check_inbox")
                assert not r.is_error, r.content[0].text
                assert len(r.content[0].text.encode()) < mcp_tools.MAX_INBOX_BYTES + 1000
                messages, remaining = r.structured_content["messages"], \
                    r.structured_content["remaining"]
                assert messages and remaining == left - len(messages)
                got += [m["text"] for m in messages]
                left, answers = remaining, answers + 1
            assert got == sent and answers > 2
            assert (await kai.ok("check_inbox")) == {"messages": [], "remaining": 0}


_KILLED_AS_THE_ANSWER_COMES = r'''
import os, signal, sys
sys.path.insert(0, sys.argv[1])
import anyio
import mcp.client.stdio as st
from mcp import Client
from mcp_helpers import stdio_params

armed = [False]
parse = st._parse_line

def killed(line):   # the answer reached the transport: die before anyone reads it
    if armed[0] and '"result"' in line:
        os.kill(os.getpid(), signal.SIGKILL)
    return parse(line)

st._parse_line = killed

async def main():
    async with Client(stdio_params(sys.argv[2], "core/spartan", "agent")) as c:
        armed[0] = True
        await c.call_tool("check_inbox", {})

anyio.run(main)
'''


async def test_a_check_inbox_whose_client_died_before_its_answer_is_shown_again(hub):
    """The read is marked as it is answered; a client killed as the answer came (or a
    dropped connection) left the messages read and unseen, and nothing on the agent
    profile showed them again."""
    import subprocess
    import sys
    lobby = hub.room("lobby")
    lobby.register("core/juno", ["lead"])
    lobby.register("core/spartan", ["coder"])
    for text in ("the build is red", "fix it first"):
        lobby.send("core/juno", "core/spartan", text)
    tests = os.path.dirname(os.path.abspath(__file__))
    p = subprocess.run([sys.executable, "-c", _KILLED_AS_THE_ANSWER_COMES, tests, hub.path],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == -9, p.stderr[-2000:]
    assert lobby.inbox("core/spartan", peek=True)["unread"] == 0   # the server marked them
    async with stdio_agent(hub.path, "core/spartan", "auto", tools="agent") as spartan:
        assert (await spartan.ok("check_inbox"))["messages"] == []
        again = await spartan.ok("check_inbox", again=True)
        assert [m["text"] for m in again["messages"]] == ["the build is red", "fix it first"]
