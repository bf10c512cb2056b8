"""Big rooms: a room of 10,000 agents (built with git fast-import, not 10,000 core
calls) costs a write no more than a room of 100, `who` and `room show` answer a
page in well under a second, MCP answers stay small; and a hub whose rooms are in
the old flat layout moves them when it opens (CLI, MCP server, a push), once."""

import contextlib
import json
import os
import subprocess
import sys
import time

import anyio
import pytest
from mcp import Client, StdioServerParameters

from gitdrop import fmt, layout, model
from gitdrop import hub as hubmod
from gitdrop.basestore import identity

from conftest import free_port, git, refused_rule
from mcp_helpers import Agent
from test_transports import wait_for_port


@contextlib.asynccontextmanager
async def mcp_agent(hub_path, room, agent, tools="all"):
    """A real SDK client on a stdio server of `room`, bound to `agent`."""
    params = StdioServerParameters(command=sys.executable, cwd=ROOT, args=[
        "-m", "gitdrop.mcp.server", hub_path, room, "--as", agent, "--tools", tools])
    async with Client(params, mode="legacy") as c:
        yield Agent(c, agent)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HISTORY = 2000   # messages before the agents arrive: who's walk for last acts meets them


def _commit(ref, author, when, message, files=(), parent=""):
    name, email = identity(author)
    out = [f"commit {ref}\nauthor {name} <{email}> {when} +0000\n"
           f"committer {name} <{email}> {when} +0000\n"]
    msg = message.encode()
    out.append(f"data {len(msg)}\n{message}\n")
    if parent:
        out.append(f"from {parent}\n")
    for path, text in files:
        data = text.encode()
        out.append(f"M 100644 inline {path}\ndata {len(data)}\n{text}\n")
    return "".join(out) + "\n"


def fast_import(git_dir, script: str) -> None:
    subprocess.run(["git", "--git-dir", git_dir, "fast-import", "--quiet", "--force"],
                   input=script.encode(), check=True)


def big_room(hub, room: str, agents: int, history: int = HISTORY) -> list[str]:
    """A room of `agents` agents of team core (core/a0 ...), in the current layout:
    created, `history` messages, then every agent at once (their cursor at the tip)."""
    ref = model.ROOM_PREFIX + room
    now = int(time.time())
    t0 = now - 7200
    room_toml = fmt.dumps_toml(model.with_defaults("room", {
        "name": room, "created": t0, "open": True, "layout": model.LAYOUT}))
    parts = [_commit(ref, "hub/admin", t0, fmt.format_message(
        f"room {room} created", "", [("op", "room-create")]), [(model.ROOM_FILE, room_toml)])]
    for i in range(history):
        parts.append(_commit(ref, "core/a0", t0 + 1 + i // 10, fmt.format_message(
            f"a0 → a1: note {i}", f"note {i}", [("op", "send"), ("to", "core/a1")])))
    fast_import(hub.path, "".join(parts))
    tip = hub.store.tip(ref)
    ids = [f"core/a{i}" for i in range(agents)]
    files = [(model.agent_path(a), fmt.dumps_toml({
        "id": a, "registered": now - 600, "last_seen": now - 600, "cursor": tip}))
        for a in ids]
    fast_import(hub.path, _commit(ref, "hub/admin", now - 600, fmt.format_message(
        f"{agents} agents", "", [("op", "register")]), files, parent=tip))
    return ids


def loose_objects(git_dir) -> dict:
    out = {}
    top = os.path.join(git_dir, "objects")
    for d in os.listdir(top):
        if len(d) == 2:
            for f in os.listdir(os.path.join(top, d)):
                out[d + f] = os.path.getsize(os.path.join(top, d, f))
    return out


def written(git_dir, act) -> int:
    """Bytes of the objects `act` writes (their loose, compressed files)."""
    before = loose_objects(git_dir)
    act()
    after = loose_objects(git_dir)
    new = {k: v for k, v in after.items() if k not in before}
    assert new, "the act wrote nothing"
    return sum(new.values())


