"""Trust through the MCP doors: the attack file's inputs over streamable HTTP (with
and without a token) and stdio, with the real SDK client. Every refusal names its
rule and the next step, and leaves no commit behind."""

import os
import socket
import subprocess
import sys
import time

import httpx2
import pytest
from mcp_helpers import check_result, http_agent, http_server, stdio_agent

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


async def test_http_registration_is_closed_or_limited(hub):
    """A server others reach registers nobody without a token the owner minted; an
    open one takes a burst of new agents from one address, then one a second."""
    from gitdrop import tokens
    from gitdrop.mcp.tools import JOIN_BURST, JOIN_EVERY
    lobby = hub.room("lobby")
    lobby.register("core/juno", ["lead"])
    with http_server(hub.path, "agent", "--registration", "closed") as url:
        before = tips(hub)
        r = httpx2.post(url, json=_initialize(), headers=_ACCEPT, timeout=30)
        assert r.status_code == 401 and "gitdrop token" in r.text, r.text
        r = httpx2.post(url, json=_initialize(), timeout=30,   # nor with a made-up one
                        headers={**_ACCEPT, "Authorization": "Bearer gd_made_up"})
        assert r.status_code == 401 and "not valid" in r.text, r.text
        assert tips(hub) == before and not tokens.Verifier(hub.path).has("core/eve")
        # a token the owner minted opens a session, and registers (updates) its agent
        async with http_agent(url, "eve", "auto", tokens.mint(hub.path, "core/eve")) as eve:
            assert (await eve.ok("register", agent_name="eve", team="core"))["agent"] == "core/eve"
            await eve.ok("send", to_agent="juno", message="in by a minted token")
    with http_server(hub.path) as url:
        async with http_agent(url, "anon", "auto") as anon:
            # the bucket refills one a second while the loop runs: count until refused
            # (the refusal's trace is looked for around the refused call itself: the
            # next call may come after the bucket's refill, and be let in)
            start, joined, why = time.monotonic(), 0, ""
            while not why and joined < 3 * JOIN_BURST:
                before = tips(hub)
                r = await anon.call("register", agent_name=f"bot{joined}", team="swarm")
                if r.is_error:
                    why = r.content[0].text
                    assert tips(hub) == before
                else:
                    joined += 1
            took = time.monotonic() - start
            assert "rule token:" in why and "127.0.0.1 registered" in why and "wait" in why
            assert JOIN_BURST <= joined <= JOIN_BURST + took / JOIN_EVERY + 1
        # the limit is on new agents: an agent with its token goes on as before
        async with http_agent(url, "juno", "auto") as juno:
            juno.authenticate(tokens.mint(hub.path, "core/juno"))
            await juno.ok("register", agent_name="juno", team="core", description="still here")
    assert len([a for a in lobby.view().agent_ids() if a.startswith("swarm/")]) == joined


_ACCEPT = {"Accept": "application/json, text/event-stream"}


def _initialize(ident=1) -> dict:
    return {"jsonrpc": "2.0", "id": ident, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"}}}


def _call(ident, method, params) -> dict:
    return {"jsonrpc": "2.0", "id": ident, "method": method, "params": params}


async def test_an_http_session_is_its_agents_alone(hub):
    """The SDK takes any session id: with kai's, no token listened to kai's news, and
    juno's token took kai's session over. A session is bound to the agent whose token
    came with it; and it subscribes only to resources there are, a few at a time."""
    from gitdrop import tokens
    from gitdrop.mcp.server import MAX_SUBSCRIPTIONS
    lobby = hub.room("lobby")
    lobby.register("core/juno", ["lead"])
    lobby.register("core/kai")
    kai = {**_ACCEPT, "Authorization": "Bearer " + tokens.mint(hub.path, "core/kai")}
    juno = {**_ACCEPT, "Authorization": "Bearer " + tokens.mint(hub.path, "core/juno")}
    with http_server(hub.path) as url:
        with httpx2.Client(timeout=30) as c:
            r = c.post(url, json=_initialize(), headers=kai)
            sid = r.headers["mcp-session-id"]
            c.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                   headers={**kai, "mcp-session-id": sid})
            for who in (juno, _ACCEPT):   # another agent's token, or none
                r = c.post(url, json=_call(2, "tools/call", {"name": "who", "arguments": {}}),
                           headers={**who, "mcp-session-id": sid})
                assert r.status_code == 403 and "another agent" in r.text, r.text
                assert c.get(url, headers={**who, "mcp-session-id": sid}).status_code == 403
            own = {**kai, "mcp-session-id": sid}

            def subscribe(ident, uri):
                r = c.post(url, json=_call(ident, "resources/subscribe", {"uri": uri}),
                           headers=own)
                return r.text
            assert '"error"' not in subscribe(3, "gitdrop://inbox/core/kai")
            assert "no resource" in subscribe(4, "gitdrop://" + "x" * 5000)
            for k in range(MAX_SUBSCRIPTIONS - 1):
                assert '"error"' not in subscribe(10 + k, f"gitdrop://tasks/{k + 1}")
            assert "at most" in subscribe(99, "gitdrop://tasks/999")


