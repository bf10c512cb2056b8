"""Pieces of the MCP face without a client: tokens (hashed, outside refs, never in
history), the size of tools/list per profile, refusals as text an agent acts on."""

import json
import os
import stat
import subprocess

import anyio
import pytest

from gitdrop import tokens
from gitdrop.mcp import tools as mcp_tools
from gitdrop.errors import Refusal
from gitdrop.mcp.server import build

# A description for every parameter raised tools/list from 7,565 to 8,865 characters
# (agent) and from 15,982 to 18,048 (all). Dependencies, the ready queue, caps, sign
# and path_lease would have made it 9,500 and 18,440; leaving the caller's name out
# where the session says who calls, and output schemas as outlines that name the
# fields without typing them, brought it to 7,942 (agent) and 15,181 (all). Later
# tools brought "all" to 15,990; edit_task's handshake_id (a lead rebinds a task whose
# handshake cannot reach GO) to 16,07x; restore_room (archive_room had no way back
# over MCP) to 16,35x; check_inbox's again (a read whose answer never reached its
# caller left its messages read and unseen) to 8,05x (agent) and 16,43x (all).
LIMITS = {"agent": 8100, "all": 16500}


def test_tokens_are_stored_hashed_outside_the_refs(hub):
    tok = tokens.mint(hub.path, "core/juno")
    assert tok.startswith("gd_") and len(tok) > 40
    path = tokens.path(hub.path)
    assert path == os.path.join(hub.path, "gitdrop", "tokens.json")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    text = open(path).read()
    assert tok not in text and tokens.digest(tok) in text
    v = tokens.Verifier(hub.path)
    assert v.agent(tok) == "core/juno" and v.has("core/juno")
    assert v.agent("gd_" + "x" * 43) == "" and v.agent("") == ""
    # nothing about tokens reaches the repository's objects or refs
    objects = subprocess.run(["git", "--git-dir", hub.path, "cat-file", "--batch-all-objects",
                              "--batch"], capture_output=True).stdout
    assert tokens.digest(tok).encode() not in objects and tok.encode() not in objects
    refs = subprocess.run(["git", "--git-dir", hub.path, "for-each-ref"],
                          capture_output=True, text=True).stdout
    assert "token" not in refs


def test_tokens_rotate_and_revoke(hub):
    v = tokens.Verifier(hub.path)
    old = tokens.mint(hub.path, "core/juno")
    assert v.agent(old) == "core/juno"
    new = tokens.mint(hub.path, "core/juno")
    assert v.agent(old) == "" and v.agent(new) == "core/juno"
    other = tokens.mint(hub.path, "ops/kilo")
    assert tokens.revoke(hub.path, "core/juno") is True
    assert v.agent(new) == "" and v.agent(other) == "ops/kilo"
    assert tokens.revoke(hub.path, "core/juno") is False