def cost_per_op(hub, room: str) -> dict:
    r = hub.room(room)
    return {
        "send": written(hub.path, lambda: r.send("core/a5", "core/a7", "hello")),
        "read": written(hub.path, lambda: r.inbox("core/a7")),
        "register": written(hub.path, lambda: r.register("core/newcomer")),
    }


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """One hub with a room of 100 agents and one of 10,000."""
    hub = hubmod.init(str(tmp_path_factory.mktemp("big") / "hub.git"))
    hub.create_room("hub/admin", "small", open_=True)
    big_room(hub, "small", 100)
    hub.create_room("hub/admin", "huge", open_=True)
    big_room(hub, "huge", 10000)
    return hub


def test_a_write_costs_the_same_in_a_room_of_10000_as_of_100(big):
    small, huge = cost_per_op(big, "small"), cost_per_op(big, "huge")
    print("bytes per op, 100 agents:", small, "10,000 agents:", huge)
    for op in small:
        # a flat agents/core/ of 10,000 entries alone is ~300 KB per read or registration
        assert huge[op] < 16000, (op, huge[op])
        assert huge[op] <= 4 * small[op], (op, small[op], huge[op])
    # every agent, cursor and message is still there
    r = big.room("huge")
    assert r.inbox("core/a7")["messages"] == [] and r.view().agent("core/a9999")
    assert "core/newcomer" in {a["agent"] for a in r.who_page(0, 0)["agents"]}


@pytest.mark.alone   # a time limit: measured while no other test runs
@pytest.mark.xdist_group("tests/test_bigroom.py:big")   # with the other users of `big`
def test_who_and_room_show_answer_a_page_in_under_a_second(big):
    r = big.room("huge")
    r.who_page(0, 1)   # warm: the agents' file listings are read once per process
    t = time.monotonic()
    page = r.who_page(100, 100)
    took = time.monotonic() - t
    assert took < 1.0, took
    assert [a["agent"] for a in page["agents"]] == sorted(
        f"core/a{i}" for i in range(10000))[100:200]
    assert page["total"] >= 10000 and page["more"] == page["total"] - 200
    assert page["offset"] == 100 and all(a["health"] for a in page["agents"])
    t = time.monotonic()
    st = big.room_status("huge", 0, 100)
    took = time.monotonic() - t
    assert took < 1.0, took
    assert len(st["agents"]) == 100 and st["agents_total"] == page["total"]
    assert st["agents_more"] == st["agents_total"] - 100


def _cli(hub, *args, room="huge"):
    env = dict(os.environ, GITDROP_HUB=hub.path, GITDROP_ROOM=room)
    t = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "gitdrop", *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout, time.monotonic() - t


@pytest.mark.alone   # a time limit: measured while no other test runs
@pytest.mark.xdist_group("tests/test_bigroom.py:big")   # with the other users of `big`
def test_cli_who_and_room_show_page_and_say_how_many_more(big):
    """The commands' own time, past Python's start-up, is under a second: a run in
    the room of 100 is the baseline (the same start-up, on the same machine now)."""
    base = _cli(big, "who", "--limit", "20", "--offset", "40", room="small")[1]
    out, took = _cli(big, "who", "--limit", "20", "--offset", "40")
    print(f"gitdrop who: {took:.2f} s (100 agents: {base:.2f} s)")
    lines = out.strip().splitlines()
    total = big.room("huge").who_page(0, 1)["total"]
    assert lines[-1] == f"… {total - 60} more of {total}: gitdrop who --offset 60"
    assert sum(1 for line in lines if line.startswith("core/")) == 20
    assert took - base < 1.0, (took, base)
    doc = json.loads(_cli(big, "who", "--json", "-n", "5")[0])
    assert len(doc["agents"]) == 5 and doc["more"] == total - 5 and doc["total"] == total
    base = _cli(big, "room", "show", "small", "-n", "3", room="small")[1]
    out, took = _cli(big, "room", "show", "huge", "-n", "3")
    print(f"gitdrop room show: {took:.2f} s (100 agents: {base:.2f} s)")
    assert f"… {total - 3} more of {total}: gitdrop room show huge --offset 3" in out
    assert took - base < 1.0, (took, base)