def test_half_sent_connections_do_not_end_the_http_server(hub, tmp_path):
    """Connections that send half a request and stay: at the open-file limit an
    accept failed, and the error's log handler, importing as it logged, ended the
    server. Connections past what the limit leaves are closed at once."""
    import resource
    from conftest import free_port
    from mcp_helpers import ROOT, server_args
    hub.room("lobby").register("core/juno", ["lead"])
    port = free_port()

    def low_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    p = subprocess.Popen([sys.executable, *server_args(hub.path, "--transport", "http",
                                                       "--port", str(port))],
                         cwd=ROOT, preexec_fn=low_limit, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    held = []
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        for _ in range(400):
            try:
                s = socket.create_connection(("127.0.0.1", port), 2)
                s.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                held.append(s)
            except OSError:
                pass
        time.sleep(1)
        assert p.poll() is None, "the server ended"
        for s in held:
            s.close()
        held.clear()
        time.sleep(1)
        r = httpx2.post(f"http://127.0.0.1:{port}/mcp", json=_initialize(), headers=_ACCEPT,
                        timeout=30)
        assert r.status_code == 200 and p.poll() is None, r.text
    finally:
        for s in held:
            s.close()
        p.kill()
        p.wait()


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


# A good value for each required parameter but the one under attack.
GOOD = {"to_agent": "spartan", "message": "hi", "title": "t", "task_id": "1",
        "team_name": "core", "name": "r1", "key": "k", "value": "v", "leader": "core/juno",
        "agents": ["core/spartan"], "members": ["core/spartan"], "status": "in_progress",
        "contract_name": "api.x", "glob": "src/**", "action": "list"}
HOSTILE = {"integer": [-1, 10 ** 30, "abc", 1.5, True, None, ""],
           "boolean": ["x", 2, None],
           "array": [[""], "not a list", [1, 2], [None], ["x" * 300]],
           # the SDK's client cannot send a lone surrogate: JSON text is UTF-8
           "string": [v for v in attacks.HOSTILE_ARGS if v != "\udcff"] + [None, 7, ["x"]]}


def _kind(schema: dict) -> str:
    kind = schema.get("type") or next((s.get("type") for s in schema.get("anyOf", [])
                                       if s.get("type") != "null"), "string")
    if isinstance(kind, list):   # ["string", "integer"]: hostile strings reach both
        kind = "string"
    return kind if kind in HOSTILE else "string"


def _good(name: str, schema: dict):
    if name in GOOD:
        return GOOD[name]
    return {"integer": 1, "boolean": False, "array": ["x"]}.get(_kind(schema), "x")


async def test_every_tool_answers_hostile_values_with_a_next_step(hub):
    """Every tool, every parameter, each hostile value (the others good): a result
    of the tool's type, or an error that says what to do next. Found this way: a
    task title refused on edit, a team's lead or members of another team, a
    contract's owner changed, and a dozen more refusals named no next step."""
    lobby = hub.room("lobby")
    lobby.register("core/juno", ["lead"])
    lobby.register("core/spartan")
    lobby.create_task("core/juno", "held", assignee="core/spartan")
    calls, bad = 0, []
    async with stdio_agent(hub.path, "core/juno", "auto") as juno:
        for tool in (await juno.client.list_tools()).tools:
            if tool.name == "deregister":   # would leave the session nobody to act for
                continue
            props = tool.input_schema.get("properties", {})
            required = tool.input_schema.get("required", [])
            for param, schema in props.items():
                for value in HOSTILE[_kind(schema)]:
                    args = {q: _good(q, props[q]) for q in required if q != param}
                    args[param] = value
                    r = await juno.client.call_tool(tool.name, args)
                    calls += 1
                    text = r.content[0].text if r.content else ""
                    if r.is_error:
                        if "Next:" not in text:
                            bad.append((tool.name, param, repr(value)[:40], text[:200]))
                    else:
                        try:
                            check_result(tool.name, r.structured_content, text)
                        except Exception as e:
                            bad.append((tool.name, param, repr(value)[:40], repr(e)[:200]))
        await juno.ok("send", to_agent="spartan", message="still fine")
    assert calls > 1000, calls
    assert not bad, bad[:10]


def test_a_line_the_sdk_cannot_read_is_answered_on_stdio(hub):
    """JSON that is not Unicode (a lone surrogate escape) or not JSON at all: the SDK
    only logged such a line, so the client waited for its answer for ever. Now a
    request gets an error with its id and the next step, bad JSON a parse error,
    and the session goes on."""
    import json
    import select
    import subprocess
    import sys
    from mcp_helpers import ROOT, server_args
    lobby = hub.room("lobby")
    lobby.register("core/juno", ["lead"])
    p = subprocess.Popen([sys.executable, *server_args(hub.path, "--as", "core/juno")],
                         cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL)

    def say(line: str) -> None:
        p.stdin.write(line.encode() + b"\n")
        p.stdin.flush()

    poll = select.poll()   # not select(): a test worker's fds may pass 1024
    poll.register(p.stdout, select.POLLIN)

    pending = bytearray()   # read by hand: answers arriving together would sit in a buffered
                        # reader's buffer, out of poll's sight

    def answer() -> dict:
        while b"\n" not in pending:
            assert poll.poll(60_000), "no answer"
            pending.extend(os.read(p.stdout.fileno(), 1 << 20))
        line, _, rest = bytes(pending).partition(b"\n")
        pending[:] = rest
        return json.loads(line)

    try:
        say(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"}}}))
        assert answer()["id"] == 1
        say('{"jsonrpc":"2.0","method":"notifications/initialized"}')
        say('{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"send",'
            '"arguments":{"to_agent":"\\udcff","message":"hi"}}}')
        got = answer()
        assert got["id"] == 2 and "surrogate" in got["error"]["message"] \
            and "Next:" in got["error"]["message"], got
        say("{not json")
        got = answer()
        assert got["id"] is None and got["error"]["code"] == -32700, got
        say('{"jsonrpc":"2.0","method":"notifications/x","params":{"a":"\\udcff"}}')  # no answer
        # a line past the reader's 16 MiB ended the server; now it is dropped, said so
        say('{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"send",'
            '"arguments":{"to_agent":"all","message":"' + "x" * (17 << 20) + '"}}}')
        say('{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"who",'
            '"arguments":{}}}')
        got = answer()
        assert got["id"] is None and "MiB was dropped" in got["error"]["message"], got
        while got.get("id") != 3:   # the long line's tail reads as a line of its own
            got = answer()
        assert "core/juno" in got["result"]["content"][0]["text"], got
    finally:
        p.kill()
        p.wait()


async def test_an_open_registration_joins_no_team_s_closed_room(hub):
    """Anyone who reaches a server with open registration names its agent: as
    core/<anything> it was registered in team core's closed room, and read and wrote
    there as one of core's. A closed room registers its teams' members only (the
    hub's team registry, which core's lead keeps)."""
    from gitdrop import tokens
    hub.register_team("core", "core/juno", ["spartan"])
    hub.create_room("hub/admin", "proj", teams=["core"])
    hub.room("proj").register("core/juno")
    with http_server(hub.path, "agent", room="proj") as url:
        async with http_agent(url, "anon", "auto") as anon:
            before = tips(hub)
            text = await anon.refused("register", "room-membership", agent_name="core/newbie")
            assert "register_team(team_name='core', leader='core/juno', members='newbie')" \
                in text and "gitdrop team" not in text, text
            assert "gitdrop token core/newbie" in text   # the owner's step, a command
            assert tips(hub) == before
            assert not os.path.exists(os.path.join(hub.path, "gitdrop", "tokens.json"))
        # its lead names it a member, and the hub's owner mints its token
        hub.register_team("core", "core/juno", ["newbie"], by="core/juno")
        async with http_agent(url, "newbie", "auto", tokens.mint(hub.path, "core/newbie")) as nb:
            await nb.ok("register", agent_name="core/newbie")
    assert hub.room("proj").view().agent("core/newbie")


async def test_no_token_is_minted_for_a_name_someone_has_elsewhere_on_the_hub(hub):
    """Tokens are hub-wide, but `register` looked for the name in the served room
    alone: a lead registered by the command line in another room (so without a token)
    was registered anew by an anonymous caller, who got a token for it and changed
    and archived that lead's room. A name the hub knows anywhere (a room, active or
    archived, or the team registry) gets its token from the hub's owner."""
    hub.register_team("core", "core/juno", ["spartan", "kai"])
    hub.register_team("web", "web/ana", members=["web/bob"])
    hub.create_room("hub/admin", "proj", teams=["core", "web"])
    hub.room("proj").register("core/juno")
    hub.room("proj").register("core/spartan")
    hub.create_room("hub/admin", "old", teams=["core"])
    hub.room("old").register("core/kai")
    hub.archive_room("old", by="core/juno")
    hub.create_room("hub/admin", "pub", open_=True)
    hub.room("pub").register("solo/zed")
    with http_server(hub.path) as url:   # it serves the lobby, where none of them is
        async with http_agent(url, "anon", "auto") as anon:
            before = tips(hub)
            for name, where in (("core/juno", "lead of team core"),
                                ("core/spartan", "member of team core"),
                                ("core/kai", "member of team core"), ("solo/zed", "room pub"),
                                ("web/ana", "lead of team web"),
                                ("web/bob", "member of team web")):
                text = await anon.refused("register", "token", agent_name=name)
                assert where in text and f"gitdrop token {name}" in text, text
            assert tips(hub) == before
            assert not os.path.exists(os.path.join(hub.path, "gitdrop", "tokens.json"))
            # a name nobody has is still anyone's to take, as before
            reg = await anon.ok("register", agent_name="core/newcomer")
            assert reg["token"].startswith("gd_")