def test_new_agents_per_address_are_a_burst_then_one_a_second():
    from gitdrop.mcp.server import default_registration
    from gitdrop.mcp.tools import Joins
    joins = Joins(burst=3, every=2.0)
    assert [joins.take("10.0.0.9", now=100.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert joins.take("10.0.0.9", now=100.0) == pytest.approx(2.0)
    assert joins.take("10.0.0.8", now=100.0) == 0.0   # another address has its own
    assert joins.take("10.0.0.9", now=101.0) == pytest.approx(1.0)
    assert joins.take("10.0.0.9", now=102.0) == 0.0 and joins.take("10.0.0.9", 102.0) > 0
    # reachable from other machines, a server registers nobody without a token
    assert [default_registration(h) for h in ("127.0.0.1", "localhost", "::1", "0.0.0.0",
                                              "192.0.2.7")] == ["open"] * 3 + ["closed"] * 2


def tools_list_json(hub_path, profile, transport="http", agent=None) -> tuple[list, str]:
    async def listed():
        server, _box, _push = build(hub_path, "lobby", agent, transport, profile)
        return [t.model_dump(by_alias=True, exclude_none=True, mode="json")
                for t in await server.list_tools()]
    tools = anyio.run(listed)
    return tools, json.dumps(tools, separators=(",", ":"))


def schema_titles(node):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "title" and isinstance(v, str):
                yield v
            yield from schema_titles(v)
    elif isinstance(node, list):
        for v in node:
            yield from schema_titles(v)


@pytest.mark.parametrize("profile", mcp_tools.PROFILES)
def test_tools_list_fits_the_budget(hub, profile):
    tools, text = tools_list_json(hub.path, profile)
    assert [t["name"] for t in tools] == mcp_tools.tools_for(profile)
    assert len(text) < LIMITS.get(profile, LIMITS["all"]), len(text)
    for t in tools:
        assert t["description"] and len(t["description"]) < 240, t["name"]
        assert t["outputSchema"]["type"] == "object", t["name"]  # structured results
        assert not list(schema_titles(t)), t["name"]  # pydantic's titles cost context
        for name, prop in t["inputSchema"]["properties"].items():
            assert prop.get("description"), (t["name"], name)  # every parameter says what it is


def test_every_parameter_description_names_a_parameter():
    """A docstring's `name: text` lines describe parameters the tool has (a line for
    one it lost would silently go on the line before)."""
    import inspect
    for tool in mcp_tools.TOOLS:
        fn = getattr(mcp_tools.ToolBox, tool)
        names = set(inspect.signature(fn).parameters) - {"self"}
        _head, _, rest = inspect.cleandoc(fn.__doc__).partition("\n\n")
        for line in rest.splitlines():
            label, sep, _text = line.partition(": ")
            if sep and label.isidentifier() and not line.startswith(" "):
                assert label in names, (tool, label)
        description, params = mcp_tools.describe(fn)
        assert description and set(params) == names and all(params.values()), (tool, params)


def test_all_40_tools_with_the_compat_parameters(hub):
    # a stdio session without --as lists the caller's name (before register binds it)
    tools, _ = tools_list_json(hub.path, "all", "stdio")
    params = {t["name"]: set(t["inputSchema"]["properties"]) for t in tools}
    assert len(params) == 40
    assert {"settings", "room_name"} <= params["room_settings"]
    # the names agents' prompts already use with other MCP servers
    assert {"agent_name", "role", "description", "team", "token"} <= params["register"]
    assert {"from_agent", "to_agent", "message", "cc", "task_id", "reply_to"} <= params["send"]
    assert {"agent_name", "task_id", "status", "assigned_to", "result"} <= params["update_task"]
    assert {"creator", "title", "description", "assigned_to", "project"} <= params["create_task"]
    assert {"agent_name", "task_id", "summary", "files_changed", "test_results"} <= \
        params["submit_for_review"]
    assert {"from_agent", "message", "agents"} <= params["initiate_handshake"]
    assert {"agent_name", "name", "type", "spec", "project"} <= params["declare_contract"]
    assert {"team_name", "leader", "members"} <= params["register_team"]
    assert {"team_name", "room_name"} <= params["join_room"]
    assert {"count", "task_id"} <= params["get_history"]
    assert {"caps"} <= params["register"] and {"after", "requires"} <= params["create_task"]
    assert {"ready", "tag"} <= params["list_tasks"] and {"tag"} <= params["claim_task"]
    assert {"review", "brief"} <= params["create_task"]
    assert {"after", "requires", "review", "task_id"} <= params["edit_task"]
    # where the session says who calls (HTTP tokens, stdio --as) the caller's name is
    # left out of tools/list; the calls still take it (tests/test_mcp_work.py)
    for transport, agent in (("http", None), ("stdio", "core/juno")):
        tools, _ = tools_list_json(hub.path, "all", transport, agent)
        bound = {t["name"]: set(t["inputSchema"]["properties"]) for t in tools}
        for name, names in params.items():
            assert bound[name] == names - (set(mcp_tools.IDENTITY) if name != "register"
                                           else set()), name
        assert "agent_name" in bound["register"] and "creator" not in bound["create_task"]


def test_refusals_name_the_rule_and_the_next_call():
    e = Refusal("unread-before-send", "core/juno has 2 unread message(s) (from kilo)",
                "call check_inbox (gitdrop inbox) first, then send again", commit="abc")
    text = mcp_tools.render_error(e)
    assert text.startswith("REFUSED by rule unread-before-send: core/juno has 2 unread")
    assert "Next: call check_inbox, then send again" in text and "gitdrop inbox" not in text
    e = Refusal("loop-guard", "core/juno sent 5 messages in the last 60s (room cap 5)",
                "wait 12s (until 2026-01-01 00:00:12 UTC) before sending again, or ask a lead "
                "to raise it (gitdrop room settings loop_cap N)")
    text = mcp_tools.render_error(e)
    assert "wait 12s" in text and 'room_settings with settings={"loop_cap": N}' in text
    assert "gitdrop " not in text
    e = Refusal("task-state-machine", "task 3 is pending; start needs assigned",
                "from pending the legal moves are: assign (→ assigned), claim (→ assigned)")
    assert "Next: from pending the legal moves are" in mcp_tools.render_error(e)


def test_client_templates_parse_and_name_the_server():
    import tomllib
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "templates")
    for name in ("claude-code.mcp.json", "claude-code-http.mcp.json", "gemini-settings.json",
                 "gemini-settings-http.json"):
        with open(os.path.join(root, name)) as f:
            server = json.load(f)["mcpServers"]["gitdrop"]
        assert server.get("args", ["serve"])[0] == "serve" or "url" in server or \
            "httpUrl" in server, name
    with open(os.path.join(root, "codex-config.toml"), "rb") as f:
        assert tomllib.load(f)["mcp_servers"]["gitdrop"]["args"][0] == "serve"
    for role in ("lead", "coder", "reviewer"):
        with open(os.path.join(root, "prompts", f"{role}.md")) as f:
            text = f.read()
        assert "register" in text and "check_inbox" in text
        for tool in ("ack_handshake", "submit_for_review", "approve_task", "initiate_handshake"):
            if tool in text:
                assert tool in mcp_tools.TOOLS


def call_tool(hub_path, agent, name, arguments):
    """tools/call's handler without a transport: what goes on the wire as the result."""
    server, box, _push = build(hub_path, "lobby", agent, "stdio", "all")
    handler = server._lowlevel_server.get_request_handler("tools/call").handler
    return handler.call(name, arguments)


def test_arguments_are_checked_as_the_input_schema_says(hub):
    from gitdrop.mcp.server import BadArgument, Params
    send = Params(mcp_tools.ToolBox.send)
    kw = send.check({"to_agent": "kilo", "message": "hi", "task_id": 3, "bogus": 1})
    assert kw == {"to_agent": "kilo", "message": "hi", "from_agent": "", "cc": "",
                  "task_id": 3, "reply_to": "", "key": ""}  # defaults filled, unknown ignored
    inbox = Params(mcp_tools.ToolBox.check_inbox)
    for given, want in (("5", 5), (" 7 ", 7), (5.0, 5), ("5.0", 5), (True, 1)):
        assert inbox.check({"limit": given})["limit"] == want, given  # as lax as pydantic
    pin = Params(mcp_tools.ToolBox.pin_room)
    for given, want in (("false", False), ("no", False), (0, False), ("On", True), (True, True)):
        assert pin.check({"pinned": given})["pinned"] is want, given
    submit = Params(mcp_tools.ToolBox.submit_for_review)
    for given, want in ((["api.py", " b.py "], ["api.py", "b.py"]), ("", []), ([], []),
                        ("api.py, b.py", ["api.py", "b.py"])):
        assert submit.check({"task_id": 1, "summary": "s", "files_changed": given})[
            "files_changed"] == want, given
    for params, args, words in (
            (send, {"message": "hi"}, "missing required argument 'to_agent'"),
            (send, {"to_agent": 5, "message": "hi"}, "'to_agent' must be a string, not 5"),
            (send, {"to_agent": "a", "message": "b", "task_id": None}, "a string or an integer"),
            (inbox, {"limit": "lots"}, "'limit' must be an integer, not \"lots\""),
            (inbox, {"limit": 5.5}, "an integer"), (inbox, {"limit": [1]}, "an integer"),
            (pin, {"pinned": 2}, "true or false"), (pin, {"pinned": "maybe"}, "true or false"),
            (submit, {"task_id": 1, "summary": "s", "files_changed": ["a", 2]}, "list of strings"),
            (submit, {"task_id": 1, "summary": "s", "files_changed": 3}, "list of strings")):
        with pytest.raises(BadArgument, match=words.replace("(", r"\(")):
            params.check(args)


def test_bad_arguments_and_refusals_come_back_as_tool_errors(hub):
    lobby = hub.room("lobby")
    lobby.register("core/juno", ["lead"])
    r = call_tool(hub.path, "core/juno", "check_inbox", {"limit": "lots"})
    text = r["content"][0]["text"]
    assert r["isError"] is True and "structuredContent" not in r
    assert "'limit' must be an integer" in text and "Next: call check_inbox with" in text
    r = call_tool(hub.path, "core/juno", "send", {"message": "hi"})
    assert r["isError"] and "missing required argument 'to_agent'" in r["content"][0]["text"]
    r = call_tool(hub.path, "core/juno", "no_such_tool", {})
    assert r["isError"] and r["content"][0]["text"] == "Unknown tool: no_such_tool"
    server, _box, _push = build(hub.path, "lobby", "core/juno", "stdio", "agent")
    calls = server._lowlevel_server.get_request_handler("tools/call").handler
    text = calls.call("approve_task", {"task_id": 1})["content"][0]["text"]
    assert text.startswith("Unknown tool: approve_task: it is a tool of the lead profile, "
                           "and this server was started with --tools agent"), text
    assert "Next: start the server with --tools lead or --tools all" in text
    text = calls.call("destroy_room", {"room_name": "x"})["content"][0]["text"]
    assert "Next: start the server with --tools all (" in text
    r = call_tool(hub.path, "core/juno", "send", {"to_agent": "nobody", "message": "hi"})
    assert r["isError"] and "rule unknown-recipient:" in r["content"][0]["text"]
    assert "Next: call who" in r["content"][0]["text"]
    r = call_tool(hub.path, "core/juno", "send", {"to_agent": "all", "message": "hi"})
    assert "isError" not in r and r["structuredContent"]["to"] == ["all"]
    assert json.loads(r["content"][0]["text"]) == r["structuredContent"]  # compact copy
    assert " " not in r["content"][0]["text"].replace("core/juno", "")


def test_through_a_client_descriptions_lists_and_profiles(hub):
    """The real SDK client and a stdio server of the agent profile: every parameter
    in tools/list has a description, submit_for_review takes its files as a list
    (the schema says so), and a lead tool says which profile has it."""
    from mcp_helpers import stdio_agent
    lobby = hub.room("lobby")
    lobby.register("core/juno", ["lead"])
    lobby.register("core/spartan", ["coder"])
    tid = lobby.create_task("core/juno", "Build the API", "", "spartan")["id"]
    lobby.move_task("core/spartan", tid, "start")

    async def session():
        async with stdio_agent(hub.path, "core/spartan", "legacy", tools="agent") as spartan:
            listed = {t.name: t for t in (await spartan.client.list_tools()).tools}
            assert len(listed) == len(mcp_tools.tools_for("agent"))
            for tool in listed.values():
                for name, prop in tool.input_schema["properties"].items():
                    assert prop.get("description"), (tool.name, name)
            files = listed["submit_for_review"].input_schema["properties"]["files_changed"]
            assert files["type"] == ["string", "array"] and files["items"] == {"type": "string"}
            done = await spartan.ok("submit_for_review", task_id=tid, summary="GET /users",
                                    files_changed=["api.py", "tests/test_api.py"])
            assert done["state"] == "review"
            r = await spartan.call("approve_task", task_id=tid)
            assert r.is_error and "it is a tool of the lead profile" in r.content[0].text
            assert "--tools lead" in r.content[0].text
            r = await spartan.call("no_such_tool")
            assert r.is_error and r.content[0].text == "Unknown tool: no_such_tool"
    anyio.run(session)
    assert "Files changed: api.py, tests/test_api.py" in lobby.task(tid)["note"]


def test_a_read_that_moves_the_cursor_leaves_no_walk_behind(hub):
    """The walk memo keeps what a walk from a cursor found, for a cursor that stays
    (a peek, or nothing new); a read moves the cursor past what it found, so its walk
    would never be asked for again (and every such entry is rewritten on each flush)."""
    lobby = hub.room("lobby")
    lobby.register("core/juno", ["lead"])
    lobby.register("core/kilo", [])
    memo = lobby.store.reader.walks
    inbox_keys = lambda: {k for k in memo if k[0] == "inbox" and k[1] == "core/kilo"}  # noqa: E731
    lobby.send("core/juno", "kilo", "hi")
    assert [m["text"] for m in lobby.inbox("core/kilo")["messages"]] == ["hi"]
    assert inbox_keys() == set()  # the read moved the cursor past its walk
    assert lobby.inbox("core/kilo")["messages"] == []
    (stays,) = inbox_keys()  # nothing new: the cursor stays, the walk is kept
    lobby.send("core/juno", "kilo", "again")
    assert [m["text"] for m in lobby.inbox("core/kilo", peek=True)["messages"]] == ["again"]
    assert inbox_keys() == {stays} and memo[stays][1]  # a peek leaves the cursor too


@pytest.mark.parametrize("version", ["2025-11-25", "2026-07-28"])
def test_a_plain_tools_call_is_answered_as_the_sdk_would(hub, version):
    """The middleware answers a plain tools/call itself (mcp_server.answer); what it
    sends must be what the SDK's pipeline would: its result surface for the version
    leaves the dict as it is, and a 2026 result carries resultType and serverInfo."""
    from mcp_types import SERVER_INFO_META_KEY
    from mcp_types.methods import serialize_server_result
    from gitdrop.mcp.server import answer
    lobby = hub.room("lobby")
    lobby.register("core/juno", ["lead"])
    lobby.register("core/kilo", [])
    server, _box, _push = build(hub.path, "lobby", "core/juno", "stdio", "all")
    calls = server._lowlevel_server.get_request_handler("tools/call").handler
    stamp = lambda: server._lowlevel_server.server_info_stamp  # noqa: E731
    for name, args in (("send", {"to_agent": "kilo", "message": "hi", "cc": ""}),
                       ("who", {}), ("check_inbox", {"limit": 5}), ("list_tasks", {}),
                       ("send", {"message": "no recipient"}),          # bad arguments
                       ("send", {"to_agent": "nobody", "message": "x"}),  # a refusal
                       ("no_such_tool", {})):
        wire = answer(calls, {"name": name, "arguments": args}, version, stamp)
        meta = wire.pop("_meta", None)
        assert serialize_server_result("tools/call", version, wire) == wire, (name, wire)
        if version == "2026-07-28":
            assert wire["resultType"] == "complete"
            assert meta == {SERVER_INFO_META_KEY: {"name": "gitdrop",
                                                   "version": meta[SERVER_INFO_META_KEY]["version"]}}
        else:
            assert meta is None and "resultType" not in wire


def test_a_session_past_its_handshake_gets_the_direct_answer(hub, monkeypatch):
    """The middleware's direct answer is really taken by a real SDK client's calls
    (it falls back to the SDK's pipeline silently, so this is the check that it
    does not: the gate it reads is the SDK's own)."""
    from mcp import Client
    from gitdrop.mcp import server as mcp_server
    lobby = hub.room("lobby")
    lobby.register("core/juno", ["lead"])
    answered, answer = [], mcp_server.answer

    def counting(calls, params, version, stamp):
        answered.append(params["name"])
        return answer(calls, params, version, stamp)
    monkeypatch.setattr(mcp_server, "answer", counting)
    server, _box, _push = build(hub.path, "lobby", "core/juno", "stdio", "agent")

    async def session():
        async with Client(server) as client:
            who = await client.call_tool("who", {})
            assert not who.is_error and who.structured_content["agents"], who
            bad = await client.call_tool("check_inbox", {"limit": "lots"})
            assert bad.is_error and "'limit' must be an integer" in bad.content[0].text
    anyio.run(session)
    assert answered == ["who", "check_inbox"]


ENVELOPE = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {}}