def test_every_mcp_answer_in_a_room_of_10000_stays_small(big):
    async def session():
        async with mcp_agent(big.path, "huge", "core/a1") as a:
            sizes = {}
            first = await a.ok("who")
            assert len(first["agents"]) == 50 and first["more"] > 9900
            second = await a.ok("who", offset=50)
            assert [x["agent"] for x in second["agents"]] == sorted(
                f"core/a{i}" for i in range(10000))[50:100]
            sizes["who"] = len(json.dumps(first, ensure_ascii=False).encode())
            for tool, args in (("room_status", {}), ("check_inbox", {}), ("list_tasks", {})):
                r = await a.call(tool, **args)
                assert not r.is_error, (tool, r.content[0].text)
                sizes[tool] = len(r.content[0].text.encode())
            for uri in ("gitdrop://room", "gitdrop://inbox/core/a1"):
                res = await a.client.read_resource(uri)
                sizes[uri] = len(res.contents[0].text.encode())
            return sizes
    sizes = anyio.run(session)
    print("MCP answer bytes:", sizes)
    assert max(sizes.values()) < 64_000, sizes   # the SDK client's limit is 1 MB


# --- moving rooms of the old layout ------------------------------------------------

def old_hub(path, monkeypatch) -> tuple[str, dict]:
    """A hub whose room `old` is in layout 1, made by the core itself as it was
    (agents/<team>/<name>.toml, tasks/<id>.md, no layout in room.toml): agents with
    read cursors, tasks in several states, messages. Returns (path, what it holds)."""
    with monkeypatch.context() as m:
        m.setattr(model, "LAYOUT", 1)
        hub = hubmod.init(path)
        ref = hub.store.room_ref("old")

        def create(view, tip):
            text = fmt.dumps_toml({"name": "old", "created": hub.clock(), "open": True})
            return {model.ROOM_FILE: text}, fmt.format_message(
                "room old created", "", [("op", "room-create")]), {}
        hub.store.write(ref, create, "hub/admin")
        r = hub.room("old")
        for a in ("core/juno", "core/kai", "core/ada", "web/lin"):
            r.register(a)
        t1 = r.create_task("core/juno", "first", assignee="core/kai")["id"]
        t2 = r.create_task("core/juno", "second")["id"]
        r.move_task("core/kai", t1, "start")
        r.send("core/juno", "core/kai", "how is it going")
        r.inbox("core/kai")
        view = r.view()
        assert view.layout == 1 and "layout" not in view.text(model.ROOM_FILE)
        assert view.text("agents/core/kai.toml") and view.text(f"tasks/{t1}.md")
        kept = {"agents": {a["id"]: a for a in view.agents()},
                "tasks": {t: view.task(t) for t in view.task_ids()}, "tip": view.commit,
                "t1": t1, "t2": t2}
    return hub.path, kept


def moves(git_dir, room="old") -> list[str]:
    log = git("--git-dir", git_dir, "log", "--format=%an %(trailers:key=Gitdrop-Op,valueonly)",
              f"rooms/{room}").stdout
    return [line for line in log.splitlines() if line.strip().endswith(layout.OP)]


def assert_moved(path, kept):
    hub = hubmod.Hub(path)
    view = hub.store.view("old")
    assert view.layout == model.LAYOUT and len(moves(path)) == 1
    assert {a["id"]: a for a in view.agents()} == kept["agents"]   # cursors included
    assert {t: view.task(t) for t in view.task_ids()} == kept["tasks"]
    for a in kept["agents"]:
        assert view.text(model.agent_path(a)) and view.text(model.agent_path(a, 1)) is None
    c = hub.store.reader.commit(view.commit)
    assert c.author == layout.MOVER and c.parent == kept["tip"]
    assert hub.verify("old")[-1][1] == layout.OP   # the whole history checks out


