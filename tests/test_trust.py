"""Trust: hostile input, lies about names, roles and dates, and the places a hub may
be opened. Each finding is tried through the door where it was found (the command
line, MCP over stdio and HTTP, a raw git push); the inputs are in attacks.py.

After every refusal the room must be as it was (no commit, `git fsck` clean) and the
next ordinary command must work."""

import json
import os
import subprocess
import sys
import time

import pytest

from gitdrop import hub as hubmod
from gitdrop import fmt, model
from gitdrop.errors import NotFound, Refusal, UsageError

import attacks
from cli_helpers import Gitdrop
from conftest import git, refused_rule


@pytest.fixture
def gd(hub, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    return Gitdrop(hub.path, str(home), "core/juno")


def tips(hub):
    return git("for-each-ref", "--format=%(refname) %(objectname)", cwd=hub.path).stdout


def fsck(path):
    p = subprocess.run(["git", "--git-dir", str(path), "fsck", "--full", "--strict"],
                       capture_output=True, text=True)
    assert p.returncode == 0 and "error" not in p.stderr and "warning" not in p.stderr, \
        p.stderr


# --- names ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", attacks.BAD_NAMES)
def test_one_validator_refuses_every_bad_name(name):
    assert not model.is_name(name)
    for what, longest in (("room", 40), ("task", 80)):
        if len(name) == 41 and longest == 80:
            continue   # a task id may be longer than a name
        with pytest.raises(UsageError) as e:
            model.check_name(what, name, longest)
        assert e.value.reason.startswith(f"bad {what} name") and e.value.fix


def test_a_long_name_is_told_its_length():
    with pytest.raises(UsageError) as e:
        model.check_name("agent", "a" * 41)
    assert "41 characters; the most is 40" in e.value.reason


def test_long_made_up_names_are_refused_and_not_remembered(hub, team):
    """Names are checked and bucketed many times a write, so their answers are
    remembered; a caller's made-up names of any length must not be (an MCP server
    would keep every megabyte it was sent)."""
    before = tips(hub)
    for k in range(50):
        bogus = f"core/{k}" + "x" * 20000
        with pytest.raises((Refusal, NotFound, UsageError)):
            team.send("core/juno", bogus, "hello?")
    assert tips(hub) == before
    assert max(map(len, model._NAMES), default=0) <= 40
    assert max(map(len, model._BUCKETS), default=0) <= 80


@pytest.mark.parametrize("agent", attacks.BAD_AGENTS)
def test_cli_register_refuses_bad_agents_and_writes_nothing(gd, hub, agent):
    before = tips(hub)
    r = gd("register", agent, "--json")
    assert r.rc in (2, 3), r
    assert r.json["ok"] is False and r.json["fix"]
    assert tips(hub) == before
    gd.ok("register", "core/ok")          # the room still works
    fsck(hub.path)


@pytest.mark.parametrize("room", ["../hub", "../../archive/rooms/proj", "x.lock", "a..b",
                                  "evil\n"])
def test_cli_room_names_cannot_reach_other_refs(gd, hub, room):
    hub.room("lobby").register("core/juno")
    hub.create_room("hub/admin", "proj", open_=True)
    hub.archive_room("proj", "hub/admin")
    before = tips(hub)
    for args in (["--room", room, "who"], ["--room", room, "send", "all", "-m", "x"],
                 ["room", "create", room]):
        r = gd(*args, "--json")
        assert r.rc == 2 and r.json["rule"] == "usage" and "room name" in r.json["reason"], r
    assert tips(hub) == before


def test_push_to_a_bad_room_ref_is_refused(hub, clone):
    c = clone("core/juno")
    p = git("push", "origin", "HEAD:refs/heads/rooms/a/b", cwd=c.path, check=False)
    assert p.returncode != 0 and refused_rule(p.stderr) == "format", p.stderr


# --- trailers and text -----------------------------------------------------------------

@pytest.mark.parametrize("value", attacks.TRAILER_INJECTIONS)
def test_cli_trailer_values_cannot_inject(gd, hub, team, value):
    before = tips(hub)
    for args, env in ((["send", "spartan", "-m", "hi", "--reply-to", value], {}),
                      (["send", "spartan", "-m", "hi", "--task", value], {}),
                      (["send", "spartan", "-m", "hi"], {"GITDROP_KEY": value})):
        if "\x00" in value:   # argv and the environment cannot carry a NUL at all
            continue
        r = gd(*args, "--json", env=env)
        assert r.rc == 2 and r.json["rule"] == "usage", (args, r)
    assert tips(hub) == before
    gd.ok("send", "spartan", "-m", "still works")
    assert [m["text"] for m in team.inbox("core/spartan")["messages"]] == ["still works"]


@pytest.mark.parametrize("text", attacks.BAD_TEXTS)
def test_core_refuses_control_characters_in_messages(hub, team, text):
    before = tips(hub)
    with pytest.raises(Refusal) as e:
        team.send("core/juno", "core/spartan", text)
    assert e.value.rule == "format" and "control character" in e.value.reason
    with pytest.raises(Refusal):
        team.set_context("core/juno", "note", text)
    assert tips(hub) == before


@pytest.mark.parametrize("args", [a for a, _ in attacks.BAD_NUMBERS if a])
def test_cli_refuses_a_number_out_of_range_and_writes_nothing(gd, hub, team, args):
    team.create_task("core/juno", "held", assignee="core/juno")
    before = tips(hub)
    r = gd(*args, timeout=20)
    value = max(i for i, a in enumerate(args) if a.lstrip("-").isdigit())
    option = args[value - 1]
    assert r.rc == 2 and f"'{option}'" in r.err and "out of range" in r.err \
        and "Traceback" not in r.err, r
    assert tips(hub) == before
    assert gd("history", "-n", "1").rc == 0


@pytest.mark.parametrize("call", [c for _, c in attacks.BAD_NUMBERS if c])
def test_core_refuses_a_negative_count_or_time(hub, team, call):
    team.create_task("core/juno", "held", assignee="core/juno")
    before = tips(hub)
    with pytest.raises(UsageError) as e:
        call(team)
    assert "must be at least" in e.value.reason and e.value.fix, e.value
    assert tips(hub) == before


SWEEP = """
import contextlib, io, json, sys
import typer
from gitdrop.cli.main import app, main
values, skip = json.loads(sys.argv[1]), set(json.loads(sys.argv[2]))
top = typer.main.get_command(app)
ctx = typer.Context(top)


def leaves(group, path):
    out = []
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if hasattr(cmd, "list_commands"):
            out += leaves(cmd, path + [name])
        elif not set(path + [name]) & skip:
            out.append((path + [name], cmd))
    return out


FILL = {"to": "spartan", "name": "lobby", "task_id": "1", "agent": "spartan"}
OWN = ("--hub", "--room", "--as", "--json", "--help")


def tries():
    # Each hostile value in all the positional arguments, then in each option
    # that takes a value (the arguments filled with good ones).
    for path, cmd in leaves(top, []):
        positional = [p for p in cmd.params if p.param_type_name == "argument"]
        for v in values if positional else values[:1]:
            yield path + [v] * len(positional)
        good = path + [FILL.get(p.name, "1") for p in positional]
        for o in cmd.params:
            if o.param_type_name != "option" or getattr(o, "is_flag", False) or \
                    o.opts[0] in OWN:
                continue
            for v in values:
                yield good + ([f"{o.opts[0]}={v}"] if v.startswith("-") else [o.opts[0], v])


ONCE = {"work": ["--idle", "0", "--", "true"], "wait": ["--timeout", "0"]}
WHO = json.loads(sys.argv[3])   # a few values for every command


def as_anyone():
    # Each hostile value as who acts (--as) and where (--room), before each command
    # (the arguments filled with good ones; work and wait told not to wait).
    for path, cmd in leaves(top, []) + [(["work"], top.get_command(ctx, "work")),
                                        (["wait"], top.get_command(ctx, "wait"))]:
        if path[0] in ONCE:
            good = path + ONCE[path[0]]
        else:
            good = path + [FILL.get(p.name, "1") for p in cmd.params
                           if p.param_type_name == "argument"]
        for v in values:
            if v in WHO:
                yield ["--as", v] + good
                yield ["--room", v] + good


every = list(tries()) + list(as_anyone())
part, parts = map(int, sys.argv[4].split("/"))   # this run's share: a slice, in order
mine = every[part * len(every) // parts:(part + 1) * len(every) // parts]
runs, bad = 0, []
for argv in mine:
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
        except BaseException as e:   # main() lets nothing out but SystemExit
            code = repr(e)
    runs += 1
    if code not in (0, 2, 3, 4, 5, 124) or "Traceback" in err.getvalue():
        bad.append([argv, str(code), err.getvalue()[-400:]])
print(json.dumps({"runs": runs, "of": len(every), "mine": len(mine), "bad": bad}))
"""
SWEEP_PARTS = 4   # the sweep's argument lists, cut in this many runs that go in parallel


@pytest.mark.parametrize("part", range(SWEEP_PARTS))
def test_every_command_answers_hostile_arguments_without_a_traceback(gd, hub, team, tmp_path,
                                                                     part):
    """Each command, each hostile value in all its positional arguments and in each
    of its options: a clear refusal (exit 2 to 5) or an answer, never exit 1.
    Found this way: init of a name too long or not UTF-8, task show and task graph
    of an id not UTF-8, verify of a room name never checked (verify ../hub read the
    hub's branch), guard install and check with a --repo that is not there, and
    work acting as a name that is not UTF-8. The ~3,000 command lines are run in
    SWEEP_PARTS consecutive slices, one a test (each on a hub of its own), which
    together are every one of them: one run of them all took minutes on a busy machine."""
    # Commands that serve, wait or ask are not one-shot; destroy removes the hub.
    skip = ["serve", "web", "watch", "board", "work", "wait", "demo", "http", "mcp",
            "autorespond", "destroy", "ask"]
    work = tmp_path / "cwd"
    work.mkdir()
    who = ["", "../x", "a/b/c", "x" * 300, "\x01", "@", "\udcff"]
    p = subprocess.run([sys.executable, "-c", SWEEP, json.dumps(attacks.HOSTILE_ARGS),
                        json.dumps(skip), json.dumps(who), f"{part}/{SWEEP_PARTS}"],
                       capture_output=True, text=True, cwd=work,
                       env=dict(gd.env, GITDROP_AGENT="core/juno"), stdin=subprocess.DEVNULL,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.splitlines()[-1])
    assert got["of"] > 2500, got["of"]
    assert got["runs"] == got["mine"] >= got["of"] // SWEEP_PARTS, got
    assert not got["bad"], got["bad"][:5]


def test_cli_refuses_text_that_is_not_utf8(gd, hub, team, tmp_path):
    before = tips(hub)
    r = subprocess.run([*gd_entry(), "send", "spartan", "-m", os.fsdecode(attacks.BAD_UTF8),
                        "--json"], env=gd.env, capture_output=True, timeout=60)
    assert r.returncode in (2, 3), r
    assert b"Traceback" not in r.stderr and b"UTF-8" in r.stderr, r.stderr
    body = tmp_path / "body.bin"
    body.write_bytes(b"a task body " + attacks.BAD_UTF8)
    r = gd("task", "create", "from a file", "--body-file", str(body))
    assert r.rc == 3 and "Traceback" not in r.err and "UTF-8" in r.err, r   # was a traceback
    assert tips(hub) == before


def gd_entry():
    from cli_helpers import ENTRY
    return ENTRY


def push_message(c, message: bytes, headers: bytes = b""):
    """Push a commit whose message is `message`, byte for byte (written with
    hash-object: git commit would re-encode bytes that are not UTF-8), with any
    extra `headers` after the committer line."""
    c.pull()
    head = c.head()
    tree = git("rev-parse", "HEAD^{tree}", cwd=c.path).stdout.strip()
    who = f"core/juno <j@example.org> {int(time.time())} +0000".encode()
    raw = b"tree %s\nparent %s\nauthor %s\ncommitter %s\n%s\n" % (
        tree.encode(), head.encode(), who, who, headers) + message
    oid = subprocess.run(["git", "hash-object", "-t", "commit", "-w", "--stdin"], input=raw,
                         cwd=c.path, capture_output=True).stdout.decode().strip()
    p = git("push", "origin", f"{oid}:refs/heads/rooms/{c.room}", cwd=c.path, check=False)
    return p.returncode == 0, p.stderr


@pytest.mark.parametrize("message", [b"hi\x1b[2J there\n", attacks.BAD_UTF8 + b"\n",
                                     b"x" * (2 << 20) + b"\n",
                                     b"subject\n\n" + b"y" * (2 << 20) + b"\n"])
def test_push_refuses_bad_or_huge_messages(hub, team, clone, message):
    c = clone("core/juno")
    before = tips(hub)
    ok, err = push_message(c, message)
    assert not ok and refused_rule(err) in ("format", "size-limit"), err
    assert tips(hub) == before


def test_a_message_declaring_another_encoding_is_refused(hub, team, clone):
    """git log and pygit2 transcode a message from its `encoding` header; the hook
    and every reader take the bytes as UTF-8. Declared UTF-7, this message was
    accepted as one to core/kai and read back as one to all."""
    c = clone("core/juno")
    before = tips(hub)
    ok, err = push_message(c, attacks.UTF7_MESSAGE, b"encoding UTF-7\n")
    assert not ok and refused_rule(err) == "format" and "UTF-7" in err, err
    assert "i18n.commitEncoding" in err and tips(hub) == before
    ok, err = push_message(c, b"hi\n\nGitdrop-To: core/kai\n", b"encoding UTF-8\n")
    assert ok, err   # what it says is what it is
    from gitdrop import hubrules
    from gitdrop.view import CommitData
    c = CommitData("", None, [], "core/juno", "", 0, "team core\n")
    c.encoding = "UTF-7"
    with pytest.raises(Refusal) as e:
        hubrules.check(hub.store.reader, c, [])
    assert e.value.rule == "format" and "encoding" in e.value.reason


@pytest.mark.parametrize("trick", attacks.COMMIT_HEADER_TRICKS)
def test_a_commit_whose_headers_git_reads_otherwise_is_refused(hub, team, clone, trick):
    """git and pygit2 read the first tree, author and committer; the hook read the
    last. A message carrying a second tree (a room.toml making kai lead), author
    (juno's words from kai) or date was accepted, and read otherwise by all."""
    c = clone("core/kai")
    c.pull()
    empty = subprocess.run(["git", "hash-object", "-t", "tree", "-w", "--stdin"], input=b"",
                           cwd=c.path, capture_output=True).stdout.strip()
    now = int(time.time())
    extra = trick.replace(b"{tree}", empty).replace(b"{parent}", c.head().encode()) \
        .replace(b"{when}", str(now).encode()).replace(b"{later}", str(now + 10 ** 8).encode())
    before = tips(hub)
    ok, err = push_message(c, b"hi\n\nGitdrop-To: core/kai\n", extra)
    assert not ok and tips(hub) == before
    if trick.startswith(b"parent"):   # two parents: a merge, refused as such
        assert refused_rule(err) == "linear-history", err
    else:
        assert refused_rule(err) == "format" and "git commit" in err, err
    ok, err = push_message(c, b"hi\n\nGitdrop-To: core/kai\n", b"gpgsig -----BEGIN\n x\n")
    assert ok, err   # headers git writes after the committer are fine


@pytest.mark.parametrize("mode, what", attacks.MODE_TRICKS)
def test_a_file_turned_into_a_link_or_a_submodule_is_refused(hub, team, clone, mode, what):
    """The diff compared ids only: a note turned into a symbolic link to a path of the
    pusher's choosing (a write outside the checkout of whoever edits it next), or an
    agent file into a submodule (pygit2 no longer saw the agent), was no change."""
    c = clone("core/juno")
    c.write("context/notes.md", "/tmp/elsewhere\n")
    c.commit(fmt.format_message("notes", "", [("op", "context-set")]))
    assert c.push()[0]
    before = tips(hub)
    note = git("rev-parse", "HEAD:context/notes.md", cwd=c.path).stdout.strip()
    target = {"the same text": note, "the same text, as a link": note,
              "a commit that is not in the push": "1" * 40}.get(what, c.head())
    git("update-index", "--cacheinfo", f"{mode},{target},context/notes.md", cwd=c.path)
    git("commit", "-q", "-m", fmt.format_message("notes", "", [("op", "context-set")]),
        cwd=c.path)
    ok, err = c.push()
    assert not ok and tips(hub) == before
    if what == "a commit, not a blob":   # git's own check of the pack refuses it
        assert "is a commit, not a blob" in err, err
    else:
        assert refused_rule(err) == "format" and "context/notes.md" in err, err


def test_a_team_file_turned_into_a_submodule_is_refused(hub, tmp_path):
    """On the hub branch too: an outsider changed his own team file and turned
    core's into a submodule in one commit; the registry then had no team core, and
    the next to claim it became its lead."""
    work = str(tmp_path / "hubwork")
    git("clone", "-q", "-b", "hub", hub.path, work)
    git("config", "user.name", "evil/boss", cwd=work)
    git("config", "user.email", "b@example.org", cwd=work)
    hub.register_team("core", "core/juno")
    hub.register_team("evil", "evil/boss")
    git("pull", "-q", "origin", "hub", cwd=work)
    before = tips(hub)
    with open(os.path.join(work, "teams", "evil.toml"), "a") as f:
        f.write("# changed\n")
    git("add", "teams/evil.toml", cwd=work)
    same = git("rev-parse", "HEAD:teams/core.toml", cwd=work).stdout.strip()   # mode alone
    git("update-index", "--cacheinfo", f"160000,{same},teams/core.toml", cwd=work)
    git("commit", "-qm", "team evil changed", cwd=work)
    p = git("push", "origin", "HEAD:hub", cwd=work, check=False)
    assert p.returncode != 0 and refused_rule(p.stderr) in ("one-operation", "format"), p.stderr
    assert tips(hub) == before
    assert hub.team("core")["lead"] == "core/juno"


@pytest.mark.parametrize("body", attacks.BACKTRACKING_BODIES)
def test_a_brief_is_judged_in_time_linear_in_its_size(team, body):
    start = time.monotonic()
    with pytest.raises(Refusal) as e:
        team.create_task("core/juno", "a brief", body=body, brief=True)
    assert e.value.rule == "task-brief" and time.monotonic() - start < 5


def test_a_time_that_is_no_date_is_refused_and_one_already_there_is_shown(
        gd, hub, team, clone):
    """created = 2**63-1 in a pushed task was accepted, and then the board's task page
    was a 500 and its log page a reset connection (the C library cannot write it)."""
    from gitdrop import fmt, model
    from gitdrop.view import render_file
    c = clone("core/juno")
    path = model.task_path("t-far", team.view().layout)
    doc = {"id": "t-far", "title": "far", "state": "pending", "creator": "core/juno",
           "created": 2 ** 63 - 1}
    for created, ok in ((2 ** 63 - 1, False), (-1, False), (int(time.time()), True)):
        os.makedirs(os.path.join(c.path, os.path.dirname(path)), exist_ok=True)
        with open(os.path.join(c.path, path), "w") as f:
            f.write(render_file("task", dict(doc, created=created), "body\n"))
        git("add", "-A", cwd=c.path)
        git("commit", "-q", "-m", "far\n\nGitdrop-Op: task-create", cwd=c.path)
        pushed, err = c.push()
        assert pushed == ok, err
        if not ok:
            assert refused_rule(err) == "format" and "seconds since 1970" in err, err
            git("reset", "-q", "--hard", "@{u}", cwd=c.path)
    # One already in a room (written before the rule): every face shows it.
    def put(view, tip):
        return ({model.task_path("t-old", view.layout): render_file(
            "task", dict(doc, id="t-old"), "")}, "old\n\nGitdrop-Op: task-create\n", {})
    hub.store.write(hub.store.room_ref("lobby"), put, "core/juno", check=False)
    assert fmt.stamp(2 ** 63 - 1) == f"@{2 ** 63 - 1}"
    r = gd("task", "show", "t-old", "--json")
    assert r.rc == 0 and str(2 ** 63 - 1) in r.out, r
    assert gd("--as", "core/kai", "task", "claim", "t-old").rc == 0   # it still moves
    from test_web import Server
    s = Server(hub.path)
    try:
        with s.client() as web:
            for page in ("/r/lobby/t/t-old", "/r/lobby/log", "/r/lobby", "/r/lobby/charts",
                         "/r/lobby/charts/flow.svg", "/r/lobby/charts/activity.svg"):
                assert web.get(page).status_code == 200, page
    finally:
        s.stop()


@pytest.mark.parametrize("mode", ["100755", "120000"])
def test_push_refuses_links_and_executables(hub, team, clone, mode):
    c = clone("core/juno")
    blob = subprocess.run(["git", "hash-object", "-w", "--stdin"], input="notes\n",
                          cwd=c.path, capture_output=True, text=True).stdout.strip()
    git("update-index", "--add", "--cacheinfo", f"{mode},{blob},context/notes.md", cwd=c.path)
    git("commit", "-q", "-m", "notes", cwd=c.path)
    ok, err = c.push()
    assert not ok and refused_rule(err) == "format", err
    assert "plain files only" in err


def test_push_refuses_a_key_set_twice(hub, team, clone):
    c = clone("core/juno")
    c.write(model.task_path(9), '+++\nid = "9"\ntitle = "t"\nstate = "completed"\n'
            'state = "pending"\ncreator = "core/juno"\n+++\nbody\n').commit("task 9")
    ok, err = c.push()
    assert not ok and refused_rule(err) == "format", err


# --- power: roles, the hub's identity, rooms -------------------------------------------

@pytest.fixture
def proj(hub):
    """A closed room for teams core (lead juno) and web (lead ana)."""
    hub.register_team("core", "core/juno", ["spartan"])
    hub.register_team("web", "web/ana", ["mallory"])
    hub.create_room("hub/admin", "proj", teams=["core", "web"])
    r = hub.room("proj")
    for a in ("core/juno", "core/spartan", "web/ana", "web/mallory"):
        r.register(a)
    return r


def test_a_self_declared_lead_is_refused_by_the_cli(proj, hub, tmp_path):
    home = tmp_path / "h2"
    home.mkdir()
    gd = Gitdrop(hub.path, str(home), "web/mallory")
    doc = gd.refused(3, "lead-only", "--room", "proj", "register", "web/mallory",
                     "--role", "lead")
    assert "web/ana" in doc["reason"]


def test_a_lead_role_pushed_by_hand_grants_nothing(proj, hub, clone):
    t = proj.create_task("core/juno", "core work", assignee="core/spartan")["id"]
    proj.declare_contract("core/spartan", "api.core", "GET /core")
    c = clone("web/mallory", room="proj")
    text = c.read(model.agent_path("web/mallory")).replace('roles = []', 'roles = ["lead"]')
    c.write(model.agent_path("web/mallory"), text).commit("mallory is a lead now")
    assert c.push()[0]                       # a label: it may say so...
    assert not proj.view().is_lead("web/mallory")
    with pytest.raises(Refusal) as e:        # ...and it grants nothing
        proj.move_task("web/mallory", t, "cancel", note="mine now")
    assert e.value.rule == "task-state-machine"
    with pytest.raises(Refusal) as e:
        proj.declare_contract("web/mallory", "api.core", "GET /mallory")
    assert e.value.rule == "contract-owner"
    with pytest.raises(Refusal) as e:
        proj.deregister("web/mallory", "core/juno")
    assert e.value.rule == "lead-only"
    with pytest.raises(Refusal) as e:
        proj.update_room("web/mallory", "room-settings", "cap", settings={"loop_cap": 0})
    assert e.value.rule == "lead-only"


def test_nobody_registers_as_the_hub(hub, lobby):
    for who in ("hub/admin", "hub/reaper"):
        with pytest.raises(Refusal) as e:
            lobby.register(who)
        assert e.value.rule == "reserved-name"
    with pytest.raises(Refusal) as e:
        lobby.register("default/boss", ["lead"])
    assert e.value.rule == "reserved-name"


def test_first_lead_of_a_team_creates_it_the_next_is_refused(hub, lobby):
    lobby.register("core/juno", ["lead"])
    assert hub.team("core")["lead"] == "core/juno"
    assert lobby.view().room["leads"] == {"core": "core/juno"}
    assert lobby.view().is_lead("core/juno")
    with pytest.raises(Refusal) as e:
        lobby.register("core/mallory", ["lead"])
    assert e.value.rule == "lead-only" and "core/juno" in e.value.reason
    assert not lobby.view().agent("core/mallory")


def test_rooms_are_created_by_a_lead_of_their_teams_or_the_operator(hub, lobby):
    hub.register_team("core", "core/juno")
    with pytest.raises(Refusal) as e:
        hub.create_room("core/spartan", "side", teams=["core"])
    assert e.value.rule == "lead-only"
    with pytest.raises(Refusal) as e:
        hub.create_room("web/eve", "nobodys")
    assert e.value.rule == "lead-only"
    assert hub.create_room("core/juno", "side", teams=["core"])["leads"] == {"core": "core/juno"}
    assert hub.create_room("hub/admin", "ops")["open"] is True


def _root_room_commit(tmp_path, room, author, leads, teams):
    """A clone with one root commit creating `room`, written by hand."""
    path = tmp_path / f"new-{room}"
    git("init", "-q", str(path))
    git("config", "user.name", author, cwd=path)
    git("config", "user.email", "x@example.org", cwd=path)
    leads_toml = "".join(f'{t} = "{lead}"\n' for t, lead in leads.items())
    (path / "room.toml").write_text(
        f'name = "{room}"\ncreated = {int(time.time())}\nopen = false\n'
        f'teams = [{", ".join(chr(34) + t + chr(34) for t in teams)}]\n'
        f'pinned = false\nlayout = {model.LAYOUT}\n\n[leads]\n{leads_toml}')
    git("add", "-A", cwd=path)
    git("commit", "-q", "-m", f"room {room}\n\nGitdrop-Op: room-create", cwd=path)
    return path


def test_a_pushed_room_with_made_up_leads_is_refused(hub, tmp_path):
    hub.register_team("core", "core/juno")
    path = _root_room_commit(tmp_path, "forged", "hub/admin", {"core": "core/mallory"},
                             ["core"])
    p = git("push", hub.path, "HEAD:refs/heads/rooms/forged", cwd=path, check=False)
    assert p.returncode != 0 and refused_rule(p.stderr) == "lead-only", p.stderr
    assert "registry" in p.stderr
    assert not hub.store.tip("refs/heads/rooms/forged")
    path = _root_room_commit(tmp_path, "fine", "core/juno", {"core": "core/juno"}, ["core"])
    assert git("push", hub.path, "HEAD:refs/heads/rooms/fine", cwd=path, check=False
               ).returncode == 0


def test_a_name_that_differs_from_another_in_case_alone_is_refused(gd, hub, team, clone,
                                                                   tmp_path):
    """On macOS or Windows, Lobby and lobby are one ref file, and agents/core/Juno.toml
    and juno.toml one file of a checkout: each door refuses the second name."""
    hub.register_team("core", "core/juno")
    before = tips(hub)
    with pytest.raises(Refusal) as e:   # a room, by the hub
        hub.create_room("hub/admin", "LOBBY")
    assert e.value.rule == "format" and "'lobby'" in e.value.reason and e.value.fix
    path = _root_room_commit(tmp_path, "Lobby", "core/juno", {"core": "core/juno"}, ["core"])
    p = git("push", hub.path, "HEAD:refs/heads/rooms/Lobby", cwd=path, check=False)
    assert p.returncode != 0 and refused_rule(p.stderr) == "format", p.stderr   # by a push
    assert "only in case" in p.stderr
    with pytest.raises(Refusal) as e:   # a team, on the hub branch
        hub.register_team("Core", "Core/boss")
    assert e.value.rule == "format" and "'core'" in e.value.reason
    r = gd("register", "core/Kai")   # an agent, from the command line
    assert r.rc == 3 and "only in case" in r.err and "core/kai," in r.err, r
    c = clone("core/juno")   # a context key, by a push
    os.makedirs(os.path.join(c.path, "context"), exist_ok=True)
    for name, ok in (("notes.md", True), ("NOTES.md", False)):
        with open(os.path.join(c.path, "context", name), "w") as f:
            f.write("what we agreed\n")
        git("add", "-A", cwd=c.path)
        git("commit", "-q", "-m", "notes\n\nGitdrop-Op: context-set", cwd=c.path)
        pushed, err = c.push()
        assert pushed == ok, err
    assert refused_rule(err) == "format" and "context/notes.md" in err, err
    assert [t for t in tips(hub).splitlines() if "Lobby" in t or "LOBBY" in t] == []
    assert "refs/heads/hub" in before


def test_a_pushed_room_by_someone_else_than_the_pusher_is_refused(hub, tmp_path):
    """Over an authenticated transport the room-create commit is no exception."""
    hub.register_team("core", "core/juno")
    path = _root_room_commit(tmp_path, "sneaky", "core/juno", {"core": "core/juno"},
                             ["core"])
    env = dict(os.environ, GITDROP_PUSHER="web/eve")
    p = subprocess.run(["git", "push", hub.path, "HEAD:refs/heads/rooms/sneaky"], cwd=path,
                       env=env, capture_output=True, text=True)
    assert p.returncode != 0 and refused_rule(p.stderr) == "authenticated-pusher", p.stderr


# --- time: dates are the pusher's word -------------------------------------------------

def test_back_dated_messages_do_not_slip_past_the_loop_guard(hub, team, clone):
    team.update_room("hub/admin", "room-settings", "cap",
                     settings={"loop_cap": 5, "loop_window": 60})
    c = clone("core/spartan")
    team.inbox("core/spartan")
    c.pull()
    start = int(time.time()) - 3000
    for i in range(50):                      # 61 s apart, as if sent over 50 minutes
        date = f"{start + 61 * i} +0000"
        git("commit", "-q", "--allow-empty", "-m", f"msg {i}", cwd=c.path,
            env={"GIT_COMMITTER_DATE": date, "GIT_AUTHOR_DATE": date})
    ok, err = c.push()
    assert not ok and refused_rule(err) == "clock", err
    # dated now, the same burst meets the loop guard within one push
    git("reset", "-q", "--hard", "origin/rooms/lobby", cwd=c.path)
    for i in range(6):
        c.commit(f"burst {i}", allow_empty=True)
    ok, err = c.push()
    assert not ok and refused_rule(err) == "loop-guard", err
    git("reset", "-q", "--hard", "origin/rooms/lobby", cwd=c.path)
    for i in range(5):
        c.commit(f"burst {i}", allow_empty=True)
    assert c.push()[0]


def test_a_back_dated_push_cannot_make_a_busy_room_look_idle(hub, team, clone):
    hub.store.repo.config["gitdrop.idleArchiveDays"] = "1"
    c = clone("core/juno")
    date = f"{int(time.time()) - 3 * 86400} +0000"
    git("commit", "-q", "--allow-empty", "-m", "old news", cwd=c.path,
        env={"GIT_COMMITTER_DATE": date})
    ok, err = c.push()
    assert not ok and refused_rule(err) == "clock" and "in the past" in err, err
    assert hub.reap()["archived"] == []


# --- idempotency keys ---------------------------------------------------------------------

def test_a_key_names_one_operation_with_one_payload(gd, hub, team):
    key = {"GITDROP_KEY": "k1"}
    first = gd.js("send", "spartan", "-m", "one", env=key)
    again = gd.js("send", "spartan", "-m", "one", env=key)
    assert again["commit"] == first["commit"]          # the same call replays
    doc = gd.refused(3, "idempotency-key", "send", "spartan", "-m", "two", env=key)
    assert first["commit"][:12] in doc["commit"]
    assert [m["text"] for m in team.inbox("core/spartan")["messages"]] == ["one"]
    created = gd.ok("task", "create", "t1", env={"GITDROP_KEY": "k2"}).out.strip()
    assert gd.ok("task", "create", "t1", env={"GITDROP_KEY": "k2"}).out.strip() == created
    gd.refused(3, "idempotency-key", "task", "create", "t2", env={"GITDROP_KEY": "k2"})
    gd.refused(3, "idempotency-key", "task", "cancel", created, "--reason", "x",
               env={"GITDROP_KEY": "k2"})
    gd.ok("task", "cancel", created, "--reason", "x", env={"GITDROP_KEY": "k3"})
    gd.ok("task", "cancel", created, "--reason", "x", env={"GITDROP_KEY": "k3"})
    assert team.task(created)["state"] == "cancelled"


# --- where a hub may be opened ---------------------------------------------------------------

def test_a_path_that_is_not_a_hub_is_not_written(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    folder = tmp_path / "etc"
    folder.mkdir()
    (folder / "passwd").write_text("root:x:0:0\n")
    project = tmp_path / "project"
    git("init", "-q", str(project))
    for target in (folder, project, project / ".git", tmp_path / "typo.git"):
        before = sorted(os.listdir(target)) if target.exists() else None
        gd = Gitdrop(str(target), str(home), "core/juno")
        doc = gd.refused(4, "not-found", "who")
        assert "no such hub" in doc["reason"] and "gitdrop init" in doc["fix"]
        assert (sorted(os.listdir(target)) if target.exists() else None) == before
    r = Gitdrop(str(folder), str(home))("init", str(folder), "--json")
    assert r.rc == 2 and sorted(os.listdir(folder)) == ["passwd"], r
    # a hub path init would refuse (not UTF-8) is not what the fix tells to run
    doc = hubmod.no_hub(os.fsdecode(os.fsencode(str(tmp_path)) + b"/\xff.git")).fix
    assert "gitdrop init PATH" in doc and "\udcff" not in doc, doc
    with pytest.raises(NotFound):
        hubmod.Hub(str(folder))
    # the built-in default is made on first use, and init makes one anywhere new
    gd = Gitdrop("", str(home), "core/juno")
    gd.env.pop("GITDROP_HUB")
    r = gd.ok("register", "core/juno")
    assert (home / ".gitdrop" / "hub.git" / "HEAD").exists()
    assert "made the default hub at" in r.err, r   # said, the once
    assert "made the default hub" not in gd.ok("who").err
    Gitdrop(str(tmp_path / "new.git"), str(home)).ok("init")
    fsck(tmp_path / "new.git")


# --- what gitdrop accepts, git and TOML accept and read the same --------------------------

from hypothesis import given, settings, strategies as st   # noqa: E402

NAME_ALPHABET = st.sampled_from(list("aZ09_.-/\n @{}~^:?*[\\") + [".lock", "..", "@{"])


@settings(max_examples=150, deadline=None)
@given(st.lists(NAME_ALPHABET, min_size=1, max_size=12).map("".join))
def test_every_name_gitdrop_accepts_is_a_ref_git_accepts(name):
    if not model.is_name(name):
        return
    p = subprocess.run(["git", "check-ref-format", f"refs/heads/rooms/{name}"])
    assert p.returncode == 0, name


def test_every_file_a_busy_room_holds_reads_the_same_in_tomllib(hub, tmp_path):
    """A room that used every kind of file, then every blob of the hub's history
    (rooms, the hub branch) through tomllib: the same header, field for field."""
    import tomllib
    from gitdrop import fmt
    lobby = hub.room("lobby")
    lobby.register("core/juno", ["lead"], description='says "hi" \\ and \t tabs')
    lobby.register("core/spartan", ["coder", "ünïcode"])
    hub.register_team("web", "web/ana", ["web/bo"])
    hub.create_room("core/juno", "proj", teams=["core", "web"],
                    settings={"loop_cap": 9, "clock_skew": 20})
    proj = hub.room("proj")
    proj.register("core/juno")
    proj.register("web/ana")
    t = lobby.create_task("core/juno", 'Title with "quotes" and \\ back', body="+++ not a header\n",
                          assignee="core/spartan", tags=["a b", "é"], priority=-3)["id"]
    lobby.move_task("core/spartan", t, "start")
    lobby.move_task("core/spartan", t, "ask", question="line one\nline two")
    lobby.start_handshake("core/juno", "plan:\n- one\n- two", targets=["core/spartan"])
    lobby.declare_contract("core/spartan", "api.users", "GET /users\n\t-> [{id}]",
                           kind="api_endpoint")
    lobby.set_context("core/juno", "notes", "= not toml =\n[nor this]")
    lobby.set_status("core/spartan", "busy \u2028 with a separator")
    blobs = git("rev-list", "--objects", "--all", cwd=hub.path).stdout.split("\n")
    checked = 0
    for line in blobs:
        oid, _, path = line.partition(" ")
        if not path.endswith((".toml", ".md")) or path.startswith("context/") or \
                path.rsplit("/", 1)[-1] == "context":
            continue
        text = git("cat-file", "-p", oid, cwd=hub.path).stdout
        if path.endswith(".toml"):
            mine = fmt.loads_toml(text)
            header = text
        else:
            mine = fmt.loads_doc(text)[0]
            header = text[4:text.index("\n+++", 3)]
        assert tomllib.loads(header) == mine, (path, text)
        checked += 1
    assert checked >= 12


def test_the_hub_branch_has_bounds_too(hub, tmp_path):
    hub.register_team("core", "core/juno")
    path = tmp_path / "hubclone"
    git("clone", "-q", "-b", "hub", hub.path, str(path))
    git("config", "user.name", "web/ana", cwd=path)
    git("config", "user.email", "ana@example.org", cwd=path)
    os.makedirs(path / "teams", exist_ok=True)
    (path / "teams" / "web.toml").write_text('name = "web"\nlead = "web/ana"\n'
                                             'members = ["web/ana"]\ncreated = 1\n')
    git("add", "-A", cwd=path)
    subprocess.run(["git", "commit", "-q", "-F", "-"], cwd=path, check=True,
                   input="team web\n\n" + "x" * 100000, text=True)
    p = git("push", "origin", "HEAD:hub", cwd=path, check=False)
    assert p.returncode != 0 and refused_rule(p.stderr) == "format", p.stderr
    git("commit", "-q", "--amend", "-m", "team web", cwd=path)
    assert git("push", "origin", "HEAD:hub", cwd=path, check=False).returncode == 0
    assert hub.team("web")["lead"] == "web/ana"


def _make_room(path, name, go, out):
    h = hubmod.Hub(path)
    go.wait()
    try:
        h.create_room("hub/admin", name, open_=True)
        out.put(name)
    except Refusal as e:
        out.put(f"refused {e.rule}")


def test_two_rooms_made_at_once_cannot_be_case_twins(hub):
    """`Lobby` and `lobby` made in the same instant each passed the other's check:
    a room is checked and made inside one turn for the whole hub."""
    import multiprocessing as mp
    ctx = mp.get_context("fork")
    for k in range(12):
        go, out = ctx.Event(), ctx.Queue()
        ps = [ctx.Process(target=_make_room, args=(hub.path, name, go, out))
              for name in (f"Twin{k}", f"twin{k}", f"TWIN{k}")]
        for p in ps:
            p.start()
        go.set()
        got = sorted(out.get(timeout=60) for _ in ps)
        for p in ps:
            p.join(30)
        made = [g for g in got if not g.startswith("refused")]
        assert len(made) == 1 and got.count("refused format") == 2, got
        assert [r for r in hub.store.rooms(model.ROOM_PREFIX) if r.lower() == f"twin{k}"] == made


def test_text_that_would_draw_over_a_listing_is_shown_escaped(hub, team, gd):
    """A message could draw a line that looks like another message from the lead
    (a carriage return), or show its text in another order (a direction mark):
    listings show those characters as escapes; --json keeps the text as sent; a
    task title, listed one per line, may not break the line at all."""
    for text in attacks.TERMINAL_FORGERIES:
        team.send("core/kai", "core/juno", text)
    out = gd.ok("inbox", "--peek").out
    assert not set("\r\x9b\x85\u202e\u202c") & set(out), repr(out)
    assert "\\r" in out and "\\x9b" in out and "\\u202e" in out
    assert "\n    \\rjuno → you" in out   # still inside kai's message, marked
    got = [m["text"] for m in gd.js("inbox", "--peek")["messages"]]
    assert got == attacks.TERMINAL_FORGERIES
    history = gd.ok("history").out
    assert "\r" not in history and "\\u202e" in history
    for title in ("one\ntwo", "one\rtwo", "one\u2028two"):
        doc = gd.refused(3, "format", "task", "create", title)
        assert "one line" in doc["reason"] and "body" in doc["fix"]
    t = team.create_task("core/juno", "pay \u202e0001\u202c dollars")
    assert "\\u202e" in gd.ok("task", "show", str(t["id"])).out
    assert "\\u202e" in gd.ok("task", "list").out


def test_an_id_that_names_no_commit_is_not_read_as_one(hub):
    """pygit2's reader read a tree's id as a commit (AttributeError: a 500 on the
    board's commit page); both readers answer KeyError, as for an id not there."""
    from gitdrop.catfile import CatFile
    tree = hub.store.reader.commit(hub.store.room_tip("lobby")).tree
    cat = CatFile(hub.path)
    try:
        for reader in (hub.store.reader, cat):
            for oid in (tree, "0" * 40):
                with pytest.raises(KeyError):
                    reader.commit(oid)
    finally:
        cat.close()


# --- who runs a room: a lead may not take another team's place ---------------------

def test_a_retry_may_not_carry_the_leads_sign_offs(proj, hub, clone):
    """A cross-team task's creator (no lead) retried it, failed, with both leads'
    names in signoffs, and its assignee started it with no lead ever signing."""
    from test_rules_push import attempt
    t = proj.create_task("web/mallory", "cross-team work", assignee="core/spartan")["id"]
    with pytest.raises(Refusal) as e:
        proj.move_task("core/spartan", t, "start")
    assert e.value.rule == "dual-sign"
    proj.move_task("core/spartan", t, "fail", note="flaky")
    c = clone("web/mallory", room="proj")
    path = model.task_path(t)
    text = c.read(path)
    retried = text.replace('state = "failed"', 'state = "assigned"').replace(
        "retries = 0", "retries = 1").replace("signoffs = []", 'signoffs = ["core/juno", "web/ana"]')
    assert retried.count("core/juno") == 1 and 'state = "assigned"' in retried, retried
    c.write(path, retried).commit(fmt.format_message(
        f"retry {t}", "", [("op", "task-retry"), ("task", t)]))
    attempt(hub, c, "dual-sign")
    proj.move_task("web/mallory", t, "retry")   # as it should be: no sign-offs, so
    with pytest.raises(Refusal) as e:            # the start still waits for both leads
        proj.move_task("core/spartan", t, "start")
    assert e.value.rule == "dual-sign"


def test_a_lead_may_not_take_another_team_or_its_lead_out_of_a_room(proj, hub, clone,
                                                                     tmp_path):
    """Core's lead dropped web's lead from room.toml (web stayed a member), or web
    itself, in a push or with `room leave`; then reviewed web's work, signed its
    cross-team tasks alone and destroyed the room without web's lead."""
    from test_rules_push import attempt
    c = clone("core/juno", room="proj")
    text = c.read("room.toml")
    assert '\nweb = "web/ana"' in text
    c.write("room.toml", text.replace('\nweb = "web/ana"', "")).commit(
        fmt.format_message("room settings", "", [("op", "room-settings")]))
    attempt(hub, c, "lead-only")
    # the same through the command line: `room leave --team web` by core's lead
    home = tmp_path / "h-leave"
    home.mkdir()
    gd = Gitdrop(hub.path, str(home), "core/juno")
    doc = gd.refused(3, "lead-only", "room", "leave", "proj", "--team", "web")
    assert "web/ana" in doc["reason"]
    assert hub.room("proj").view().room["leads"] == {"core": "core/juno", "web": "web/ana"}
    # so destroying the room still waits for web's lead
    first = hub.destroy_room("proj", by="core/juno")
    assert first["destroyed"] is False and first["waiting_for"] == ["web/ana"], first
    # web's own lead takes web out, and the operator may
    assert hub.leave_room("web", "proj", by="web/ana")["room"] == "proj"
    hub.join_room("web", "proj", by="core/juno")
    hub.leave_room("web", "proj", by="hub/admin")
    assert "web" not in hub.room("proj").view().room["teams"]


def test_a_pushed_room_records_the_lead_of_each_of_its_teams(proj, hub, tmp_path):
    """A room pushed for core and web with core's lead alone: web had no say in it
    (its reviews and sign-offs fell to core's lead, and its consent to destroy)."""
    path = _root_room_commit(tmp_path, "half", "core/juno", {"core": "core/juno"},
                             ["core", "web"])
    p = git("push", hub.path, "HEAD:refs/heads/rooms/half", cwd=path, check=False)
    assert p.returncode != 0 and refused_rule(p.stderr) == "lead-only", p.stderr
    assert 'web = "web/ana"' in p.stderr
    assert not hub.store.tip("refs/heads/rooms/half")
    path = _root_room_commit(tmp_path, "whole", "core/juno",
                             {"core": "core/juno", "web": "web/ana"}, ["core", "web"])
    assert git("push", hub.path, "HEAD:refs/heads/rooms/whole", cwd=path,
               check=False).returncode == 0


@pytest.mark.parametrize("setting", ['"x"', "true", "-5", "1.5"])
def test_a_pushed_room_with_bad_settings_is_refused(hub, tmp_path, setting):
    """A room created with loop_cap = "x" was accepted, and every write after it was
    refused as damaged, with nothing able to mend it."""
    hub.register_team("core", "core/juno")
    path = _root_room_commit(tmp_path, "bad", "core/juno", {"core": "core/juno"}, ["core"])
    with open(path / "room.toml", "a") as f:
        f.write(f"\n[settings]\nloop_cap = {setting}\n")
    git("commit", "-q", "--amend", "-a", "--no-edit", cwd=path)
    p = git("push", hub.path, "HEAD:refs/heads/rooms/bad", cwd=path, check=False)
    assert p.returncode != 0 and refused_rule(p.stderr) == "format", p.stderr
    assert not hub.store.tip("refs/heads/rooms/bad")


def test_a_team_s_new_lead_takes_its_place_in_a_closed_room(proj, hub, tmp_path):
    """After a hand-over in the registry, the new lead's `room join` (the re-sync)
    was refused in a closed room, and the lead it replaced kept its powers there. (A
    hand-over now reaches the rooms itself; one that did not, a room it failed in,
    is taken over by the new lead's room join.)"""
    hub._hand_over = lambda *a: []   # as a hand-over that reached no room
    hub.register_team("web", "web/bob", by="web/ana")
    assert hub.team("web")["lead"] == "web/bob"
    # the registry's lead runs the room before its entry there is re-synced
    assert hub.room_settings("proj", by="web/bob", changes={"loop_cap": 1})["settings"][
        "loop_cap"] == 1
    home = tmp_path / "h-bob"
    home.mkdir()
    gd = Gitdrop(hub.path, str(home), "web/bob")
    gd.ok("room", "join", "proj", "--team", "web")
    view = hub.room("proj").view()
    assert view.room["leads"] == {"core": "core/juno", "web": "web/bob"}
    with pytest.raises(Refusal) as e:   # the replaced lead runs nothing there now
        hub.room_settings("proj", by="web/ana", changes={"loop_cap": 1})
    assert e.value.rule == "lead-only"


def test_in_an_open_room_a_lead_acts_for_its_own_team_only(hub, lobby, clone):
    """Any team's lead may join an open room: a stranger who made a team of its own
    and joined the lobby was a lead there like any other, and deregistered another
    team's agents, cancelled its tasks, took over its contracts and released its
    leases. Then it still acted for the agents of teams with no lead recorded there:
    in a lobby, nearly every team (a lead that registers without the lead role is
    recorded nowhere). Now, in an open room, a lead acts for its own team only."""
    from test_rules_push import attempt
    lobby.register("core/juno", ["lead"])
    lobby.register("core/spartan", ["coder"])
    lobby.register("solo/kim")                       # a team with no lead in the lobby
    lobby.register("evil/eve", ["lead"])             # a team of one's own: a lead at once
    assert lobby.view().room["leads"] == {"core": "core/juno", "evil": "evil/eve"}
    t = lobby.create_task("core/juno", "core's work", assignee="core/spartan")["id"]
    lobby.declare_contract("core/spartan", "api.users", "GET /users")
    lease = lobby.take_lease("core/spartan", "src/**")
    for call, rule in (
            (lambda: lobby.deregister("evil/eve", "core/spartan"), "lead-only"),
            (lambda: lobby.move_task("evil/eve", t, "cancel", note="mine now"),
             "task-state-machine"),
            (lambda: lobby.move_task("evil/eve", t, "edit", reviewer="evil/eve"),
             "task-state-machine"),
            (lambda: lobby.declare_contract("evil/eve", "api.users", "GET /eve"),
             "contract-owner"),
            (lambda: lobby.release_lease("evil/eve", lease["id"]), "lease-holder")):
        before = lobby.store.room_tip("lobby")
        with pytest.raises(Refusal) as e:
            call()
        assert e.value.rule == rule, (rule, e.value)
        assert lobby.store.room_tip("lobby") == before
    # and by a raw push of the deregistration
    c = clone("evil/eve")
    c.delete(model.agent_path("core/spartan")).commit(fmt.format_message(
        "eve deregisters spartan", "", [("op", "deregister")]))
    attempt(hub, c, "lead-only")
    # core's own lead still does all of it; nobody's lead does for a team with none
    lobby.move_task("core/juno", t, "edit", reviewer="core/juno")
    u = lobby.create_task("solo/kim", "kim's", assignee="solo/kim")["id"]
    for call in (lambda: lobby.move_task("evil/eve", u, "cancel", note="unled: mine?"),
                 lambda: lobby.deregister("evil/eve", "solo/kim"),
                 lambda: lobby.deregister("core/juno", "solo/kim")):
        with pytest.raises(Refusal) as e:
            call()
        assert e.value.rule in ("task-state-machine", "lead-only"), e.value
    assert lobby.view().agent("solo/kim") and lobby.task(u)["state"] == "assigned"
    # in a closed room every lead of the room acts for all: its leads let each team in
    hub.register_team("core", "core/juno", ["spartan"], by="core/juno")
    hub.create_room("hub/admin", "proj", teams=["core", "evil"])
    proj = hub.room("proj")
    for a in ("core/juno", "core/spartan", "evil/eve"):
        proj.register(a)
    v = proj.create_task("core/juno", "core's", assignee="core/spartan")["id"]
    assert proj.move_task("evil/eve", v, "cancel", note="a lead here")["state"] == "cancelled"


def test_a_stranger_s_lead_runs_nothing_of_an_open_room(hub, lobby, clone):
    """Registering as the lead of a team of one's own joins it to the open lobby, and
    made that stranger a lead of the room: it archived the lobby, or turned its loop
    guard off, for everyone. An open room's settings, pin, archive and restore are
    now the hub's operator's; a team's lead there adds and takes out its own team."""
    from test_rules_push import attempt
    lobby.register("core/juno", ["lead"])
    lobby.register("evil/eve", ["lead"])
    assert lobby.view().room["leads"] == {"core": "core/juno", "evil": "evil/eve"}
    for call in (lambda: hub.room_settings("lobby", "evil/eve", {"loop_cap": 0}),
                 lambda: hub.pin_room("lobby", "evil/eve"),
                 lambda: hub.archive_room("lobby", "evil/eve"),
                 lambda: hub.room_settings("lobby", "core/juno", {"loop_cap": 0})):
        before = lobby.store.room_tip("lobby")
        with pytest.raises(Refusal) as e:
            call()
        assert e.value.rule == "lead-only" and "operator" in e.value.reason + e.value.fix, \
            e.value
        assert lobby.store.room_tip("lobby") == before
    # nor by a raw push of room.toml
    c = clone("evil/eve")
    text = c.read(model.ROOM_FILE).replace("[settings]", "[settings]\nloop_cap = 0")
    c.write(model.ROOM_FILE, text).commit(fmt.format_message(
        "no more loop guard", "", [("op", "room-settings")]))
    err = attempt(hub, c, "lead-only")
    assert "open" in err and "operator" in err
    # an archived open room is restored by the operator alone too
    hub.archive_room("lobby", "hub/admin")
    with pytest.raises(Refusal) as e:
        hub.restore_room("lobby", "evil/eve")
    assert e.value.rule == "lead-only"
    hub.restore_room("lobby", "hub/admin")
    # the operator runs it; a team's lead takes its own team out
    assert hub.room_settings("lobby", "hub/admin", {"loop_cap": 7})["settings"]["loop_cap"] == 7
    assert hub.leave_room("evil", "lobby", by="evil/eve")["left"]
    assert lobby.view().room["leads"] == {"core": "core/juno"}
    with pytest.raises(Refusal) as e:   # and no other
        hub.leave_room("core", "lobby", by="evil/eve")
    # a closed room's leads still run it
    hub.create_room("hub/admin", "proj", teams=["core"])
    assert hub.room_settings("proj", "core/juno", {"loop_cap": 3})["settings"]["loop_cap"] == 3
    assert hub.archive_room("proj", "core/juno")["archived"]


def test_one_lead_neither_opens_a_closed_room_nor_lets_a_stale_consent_destroy_one(
        hub, lobby, clone, tmp_path):
    """One lead of a closed two-team room opened it by a push of `open = true`: the
    other team's lead lost the room, and any team could join. And the operator's
    consent to destroy an open room, given while juno was its lead, counted after
    juno took core out: a stranger's new team joined and destroyed it in one call."""
    hub.register_team("core", "core/juno")
    hub.register_team("web", "web/ana")
    hub.create_room("hub/admin", "proj", teams=["core", "web"])
    proj = hub.room("proj")
    proj.register("core/juno")
    c = clone("core/juno", room="proj")
    c.write(model.ROOM_FILE, c.read(model.ROOM_FILE).replace("open = false", "open = true"))
    c.commit(fmt.format_message("open it", "", [("op", "room-settings")]))
    ok, err = c.push()
    assert not ok and refused_rule(err) == "lead-only" and "operator" in err, err
    with pytest.raises(Refusal) as e:
        proj.update_room("web/ana", "room-settings", "open", open=True)
    assert e.value.rule == "lead-only"
    assert proj.view().room["open"] is False
    # consents to destroy count while the leads they were given among stay
    hub.create_room("hub/admin", "plaza", open_=True)
    plaza = hub.room("plaza")
    plaza.register("core/juno", ["lead"])
    assert hub.destroy_room("plaza", "hub/admin")["waiting_for"] == ["core/juno"]
    hub.leave_room("core", "plaza", by="core/juno")
    plaza.register("evil/eve", ["lead"])
    r = hub.destroy_room("plaza", "evil/eve")
    assert not r["destroyed"] and r["waiting_for"] == ["hub/admin"], r
    # and from the command line: a recorded lead's consent, then the operator's
    gd = Gitdrop(hub.path, str(tmp_path / "home"), "evil/eve")
    got = gd.js("room", "destroy", "plaza", "--yes", input="plaza\n")
    assert got["destroyed"] is False and got["waiting_for"] == ["hub/admin"], got
    got = gd.js("--as", "hub/admin", "room", "destroy", "plaza", "--yes", input="plaza\n")
    assert got["destroyed"] is True, got


def test_refusals_about_teams_say_what_will_work(hub, lobby, clone, tmp_path):
    """A member that is no lead was told to register first, then refused again; the
    lead taken out of its team was answered with the team unchanged; a registration
    refused in a closed room had made its team; Hub/admin looked like the operator;
    a room imported whole brought agents its teams' leads never named."""
    hub.register_team("core", "core/juno", ["kai"])
    hub.create_room("hub/admin", "proj", teams=["core"])
    proj = hub.room("proj")
    proj.register("core/juno")
    with pytest.raises(Refusal) as e:   # not registered here, and no lead: lead-only
        proj.update_room("core/kai", "room-settings", "cap", settings={"loop_cap": 1})
    assert e.value.rule == "lead-only" and "core/juno" in e.value.fix, e.value
    with pytest.raises(UsageError) as e:
        hub.register_team("core", "core/juno", by="core/juno", remove=["juno"])
    assert "hand the lead over" in e.value.fix
    with pytest.raises(Refusal) as e:
        proj.register("ops/x", ["lead"])
    assert e.value.rule == "room-membership" and hub.team("ops", missing_ok=True) is None
    for agent in ("Hub/admin", "HUB/reaper", "Default/bob"):
        with pytest.raises(Refusal) as e:
            lobby.register(agent)
        assert e.value.rule == "reserved-name", (agent, e.value)
    with pytest.raises(Refusal) as e:
        hub.register_team("Default", "Default/admin")
    assert e.value.rule == "reserved-name"
    # a room brought whole from another hub: its closed room's agents are members here
    other = hubmod.init(str(tmp_path / "other.git"))
    other.register_team("core", "core/juno", ["kai", "mallory"])
    other.create_room("hub/admin", "dev", teams=["core"])
    other.room("dev").register("core/mallory")
    gd = Gitdrop(other.path, str(tmp_path / "home"))
    gd.ok("room", "export", "dev", str(tmp_path / "dev.bundle"))
    gd = Gitdrop(hub.path, str(tmp_path / "home"))
    r = gd.refused(3, "room-membership", "room", "import", str(tmp_path / "dev.bundle"))
    assert "gitdrop team add core mallory --as core/juno" in r["fix"] and \
        "import it again" in r["fix"]
    assert not hub.store.tip("refs/heads/rooms/dev")
    hub.register_team("core", "core/juno", ["mallory"], by="core/juno")
    gd.ok("room", "import", str(tmp_path / "dev.bundle"))
    assert hub.room("dev").view().agent("core/mallory")


def test_a_lead_handed_over_in_the_registry_is_handed_over_in_its_rooms(hub, lobby):
    """After a hand-over in the registry the lead it replaced kept its powers in every
    room until somebody ran room join in each; and a change that changed nothing was
    taken from anyone recorded as a lead (an open room's pin, said done)."""
    hub.register_team("core", "core/juno", ["kai"])
    hub.register_team("web", "web/ana")
    hub.create_room("hub/admin", "proj", teams=["core", "web"])
    lobby.register("core/juno", ["lead"])
    got = hub.register_team("core", "core/kai", by="core/juno")
    assert sorted(got["handed_over_in"]) == ["lobby", "proj"], got
    assert hub.room("proj").view().room["leads"] == {"core": "core/kai", "web": "web/ana"}
    assert lobby.view().room["leads"] == {"core": "core/kai"}
    with pytest.raises(Refusal) as e:
        hub.room_settings("proj", "core/juno", {"loop_cap": 1})
    assert e.value.rule == "lead-only"
    hub.room("proj").register("core/kai")
    assert hub.room_settings("proj", "core/kai", {"loop_cap": 2})["settings"]["loop_cap"] == 2
    # a no-op is judged as the change it would be
    hub.create_room("hub/admin", "town", open_=True)
    hub.pin_room("town", "hub/admin")
    hub.room("town").register("web/ana", ["lead"])
    with pytest.raises(Refusal) as e:
        hub.pin_room("town", "web/ana")
    assert e.value.rule == "lead-only"


def test_an_answer_returns_a_task_to_where_it_was_asked_from(proj, hub, clone):
    """A question asked before the start, and its answer, put the task in progress
    without a start: past its dependencies, its handshake and the leads' sign-offs
    (the assignee of a task of its own asked and answered itself). The answer now
    returns the task to the state it was asked from, as unblock does."""
    from test_rules_push import attempt
    first = proj.create_task("core/spartan", "first")["id"]
    t = proj.create_task("core/spartan", "after first", assignee="core/spartan",
                         after=[first])["id"]
    proj.move_task("core/spartan", t, "ask", question="may I?")
    assert proj.move_task("core/spartan", t, "answer", answer="yes, me")["state"] == \
        "assigned"
    with pytest.raises(Refusal) as e:   # and its start waits, as ever
        proj.move_task("core/spartan", t, "start")
    assert e.value.rule == "task-dependency", e.value
    cross = proj.create_task("web/mallory", "across", assignee="core/spartan")["id"]
    proj.move_task("core/spartan", cross, "ask", question="now?")
    # a raw push of the answer into in_progress, or of an ask that says nothing of
    # where it was asked from, is refused
    c = clone("web/mallory", room="proj")
    path = model.task_path(cross)
    c.write(path, c.read(path).replace('state = "feedback"', 'state = "in_progress"').replace(
        'answer = ""', 'answer = "go"').replace('resume = "assigned"', 'resume = ""')).commit(
        fmt.format_message(f"answer {cross}", "go", [("op", "task-answer"), ("task", cross)]))
    attempt(hub, c, "task-state-machine")
    assert proj.move_task("web/mallory", cross, "answer", answer="go")["state"] == "assigned"
    with pytest.raises(Refusal) as e:
        proj.move_task("core/spartan", cross, "start")
    assert e.value.rule == "dual-sign"
    c = clone("core/spartan", room="proj")
    c.write(path, c.read(path).replace('state = "assigned"', 'state = "feedback"').replace(
        'question = "now?"', 'question = "again?"').replace('answer = "go"', 'answer = ""')
    ).commit(fmt.format_message(f"ask {cross}", "again?", [("op", "task-ask"), ("task", cross)]))
    attempt(hub, c, "task-state-machine")
    # from in_progress, the answer returns it there
    proj.move_task("core/juno", cross, "sign")
    proj.move_task("web/ana", cross, "sign")
    proj.move_task("core/spartan", cross, "start")
    proj.move_task("core/spartan", cross, "ask", question="which port?")
    assert proj.move_task("web/mallory", cross, "answer", answer="8080")["state"] == \
        "in_progress"


def _stopped_hand_over(hub, team, lead, by):
    """A hand-over in the registry killed before it reached any room."""
    hub._hand_over = lambda *a, **k: []
    try:
        hub.register_team(team, lead, by=by)
    finally:
        del hub._hand_over


def test_a_hand_over_stopped_partway_leaves_the_old_lead_no_power_and_a_rerun_finishes_it(
        proj, hub, lobby):
    """Killed after the registry's commit, a hand-over left the old lead recorded in
    its rooms: it changed their settings, pinned, archived and destroyed them alone;
    the new lead's rerun of the same command did nothing, and nobody was told which
    rooms were left. Now what runs a room is its leads as the registry has them, and
    the same command, run again by either lead, finishes the hand-over."""
    hub.create_room("hub/admin", "solo", teams=["core"])
    lobby.register("core/juno", ["lead"])
    _stopped_hand_over(hub, "core", "core/spartan", "core/juno")
    assert hub.room("solo").view().room["leads"] == {"core": "core/juno"}
    for act in (lambda: hub.destroy_room("solo", "core/juno"),
                lambda: hub.archive_room("proj", "core/juno"),
                lambda: hub.pin_room("solo", "core/juno"),
                lambda: hub.room_settings("solo", "core/juno", {"loop_cap": 1})):
        with pytest.raises(Refusal) as e:
            act()
        assert e.value.rule == "lead-only", e.value
    assert hub.room_settings("solo", "core/spartan", {"loop_cap": 3})["settings"]["loop_cap"] == 3
    assert hub.destroy_room("proj", "core/spartan")["waiting_for"] == ["web/ana"]
    got = hub.register_team("core", "core/spartan", by="core/spartan")   # run again
    assert sorted(got["handed_over_in"]) == ["lobby", "proj", "solo"], got
    for room in ("lobby", "proj", "solo"):
        assert hub.room(room).view().room["leads"]["core"] == "core/spartan"
        hub.verify(room)
    # stopped again, and run again by the lead it replaced, in the rooms it still has
    hub.register_team("core", "core/spartan", ["juno"], by="core/spartan")
    _stopped_hand_over(hub, "core", "core/juno", "core/spartan")
    got = hub.register_team("core", "core/juno", by="core/spartan")
    assert sorted(got["handed_over_in"]) == ["lobby", "proj", "solo"], got
    assert hub.register_team("core", "core/juno", by="core/juno").get("handed_over_in") is None
    for room in ("lobby", "proj", "solo"):
        hub.verify(room)


def test_an_archived_room_is_run_by_its_teams_leads_as_the_registry_has_them(hub):
    """A hand-over reached active rooms only: the lead it replaced still pinned,
    restored, archived and destroyed an archived room alone, and the room came
    back from the archive with the old lead."""
    hub.register_team("core", "core/juno", ["kai"])
    hub.create_room("hub/admin", "old", teams=["core"])
    hub.archive_room("old", "core/juno")
    hub.register_team("core", "core/kai", by="core/juno")
    for act in (lambda: hub.pin_room("old", "core/juno"),
                lambda: hub.restore_room("old", "core/juno"),
                lambda: hub.destroy_room("old", "core/juno")):
        with pytest.raises(Refusal) as e:
            act()
        assert e.value.rule == "lead-only", e.value
    hub.restore_room("old", "core/kai")
    assert hub.room("old").view().room["leads"] == {"core": "core/kai"}
    hub.verify("old")


def test_verify_takes_the_hand_overs_the_rules_took(hub, lobby, tmp_path):
    """gitdrop verify judged history without the team registry, so a hand-over in an
    open room, accepted when written, was refused by verify ever after (and so was
    the new lead's room join). It now asks the registry as it stood then; a lead
    that gave itself the entry is refused still."""
    hub.register_team("core", "core/juno", ["kai", "eve"])
    lobby.register("core/juno", ["lead"])
    hub.register_team("core", "core/kai", by="core/juno")        # hands it over in lobby
    _stopped_hand_over(hub, "core", "core/juno", "core/kai")
    hub.join_room("core", "lobby", by="core/juno")                 # the new lead's re-sync
    assert lobby.view().room["leads"] == {"core": "core/juno"}
    hub.verify("lobby")
    # a room.toml pushed by eve, recording herself, to a hub that ran no hook
    os.remove(os.path.join(hub.path, "hooks", "pre-receive"))
    work = str(tmp_path / "w")
    git("clone", "-q", "-b", "rooms/lobby", hub.path, work)
    text = open(os.path.join(work, model.ROOM_FILE)).read()
    with open(os.path.join(work, model.ROOM_FILE), "w") as f:
        f.write(text.replace('core = "core/juno"', 'core = "core/eve"'))
    git("-c", "user.name=core/eve", "-c", "user.email=e@x", "commit", "-qam",
        "room-join\n\nGitdrop-Op: room-join", cwd=work)
    git("push", "-q", "origin", "HEAD:rooms/lobby", cwd=work)
    with pytest.raises(Refusal) as e:
        hub.verify("lobby")
    assert e.value.rule == "lead-only", e.value


def test_a_closed_room_takes_in_only_teams_the_registry_names(proj, hub, clone):
    """A room.toml pushed by a lead could name a team the registry does not have:
    anyone of that team then registered in the closed room, and made itself the
    team's lead there once it made the team."""
    c = clone("core/juno", "proj")
    text = c.read(model.ROOM_FILE)
    c.write(model.ROOM_FILE, text.replace('teams = ["core", "web"]',
                                          'teams = ["core", "web", "ghost"]'))
    c.commit("room-join\n\nGitdrop-Op: room-join")
    ok, err = c.push()
    assert not ok and refused_rule(err) == "lead-only" and "team 'ghost'" in err, err


def test_a_leads_own_work_is_reviewed_by_another_lead_or_the_operator(proj, hub, lobby):
    """A lead's own task in review could be approved by nobody: its reviewer was the
    lead of its team, itself, and nobody approves their own work. The refusal told
    it to ask itself."""
    tid = proj.create_task("core/juno", "mine", assignee="core/juno")["id"]
    proj.move_task("core/juno", tid, "start")
    proj.move_task("core/juno", tid, "submit")
    with pytest.raises(Refusal) as e:
        proj.move_task("core/juno", tid, "approve")
    assert "ask another lead of the room" in e.value.fix and "core/juno" not in e.value.fix
    with pytest.raises(Refusal):   # still nobody's that is no lead
        proj.move_task("core/spartan", tid, "approve")
    assert proj.move_task("web/ana", tid, "approve")["state"] == "completed"
    # an open room, where a lead acts for its own team only: the operator
    lobby.register("core/juno", ["lead"])
    lobby.register("web/ana", ["lead"])
    tid = lobby.create_task("core/juno", "mine too", assignee="core/juno")["id"]
    lobby.move_task("core/juno", tid, "start")
    lobby.move_task("core/juno", tid, "submit")
    with pytest.raises(Refusal):
        lobby.move_task("web/ana", tid, "approve")
    assert lobby.move_task("hub/admin", tid, "reject", note="tests?")["state"] == "in_progress"


def test_an_agent_of_a_team_a_room_does_not_take_is_told_so_not_to_register(proj):
    """ops/ada acting in core and web's closed room was told to register there,
    which was refused in turn (room-membership)."""
    with pytest.raises(NotFound) as e:
        proj.send("ops/ada", "core/juno", "hi")
    assert "team 'ops' is not a member of room 'proj'" in e.value.reason, e.value
    assert "gitdrop room join proj --team ops" in e.value.fix
    with pytest.raises(NotFound) as e:   # of a team it takes: register, as ever
        proj.send("core/kai", "core/juno", "hi")
    assert "register it" in e.value.fix


def test_a_team_changed_by_another_teams_lead_is_refused_as_lead_only_first(proj, hub):
    """register_team(core, leader=ops/ada) by ops/ada was refused as a format error
    ("name an agent of team core as its lead"), advice that was refused in turn."""
    hub.register_team("ops", "ops/ada")
    for lead in ("ops/ada", "core/ada"):
        with pytest.raises(Refusal) as e:
            hub.register_team("core", lead, by="ops/ada")
        assert e.value.rule == "lead-only" and "ask core/juno" in e.value.fix, e.value


def _hookless_room_push(hub, tmp_path, room, author, edit):
    """A room.toml change pushed as `author` to the hub with its hook taken away."""
    hooks = os.path.join(hub.path, "hooks", "pre-receive")
    if os.path.exists(hooks):
        os.remove(hooks)
    work = str(tmp_path / f"w{len(os.listdir(tmp_path))}")
    git("clone", "-q", "-b", f"rooms/{room}", hub.path, work)
    path = os.path.join(work, model.ROOM_FILE)
    text = open(path).read()
    with open(path, "w") as f:
        f.write(edit(text))
    git("-c", f"user.name={author}", "-c", "user.email=x@x", "commit", "-qam",
        "room-join\n\nGitdrop-Op: room-join", cwd=work)
    git("push", "-q", "origin", f"HEAD:rooms/{room}", cwd=work)


def test_verify_takes_a_hand_over_to_a_teammate_only_where_the_registry_is_unknown(
        hub, tmp_path):
    """A hand-over to any teammate is let through by verify only for a team the
    registry of then does not know (a room from another hub): here, where the registry
    names juno throughout, juno's hand-over of the room to eve is refused."""
    hub.register_team("core", "core/juno", ["kai", "eve"])
    hub.create_room("hub/admin", "proj", teams=["core"])
    _hookless_room_push(hub, tmp_path, "proj", "core/juno",
                        lambda t: t.replace('core = "core/juno"', 'core = "core/eve"'))
    with pytest.raises(Refusal) as e:
        hub.verify("proj")
    assert e.value.rule == "lead-only", e.value


def test_verify_and_import_take_a_re_sync_whatever_the_clocks_said(hub, lobby, tmp_path):
    """A hand-over written with a clock five minutes ahead dated the registry's commit
    after the new lead's re-sync, and verify refused the re-sync the hook had taken;
    a room whose hand-over the new lead's rerun finished did not import into a hub
    whose registry names that lead."""
    from gitdrop import bundle
    hub.register_team("core", "core/juno", ["kai"])
    hub.create_room("hub/admin", "proj", teams=["core"])
    lobby.register("core/juno", ["lead"])
    real = hub.clock
    hub.clock = lambda: int(time.time()) + 300
    _stopped_hand_over(hub, "core", "core/kai", "core/juno")
    hub.clock = real
    got = hub.register_team("core", "core/kai", by="core/kai")   # the rerun finishes it
    assert sorted(got["handed_over_in"]) == ["lobby", "proj"], got
    hub.verify("lobby")
    hub.verify("proj")
    out = str(tmp_path / "proj.bundle")
    bundle.export(hub.store, "proj", out)
    other = hubmod.init(str(tmp_path / "other.git"))
    other.register_team("core", "core/kai", ["juno"])
    bundle.import_room(other, out)
    other.verify("proj")


def test_until_a_stopped_hand_over_is_finished_the_registrys_lead_reviews_and_signs(
        proj, hub):
    """Where a stopped hand-over had not reached, the lead it replaced still signed
    cross-team tasks and reviewed its team's work, and the new lead was refused both,
    told to ask the old one."""
    hub.register_team("core", "core/juno", ["kai"], by="core/juno")
    proj.register("core/kai")
    cross = proj.create_task("web/ana", "cross", assignee="core/spartan")["id"]
    review = proj.create_task("core/juno", "review me", assignee="core/spartan")["id"]
    proj.move_task("core/spartan", review, "start")
    proj.move_task("core/spartan", review, "submit")
    _stopped_hand_over(hub, "core", "core/kai", "core/juno")
    assert proj.view().room["leads"]["core"] == "core/juno"   # not reached
    for move in ("sign", "approve"):
        with pytest.raises(Refusal) as e:
            proj.move_task("core/juno", cross if move == "sign" else review, move)
        assert "core/kai" in e.value.fix or "core/kai" in e.value.reason, e.value
    proj.move_task("core/kai", cross, "sign")
    assert proj.move_task("core/kai", review, "approve")["state"] == "completed"
    hub.verify("proj")