@pytest.mark.parametrize("version", ["2025-11-25", "2026-07-28"])
def test_stdio_calls_through_the_sdks_serving_loop(hub, version):
    """Over stdio (here the real server and the SDK's serving loop on two OS pipes,
    driven line by line), every request goes through the SDK: plain calls,
    refusals, bad arguments, a progress token, tools/list."""
    from gitdrop.mcp import server as mcp_server
    lobby = hub.room("lobby")
    lobby.register("core/juno", ["lead"])
    lobby.register("core/kilo", [])
    server, _box, _push = build(hub.path, "lobby", "core/juno", "stdio", "all")
    low = server._lowlevel_server
    modern = version == "2026-07-28"
    to_server, from_server = os.pipe(), os.pipe()
    ids = iter(range(1, 100))

    async def session():
        read, write = await mcp_server.wire(to_server[0], from_server[1])
        out, inp = os.fdopen(to_server[1], "wb", buffering=0), os.fdopen(from_server[0], "rb")

        async def rpc(method, params, notify=False):
            msg = {"jsonrpc": "2.0", "method": method, "params": params}
            if not notify:
                msg["id"] = next(ids)
            out.write(json.dumps(msg).encode() + b"\n")
            while not notify:
                reply = json.loads(await anyio.to_thread.run_sync(inp.readline))
                if reply.get("id") == msg["id"]:
                    return reply

        def call(name, args, meta=ENVELOPE if modern else None):
            params = {"name": name, "arguments": args}
            if meta is not None:
                params["_meta"] = meta
            return rpc("tools/call", params)

        async with anyio.create_task_group() as tg:
            tg.start_soon(low.run, read, write, low.create_initialization_options())
            if not modern:
                init = await rpc("initialize", {"protocolVersion": version, "capabilities": {},
                                                "clientInfo": {"name": "t", "version": "1"}})
                assert init["result"]["protocolVersion"] == version
                await rpc("notifications/initialized", {}, notify=True)
            first = await call("list_tasks", {})
            second = await call("list_tasks", {})
            assert second == dict(first, id=second["id"])
            sent = await call("send", {"to_agent": "kilo", "message": "hi"})
            assert sent["result"]["structuredContent"]["to"] == ["core/kilo"]
            refused = await call("send", {"to_agent": "nobody", "message": "x"})
            assert refused["result"]["isError"]
            assert "rule unknown-recipient:" in refused["result"]["content"][0]["text"]
            bad = await call("check_inbox", {"limit": "lots"})
            assert bad["result"]["isError"]
            token = {"progressToken": 7}
            with_token = await call("list_tasks", {}, dict(ENVELOPE, **token) if modern else token)
            assert with_token["result"]["structuredContent"] == \
                first["result"]["structuredContent"]
            listed = await rpc("tools/list", {"_meta": ENVELOPE} if modern else {})
            assert len(listed["result"]["tools"]) == len(mcp_tools.tools_for("all"))
            out.close()   # end of input: the server's loop ends
    anyio.run(session)
    assert [m["text"] for m in lobby.history(1)] == ["hi"]