def test_an_old_room_moves_when_the_cli_opens_the_hub(tmp_path, monkeypatch):
    path, kept = old_hub(str(tmp_path / "hub.git"), monkeypatch)
    env = dict(os.environ, GITDROP_HUB=path, GITDROP_ROOM="old", GITDROP_AGENT="core/kai")
    p = subprocess.run([sys.executable, "-m", "gitdrop", "task", "show", kept["t1"]], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "first" in p.stdout, p.stderr
    assert_moved(path, kept)
    p = subprocess.run([sys.executable, "-m", "gitdrop", "verify", "old"], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    r = hubmod.Hub(path).room("old")   # and it works on: a read moves a bucketed cursor
    r.send("core/juno", "core/kai", "still there?")
    assert [m["text"] for m in r.inbox("core/kai")["messages"]] == ["still there?"]
    assert len(moves(path)) == 1


def test_an_old_room_moves_when_the_mcp_server_opens_the_hub(tmp_path, monkeypatch):
    path, kept = old_hub(str(tmp_path / "hub.git"), monkeypatch)

    async def session():
        async with mcp_agent(path, "old", "core/ada", tools="agent") as a:
            return await a.ok("who")
    who = anyio.run(session)
    assert sorted(x["agent"] for x in who["agents"]) == sorted(kept["agents"])
    assert_moved(path, kept)


def test_a_push_to_an_old_room_moves_it_and_is_told_to_fetch(tmp_path, monkeypatch):
    path, kept = old_hub(str(tmp_path / "hub.git"), monkeypatch)
    work = str(tmp_path / "work")
    git("clone", "-q", "-b", "rooms/old", path, work)
    git("config", "user.name", "core/ada", cwd=work)
    git("config", "user.email", "ada@example.org", cwd=work)
    os.makedirs(os.path.join(work, "context"))
    with open(os.path.join(work, "context", "notes.md"), "w") as f:
        f.write("hello\n")
    git("add", "context/notes.md", cwd=work)
    git("commit", "-q", "-m", "notes", cwd=work)
    p = git("push", "origin", "HEAD:rooms/old", cwd=work, check=False)
    assert p.returncode != 0 and refused_rule(p.stderr) == "layout", p.stderr
    assert "fetch the room (git pull --rebase)" in p.stderr
    assert_moved(path, kept)
    git("pull", "-q", "--rebase", "origin", "rooms/old", cwd=work)
    assert os.path.exists(os.path.join(work, model.agent_path("core/ada")))
    assert git("push", "-q", "origin", "HEAD:rooms/old", cwd=work, check=False).returncode == 0
    # a file at its old path, pushed after the move, is refused naming the new path
    task = fmt.dumps_doc({"id": "9", "title": "by hand", "creator": "core/ada"}, "x")
    for where in ("tasks/9.md", "tasks/00/9.md"):
        os.makedirs(os.path.dirname(os.path.join(work, where)), exist_ok=True)
        with open(os.path.join(work, where), "w") as f:
            f.write(task)
        git("add", where, cwd=work)
        git("commit", "-q", "-m", "task 9", cwd=work)
        p = git("push", "origin", "HEAD:rooms/old", cwd=work, check=False)
        assert p.returncode != 0 and refused_rule(p.stderr) == "layout", p.stderr
        assert f"it belongs at {model.task_path(9)}" in p.stderr
        git("reset", "-q", "--hard", "HEAD~", cwd=work)


def test_a_pushed_layout_move_is_judged_and_only_an_honest_one_passes(tmp_path, monkeypatch):
    """A push that brings the move itself is judged by the rules (the hook does not
    move the room first): a move that edits a file, drops a task or is made by an
    agent is refused by rule layout; an unchanged move of every file by hub/admin
    goes in."""
    path, kept = old_hub(str(tmp_path / "hub.git"), monkeypatch)
    work = str(tmp_path / "work")
    git("clone", "-q", "-b", "rooms/old", path, work)

    def forge(author, edit=None, drop=""):
        git("reset", "-q", "--hard", "origin/rooms/old", cwd=work)
        git("config", "user.name", author, cwd=work)
        git("config", "user.email", "x@example.org", cwd=work)
        paths = [model.agent_path(a, 1) for a in kept["agents"]] + \
                [model.task_path(t, 1) for t in kept["tasks"]]
        for old in paths:
            kind, key = model.kind_of(old)
            new = model.placed(kind, key)
            os.makedirs(os.path.join(work, os.path.dirname(new)), exist_ok=True)
            git("mv", old, new, cwd=work)
            if old == drop:
                git("rm", "-q", "-f", new, cwd=work)
        if edit:
            with open(os.path.join(work, model.agent_path(edit)), "a") as f:
                f.write('status = "forged"\n')
        with open(os.path.join(work, model.ROOM_FILE), "a") as f:
            f.write(f"layout = {model.LAYOUT}\n")
        git("add", "-A", cwd=work)
        git("commit", "-q", "-m", f"move\n\nGitdrop-Op: {layout.OP}", cwd=work)
        return git("push", "origin", "HEAD:rooms/old", cwd=work, check=False)

    for args, says in (((layout.MOVER, "core/kai"), "is not an unchanged move"),
                       ((layout.MOVER, None, model.task_path(kept["t2"], 1)), "is deleted"),
                       (("core/juno",), "may not move a room's files")):
        p = forge(*args)
        assert p.returncode != 0 and refused_rule(p.stderr) == "layout", p.stderr
        assert says in p.stderr and "fix:" in p.stderr, p.stderr
        assert not moves(path)   # the room is untouched
    p = forge(layout.MOVER)
    assert p.returncode == 0, p.stderr
    assert_moved(path, kept)


def test_three_processes_using_an_old_room_at_once_move_it_once(tmp_path, monkeypatch):
    path, kept = old_hub(str(tmp_path / "hub.git"), monkeypatch)
    code = "import sys; from gitdrop.hub import Hub; Hub(sys.argv[1]).room('old')"
    procs = [subprocess.Popen([sys.executable, "-c", code, path], cwd=ROOT,
                              stderr=subprocess.PIPE) for _ in range(3)]
    for p in procs:
        assert p.wait(60) == 0, p.stderr.read().decode()
    assert_moved(path, kept)


def test_the_bucket_is_the_documented_shell_one_liner():
    doc = open(os.path.join(ROOT, "docs", "PROTOCOL.md")).read()
    assert f"# {model.bucket('spartan')}: {model.agent_path('core/spartan')}" in doc
    assert f"# {model.bucket(42)}: {model.task_path(42)}" in doc
    for name in ("spartan", "42", "a-b.c_9", "x" * 40):
        p = subprocess.run(["bash", "-c", f"printf %s {name} | sha1sum | cut -c1-2"],
                           capture_output=True, text=True, check=True)
        assert p.stdout.strip() == model.bucket(name)
    # a path in the wrong bucket is no path gitdrop knows, and the rules name the right one
    wrong = "agents/core/00/spartan.toml"
    assert model.kind_of(wrong) == ("", "") and model.misplaced(wrong) == model.agent_path(
        "core/spartan")


def test_a_client_through_a_url_writes_to_an_old_room_as_the_hub_moves_it(tmp_path, monkeypatch):
    """The hub's hook moves an old room when a push arrives and refuses that push;
    a gitdrop client through a URL builds its write again on the moved room, so
    its caller sees no refusal."""
    from gitdrop.transports.remote import RemoteHub
    path, kept = old_hub(str(tmp_path / "hub.git"), monkeypatch)
    port = free_port()
    daemon = subprocess.Popen(["git", "daemon", "--reuseaddr", "--listen=127.0.0.1",
                               f"--port={port}", f"--base-path={tmp_path}", "--export-all",
                               "--enable=receive-pack", str(tmp_path)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, daemon, "git daemon")
        client = RemoteHub(f"git://127.0.0.1:{port}/hub.git", cache=str(tmp_path / "cache"),
                           fresh=0.0)
        sent = client.room("old").send("core/kai", "core/juno", "on it")
    finally:
        daemon.terminate()
        daemon.wait(10)
    assert len(moves(path)) == 1
    got = hubmod.Hub(path).room("old").inbox("core/juno", peek=True, limit=0)["messages"]
    assert [m["text"] for m in got if m["op"] == "send"][-1] == "on it"
    assert hubmod.Hub(path).store.room_tip("old") == sent["commit"]


def test_a_client_through_a_url_never_moves_a_room_itself(tmp_path, monkeypatch):
    """The move is a hub/admin commit: made on the hub's machine, never pushed by a
    client that opened the room through a URL (only reads here, so nothing moves)."""
    from gitdrop.transports.remote import RemoteHub
    path, kept = old_hub(str(tmp_path / "hub.git"), monkeypatch)
    client = RemoteHub("file://" + path, cache=str(tmp_path / "cache"), fresh=0.0)
    client.room("old").inbox("core/kai", peek=True)
    assert moves(path) == []


def _hook(path) -> str:
    with open(os.path.join(path, "hooks", "pre-receive")) as f:
        return f.read()


def _hook_of_another_install(path, where: str) -> str:
    """The hub's hook as an install at `where` wrote it (gitdrop installed anew
    elsewhere since); returns this install's."""
    mine = _hook(path)
    line = next(ln for ln in mine.splitlines() if ln.startswith("sys.path.insert"))
    with open(os.path.join(path, "hooks", "pre-receive"), "w") as f:
        f.write(mine.replace(line, f'sys.path.insert(0, "{where}")'))
    return mine


def test_an_old_install_s_hook_is_replaced_when_a_room_moves_to_a_layout_it_cannot_read(
        tmp_path, monkeypatch):
    """An upgrade into a new place left the old install's hook in the hub: once the new
    gitdrop moved a room to layout 2, the old hook refused every push to it ("unknown
    field 'layout'"), and gitdrop repair said the hub was healthy."""
    path, kept = old_hub(str(tmp_path / "hub.git"), monkeypatch)
    other = tmp_path / "old-install"
    other.mkdir()
    mine = _hook_of_another_install(path, str(other))
    env = dict(os.environ, GITDROP_HUB=path, GITDROP_ROOM="old", GITDROP_AGENT="core/kai")
    p = subprocess.run([sys.executable, "-m", "gitdrop", "repair", "--json"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60)
    assert json.loads(p.stdout)["hooks_elsewhere"] == ["pre-receive"], p.stdout
    assert _hook(path) != mine   # repair without --apply changes nothing
    p = subprocess.run([sys.executable, "-m", "gitdrop", "task", "show", kept["t1"]], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and len(moves(path)) == 1, p.stderr
    assert _hook(path) == mine
    _hook_of_another_install(path, str(other))
    p = subprocess.run([sys.executable, "-m", "gitdrop", "repair", "--apply", "--json"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    got = json.loads(p.stdout)
    assert (got["hooks_replaced"], got["hooks_elsewhere"]) == (["pre-receive"], []), got
    assert _hook(path) == mine


def test_a_hook_whose_gitdrop_is_gone_is_put_back_when_the_hub_is_opened(tmp_path):
    """A hook whose install was removed (a venv made anew) refused every push."""
    hub = hubmod.init(str(tmp_path / "hub.git"))
    mine = _hook_of_another_install(hub.path, str(tmp_path / "removed"))
    hubmod.Hub(hub.path)
    assert _hook(hub.path) == mine