def test_a_path_lease_never_says_it_holds_longer_than_asked(hub):
    """`left` was reckoned from a time read before the write: a take that crossed a
    second's edge was said to hold 601 s of a ttl of 600."""
    hub.room("lobby").register("core/spartan")
    box = mcp_tools.ToolBox(hub.path, "lobby", "core/spartan")
    ticks = iter(range(1_800_000_000, 1_800_000_100))
    box.room.clock = lambda: next(ticks)   # each reading a second later
    got = box.path_lease(action="take", glob="src/**", ttl_seconds=600)["leases"][0]
    assert 0 < got["left"] < 600, got


def test_check_inbox_again_shows_the_whole_last_read_whatever_its_limit(hub):
    """Shown again with this call's limit (20 by default), a lost read of 30 left its
    last 10 out of reach: calling again showed the same 20."""
    lobby = hub.room("lobby")
    lobby.register("core/juno", ["lead"])
    lobby.register("core/kai", [])
    for i in range(30):
        lobby.send("core/juno", "core/kai", f"note {i}")
    got = call_tool(hub.path, "core/kai", "check_inbox", {"limit": 30})["structuredContent"]
    assert len(got["messages"]) == 30 and got["remaining"] == 0
    again = call_tool(hub.path, "core/kai", "check_inbox", {"again": True})["structuredContent"]
    assert [m["text"] for m in again["messages"]] == [f"note {i}" for i in range(30)]
    assert again["remaining"] == 0
