"""The CLI as a user meets it: the real `gitdrop` entry point in a subprocess,
against a real hub (hooks installed), for each command, its JSON and its refusals."""

import os
import re
import subprocess

import pytest

from cli_helpers import Gitdrop
from conftest import git
from gitdrop import model
from gitdrop.cli.main import COMMANDS

TASK_MOVES = ("create", "list", "show", "assign", "claim", "start", "submit", "approve",
              "reject", "fail", "retry", "block", "unblock", "ask", "answer", "cancel", "sign")


@pytest.fixture
def gd(hub, tmp_path):
    return Gitdrop(hub.path, str(tmp_path / "home"), agent="core/juno")


@pytest.fixture
def team(team):
    """conftest's team, and a third coder these tests name."""
    team.register("core/ada", ["coder"])
    return team


# --- the surface -------------------------------------------------------------------

def test_help_lists_every_command_and_the_exit_codes(gd):
    r = gd.ok("--help", env={"COLUMNS": "120"})
    for name in COMMANDS:
        assert re.search(rf"\b{name}\b", r.out), name
    for code in ("2 usage", "3 refused by a rule", "4 not found", "5 ambiguous", "6 conflict",
                 "124"):
        assert code in r.out
    sub = gd.ok("task", "--help", env={"COLUMNS": "120"}).out
    for move in TASK_MOVES:
        assert re.search(rf"\b{move}\b", sub), move
    for group, subs in {"room": ("create", "list", "show", "join", "leave", "archive", "pin",
                                 "destroy", "restore"),
                        "team": ("create", "list"), "handshake": ("start", "ack", "status"),
                        "contract": ("declare", "list", "show"), "context": ("set", "get")}.items():
        out = gd.ok(group, "--help", env={"COLUMNS": "120"}).out
        for s in subs:
            assert re.search(rf"\b{s}\b", out), (group, s)
    assert gd.ok("--version").out.startswith("gitdrop ")


def test_python_dash_m_is_the_same_entry_point(gd, team):
    env = dict(gd.env)
    p = subprocess.run([os.sys.executable, "-m", "gitdrop", "who", "--json"], env=env,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "core/juno" in p.stdout


def test_init_creates_a_hub_with_hooks_and_a_lobby(gd, tmp_path):
    path = str(tmp_path / "fresh.git")
    doc = gd.js("init", path)
    assert doc["hub"] == path and doc["rooms"] == ["lobby"]
    assert os.access(os.path.join(path, "hooks", "pre-receive"), os.X_OK)
    again = gd.ok("init", path)  # idempotent: an upgrade in place
    assert "lobby" in again.out
    gd.refused(2, "usage", "init", "ssh://example.org/hub.git")


def test_default_hub_is_created_on_first_use(tmp_path):
    home = tmp_path / "h"
    g = Gitdrop("", str(home))
    g.env.pop("GITDROP_HUB")
    doc = g.js("room", "list")
    assert [r["room"] for r in doc["rooms"]] == ["lobby"]
    assert (home / ".gitdrop" / "hub.git" / "HEAD").exists()


# --- agents and messages ---------------------------------------------------------------

def test_register_who_status_ping_deregister(gd):
    r = gd.ok("register", "core/juno", "--role", "lead", "-d", "runs things")
    assert "core/juno joined lobby as lead" in r.out
    doc = gd.js("register", "spartan", "--team", "core", "--role", "coder,backend")
    assert doc["agent"] == "core/spartan" and doc["roles"] == ["coder", "backend"]
    gd.refused(2, "usage", "register", "core/x", "--team", "web")
    gd.refused(2, "usage", "register", "bad name")
    who = gd.js("who")["agents"]
    assert {a["agent"]: a["lead"] for a in who} == {"core/juno": True, "core/spartan": False}
    table = gd.ok("who").out
    assert "core/spartan" in table and "healthy" in table
    assert gd.js("status", "reviewing PRs")["status"] == "reviewing PRs"
    assert gd.js("--as", "spartan", "ping")["agent"] == "core/spartan"
    who = {a["agent"]: a for a in gd.js("who")["agents"]}
    assert who["core/juno"]["status"] == "reviewing PRs"
    assert gd.js("deregister", "--as", "spartan")["agent"] == "core/spartan"
    assert [a["agent"] for a in gd.js("who")["agents"]] == ["core/juno"]


def test_send_inbox_peek_and_the_unread_rule(gd, team):
    sent = gd.js("send", "spartan", "ada", "-m", "plan is up")
    assert sent["to"] == ["core/spartan", "core/ada"] and len(sent["commit"]) == 40
    doc = gd.refused(3, "unread-before-send", "--as", "spartan", "send", "juno", "-m", "ok")
    assert "unread" in doc["reason"] and "inbox" in doc["fix"] and doc["commit"]
    peek = gd.js("--as", "spartan", "inbox", "--peek")
    assert [m["text"] for m in peek["messages"]] == ["plan is up"]
    assert gd.js("--as", "spartan", "inbox", "--peek")["unread"] == 1  # still unread
    r = gd.ok("--as", "spartan", "inbox")
    assert "plan is up" in r.out and "juno" in r.out
    assert gd.js("--as", "spartan", "inbox")["messages"] == []
    assert "nothing new" in gd.ok("--as", "spartan", "inbox").out
    # stdin carries the text when there is no -m
    assert gd.js("--as", "spartan", "send", "juno", input="line one\nline two\n")["to"] == \
        ["core/juno"]
    got = gd.js("inbox")["messages"]
    assert got[-1]["text"].startswith("line one\nline two")
    gd.refused(2, "usage", "--as", "spartan", "send", "juno")  # no -m, no stdin
    gd.refused(3, "unknown-recipient", "send", "nobody", "-m", "hi")
    hist = gd.js("history", "-n", "5")["messages"]
    assert [m["text"].split("\n")[0] for m in hist] == ["plan is up", "line one"]
    assert "plan is up" in gd.ok("history").out


def test_inbox_is_bounded_with_the_count_of_what_remains(gd, team):
    for i in range(4):
        team.send("core/juno", "core/ada", f"note {i}")
    first = gd.js("--as", "ada", "inbox", "-n", "2")
    assert [m["text"] for m in first["messages"]] == ["note 0", "note 1"]
    assert first["remaining"] == 2
    r = gd.ok("--as", "ada", "inbox", "-n", "1")
    assert "note 2" in r.out and "1 more: run gitdrop inbox again" in r.out
    assert [m["text"] for m in gd.js("--as", "ada", "inbox")["messages"]] == ["note 3"]


def test_the_last_read_is_shown_again_for_an_answer_that_never_arrived(gd, team):
    """A read marks what it returns: an answer its caller never got (an MCP client
    killed, a connection dropped) left those messages read, unseen, and nothing
    would show them again to an agent (history is a lead's tool over MCP)."""
    assert gd.js("--as", "ada", "inbox", "--again")["messages"] == []   # no read yet
    for i in range(3):
        team.send("core/juno", "core/ada", f"note {i}")
    team.move_task("core/juno", team.create_task("core/juno", "t", assignee="core/ada")["id"],
                   "cancel")
    lost = team.inbox("core/ada", limit=2)   # read, and the answer lost
    assert [m["text"] for m in lost["messages"]] == ["note 0", "note 1"]
    again = gd.js("--as", "ada", "inbox", "--again")
    assert [m["id"] for m in again["messages"]] == [m["id"] for m in lost["messages"]]
    assert again["again"] is True and again["read_at"] and again["unread"] == 3
    team.inbox("core/ada")
    again = team.inbox("core/ada", again=True)   # the last read only: a note and notices
    assert [m["text"] for m in again["messages"]][0] == "note 2" and \
        [m["op"] for m in again["messages"]] == ["send", "task-create", "task-cancel"]
    tip = team.store.room_tip(team.name)
    assert team.inbox("core/ada", again=True)["messages"] == again["messages"]
    assert team.store.room_tip(team.name) == tip   # marks nothing
    assert team.inbox("core/ada")["messages"] == []
    team.send("core/juno", "core/ada", "later")
    out = gd.ok("--as", "ada", "inbox", "--again").out
    assert "3 read by core/ada" in out and "(1 unread since)" in out and "note 2" in out
    team.register("core/pat", human=True)
    team.send("core/pat", "core/ada", "from a person")
    first = team.inbox("core/ada")["messages"]
    assert [m.get("person") for m in first] == [None, True]
    assert [m.get("person") for m in team.inbox("core/ada", again=True)["messages"]] == \
        [None, True]


def test_names_resolve_or_are_refused(gd, lobby):
    lobby.register("core/juno", ["lead"])
    lobby.register("core/spartan", [])
    lobby.register("web/spartan", [])
    doc = gd.refused(5, "ambiguous", "send", "spartan", "-m", "hi")
    assert "core/spartan" in doc["reason"] and "web/spartan" in doc["reason"]
    assert "team/agent" in doc["fix"]
    assert gd.js("send", "web/spartan", "-m", "hi")["to"] == ["web/spartan"]
    g = Gitdrop(gd.hub, gd.env["HOME"])  # nobody: commands that act need --as
    g.refused(2, "usage", "ping")
    g.refused(4, "not-found", "--as", "core/ghost", "ping")
    g.refused(4, "not-found", "--room", "nowhere", "who")


def test_log_is_one_line_per_act(gd, team):
    gd.ok("send", "spartan", "-m", "hello")
    lines = gd.ok("log", "-n", "3").out.strip().splitlines()
    assert len(lines) == 3
    assert "juno → spartan: hello" in lines[-1] and "core/juno" in lines[-1]
    acts = gd.js("log", "-n", "50")["log"]
    assert acts[0]["op"] == "room-create" and acts[-1]["op"] == "send"
    old = gd.js("log", "--at", acts[1]["id"], "-n", "50")["log"]
    assert [a["id"] for a in old] == [a["id"] for a in acts[:2]]


# --- tasks ---------------------------------------------------------------------------------

def test_task_from_create_to_approve_with_a_rejection(gd, team, tmp_path):
    r = gd.ok("task", "create", "Build GET /users", "--assign", "spartan", "--tag", "api",
              "--priority", "2", "--body", "id and name of every user")
    assert r.out == "1\n" and "created task 1" in r.err  # the id alone on stdout
    body = tmp_path / "b.md"
    body.write_text("the page\n")
    doc = gd.js("task", "create", "Users page", "--body-file", str(body), "--tag", "web,ui",
                "--max-retries", "1")
    assert doc["id"] == "2" and doc["state"] == "pending"
    shown = gd.js("task", "show", "2")["task"]
    assert shown["body"] == "the page\n" and shown["tags"] == ["web", "ui"]
    assert shown["max_retries"] == 1
    out = gd.ok("task", "show", "1").out
    assert "Build GET /users" in out and "id and name of every user" in out
    listed = gd.js("task", "list")["tasks"]
    assert [t["id"] for t in listed] == ["1", "2"]  # priority first
    assert [t["id"] for t in gd.js("task", "list", "--state", "pending")["tasks"]] == ["2"]
    assert [t["id"] for t in gd.js("task", "list", "--assignee", "spartan")["tasks"]] == ["1"]
    assert [t["id"] for t in gd.js("task", "list", "--tag", "ui")["tasks"]] == ["2"]
    assert "Users page" in gd.ok("task", "list").out

    sp = ("--as", "spartan")
    assert gd.js(*sp, "task", "start", "1")["state"] == "in_progress"
    assert gd.js(*sp, "task", "submit", "1", "--note", "done")["state"] == "review"
    gd.refused(3, "task-state-machine", *sp, "task", "approve", "1")  # not the reviewer
    assert gd("task", "reject", "1").rc == 2  # --reason is required
    assert gd.js("task", "reject", "1", "--reason", "no tests")["state"] == "in_progress"
    assert "in_progress → review" in gd.ok(*sp, "task", "submit", "1").out
    assert gd.js("task", "approve", "1", "--note", "good")["state"] == "completed"
    assert gd.js("task", "list")["tasks"][0]["id"] == "2"  # done ones hidden
    assert "1" in [t["id"] for t in gd.js("task", "list", "--all")["tasks"]]
    doc = gd.refused(3, "task-state-machine", "task", "start", "1")
    assert "completed" in doc["reason"]
    gd.refused(4, "not-found", "task", "show", "99")


def test_every_other_task_move(gd, team):
    sp, ada = ("--as", "spartan"), ("--as", "ada")
    gd.ok("task", "create", "A")
    gd.ok("task", "create", "B")
    assert gd.js(*sp, "task", "claim", "1")["assignee"] == "core/spartan"
    doc = gd.refused(3, "task-state-machine", *ada, "task", "claim", "1")
    assert "core/spartan" in doc["reason"]  # told who won
    assert gd.js("task", "assign", "2", "ada")["state"] == "assigned"
    assert gd.js(*ada, "task", "block", "2", "--reason", "waiting on B")["state"] == "blocked"
    assert gd.js(*ada, "task", "unblock", "2")["state"] == "assigned"
    gd.ok(*ada, "task", "start", "2")
    assert gd.js(*ada, "task", "ask", "2", "--question", "which DB?")["state"] == "feedback"
    assert gd.js("task", "show", "2")["task"]["question"] == "which DB?"
    assert gd.js("task", "answer", "2", "postgres")["state"] == "in_progress"
    assert gd.js(*ada, "task", "fail", "2", "--reason", "no access")["state"] == "failed"
    assert gd.js("task", "retry", "2", "spartan")["assignee"] == "core/spartan"
    assert gd.js("task", "show", "2")["task"]["retries"] == 1
    assert gd.js("task", "cancel", "1", "--reason", "not needed")["state"] == "cancelled"
    doc = gd.refused(3, "dual-sign", "task", "sign", "2")  # one team: nothing to sign
    assert "sign" in doc["reason"]


def test_cross_team_task_is_signed_by_both_leads(gd, hub, lobby):
    lobby.register("core/juno", ["lead"])
    lobby.register("web/lin", ["lead"])
    lobby.register("web/kai", [])
    hub.register_team("core", "core/juno")
    hub.register_team("web", "web/lin")
    tid = gd.js("task", "create", "Cross", "--assign", "web/kai")["id"]
    doc = gd.refused(3, "dual-sign", "--as", "web/kai", "task", "start", tid)
    assert "sign" in doc["fix"]
    gd.ok("task", "sign", tid)
    gd.ok("--as", "web/lin", "task", "sign", tid)
    assert gd.js("--as", "web/kai", "task", "start", tid)["state"] == "in_progress"


# --- handshakes, contracts, context ---------------------------------------------------------

def test_handshake_gates_work_until_go(gd, team, tmp_path):
    plan = tmp_path / "plan.md"
    plan.write_text("spartan: API; ada: page\n")
    r = gd.ok("handshake", "start", "--plan-file", str(plan), "--to", "spartan", "--to", "ada")
    assert r.out == "1\n"
    gd.refused(3, "lead-only", "--as", "ada", "handshake", "start", "--plan", "mine")
    gd.refused(2, "usage", "handshake", "start")
    tid = gd.js("task", "create", "API", "--assign", "spartan", "--handshake", "1")["id"]
    doc = gd.refused(3, "handshake-go", "--as", "spartan", "task", "start", tid)
    assert "handshake 1" in doc["reason"] and "ack" in doc["fix"]
    assert gd.js("--as", "spartan", "handshake", "ack", "1")["status"] == "pending"
    gd.refused(3, "handshake-ack-once", "--as", "spartan", "handshake", "ack", "1")
    st = gd.js("handshake", "status", "1")["handshake"]
    assert st["acked"] == ["core/spartan"] and st["pending"] == ["core/ada"]
    assert "waiting for: core/ada" in gd.ok("handshake", "status", "1").out
    assert "GO" in gd.ok("--as", "ada", "handshake", "ack", "1").out
    assert gd.js("handshake", "status")["handshakes"][0]["status"] == "go"
    assert gd.js("--as", "spartan", "task", "start", tid)["state"] == "in_progress"


def test_contracts_are_versioned_and_owned(gd, team):
    sp = ("--as", "spartan")
    doc = gd.js(*sp, "contract", "declare", "api.users", "--text", "GET /users",
                "--kind", "api_endpoint")
    assert doc["version"] == 1 and doc["owner"] == "core/spartan"
    gd.refused(3, "contract-owner", "--as", "ada", "contract", "declare", "api.users",
               "--text", "mine now")
    assert gd.js(*sp, "contract", "declare", "api.users", "--text", "GET /users?page=N")[
        "version"] == 2
    assert gd.js("contract", "declare", "api.users", "--text", "lead edit")["version"] == 3
    c = gd.js("contract", "show", "api.users")["contract"]
    assert c["spec"].strip() == "lead edit" and c["kind"] == "api_endpoint"
    assert "api.users" in gd.ok("contract", "list").out
    assert [x["name"] for x in gd.js("contract", "list", "--owner", "spartan")["contracts"]] == \
        ["api.users"]
    assert gd.js("contract", "list", "--kind", "event")["contracts"] == []
    gd.refused(3, "format", *sp, "contract", "declare", "x", "--text", "t", "--kind", "nope")
    gd.refused(4, "not-found", "contract", "show", "nope")


def test_context_set_get_clear(gd, team):
    gd.ok("context", "set", "style", "tabs, not spaces")
    gd.ok("context", "set", "db", "-", input="postgres 16\nport 5432\n")
    assert gd.ok("context", "get", "style").out == "tabs, not spaces\n"
    assert gd.js("context", "get")["context"] == {"db": "postgres 16\nport 5432",
                                                  "style": "tabs, not spaces"}
    gd.ok("context", "set", "style", "--clear")
    gd.refused(4, "not-found", "context", "get", "style")
    gd.refused(2, "usage", "context", "set", "k")


# --- output discipline ------------------------------------------------------------------------

def test_json_is_exactly_one_document_even_for_errors(gd, team):
    for args in (("who",), ("task", "list"), ("log",), ("inbox", "--peek"), ("room", "list"),
                 ("task", "show", "42"), ("task", "show"), ("nosuchcommand",),
                 ("task", "create", "x", "--priority", "high")):
        r = gd(*args, "--json")
        doc = r.json  # raises unless stdout is one JSON document
        assert isinstance(doc, dict) and "ok" in doc, (args, r)
        assert doc["ok"] == (r.rc == 0), (args, r)
    assert gd("task", "create", "x", "--priority", "high", "--json").json["exit_code"] == 2
    # the top-level --json works as well as the command's own
    assert gd("--json", "who").json["ok"] is True


def test_colour_only_on_request_of_the_terminal(gd, team):
    gd.ok("send", "spartan", "-m", "hi")
    plain = gd.ok("--as", "spartan", "inbox", "--peek").out
    assert "\x1b[" not in plain  # not a terminal
    forced = gd.ok("--as", "spartan", "inbox", "--peek", env={"FORCE_COLOR": "1"}).out
    assert "\x1b[" in forced
    off = gd.ok("--as", "spartan", "inbox", "--peek", env={"FORCE_COLOR": "1", "NO_COLOR": "1"})
    assert "\x1b[" not in off.out


def test_shell_completion_is_typers(gd):
    # Typer takes the shell's name only with its detection off; with it on, it asks
    # the process tree, which depends on how the tests were started.
    script = gd.ok("--show-completion", "bash",
                   env={"_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}).out
    assert "_GITDROP_COMPLETE=complete_bash" in script
    r = gd("", env={"_GITDROP_COMPLETE": "complete_bash", "COMP_WORDS": "gitdrop task ap",
                    "COMP_CWORD": "2"})
    assert r.out.split() == ["approve"], r
    r = gd("", env={"_GITDROP_COMPLETE": "complete_bash", "COMP_WORDS": "gitdrop ro",
                    "COMP_CWORD": "1"})
    assert r.out.split() == ["room"], r


def test_start_up_imports_nothing_heavy(gd, team):
    """inbox must not pay for pygit2, mcp, watchdog, rich or pydantic (see
    bench/bench_cli.py): a room's verbs run on the lean store."""
    p = subprocess.run([os.sys.executable, "-X", "importtime", "-m", "gitdrop", "inbox"],
                       env=gd.env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    mods = {line.rsplit("|", 1)[-1].strip() for line in p.stderr.splitlines()
            if line.startswith("import time:")}
    assert "gitdrop.core" in mods and "gitdrop.leanstore" in mods
    heavy = {m for m in mods if m.split(".")[0] in ("pygit2", "mcp", "watchdog", "rich", "pydantic",
                                                   "starlette", "anyio", "httpx")}
    assert not heavy, sorted(heavy)


# --- git underneath ---------------------------------------------------------------------------

def test_a_task_file_pushed_by_hand_is_a_task(gd, team, tmp_path):
    work = str(tmp_path / "work")
    git("clone", "-q", "-b", "rooms/lobby", gd.hub, work)
    os.makedirs(os.path.join(work, os.path.dirname(model.task_path(7))))
    with open(os.path.join(work, model.task_path(7)), "w") as f:
        f.write('+++\nid = "7"\ntitle = "By hand"\nstate = "pending"\ncreator = "core/juno"\n'
                '+++\nWritten with an editor.\n')
    git("add", "-A", cwd=work)
    git("-c", "user.name=core/juno", "-c", "user.email=j@x", "commit", "-q", "-m", "task 7",
        cwd=work)
    assert git("push", "-q", "origin", "HEAD:rooms/lobby", cwd=work, check=False).returncode == 0
    t = gd.js("task", "show", "7")["task"]
    assert t["title"] == "By hand" and t["creator"] == "core/juno"
    assert gd.js("--as", "ada", "task", "claim", "7")["assignee"] == "core/ada"
    # a hand edit that breaks a rule is refused by the hook, and leaves no trace
    git("pull", "-q", "--rebase", "origin", "rooms/lobby", cwd=work)
    path = os.path.join(work, model.task_path(7))
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text.replace('state = "assigned"', 'state = "completed"'))
    git("-c", "user.name=core/ada", "-c", "user.email=a@x", "commit", "-qam", "done!", cwd=work)
    p = git("push", "origin", "HEAD:rooms/lobby", cwd=work, check=False)
    assert p.returncode != 0 and "task-state-machine" in p.stderr
    assert gd.js("task", "show", "7")["task"]["state"] == "assigned"
    assert gd.js("verify")["verified"] is True


def test_a_retried_command_with_the_same_key_is_applied_once(gd):
    gd.ok("register", "core/juno", "--role", "lead")
    gd.ok("register", "core/spartan")
    a = gd.js("--as", "juno", "send", "spartan", "-m", "ship it", "--key", "run-7")
    b = gd.js("--as", "juno", "send", "spartan", "-m", "ship it", "--key", "run-7")
    assert b["replayed"] is True and b["commit"] == a["commit"]
    t1 = gd.js("--as", "juno", "task", "create", "Once only", "--key", "run-8")
    t2 = gd.js("--as", "juno", "task", "create", "Once only", "--key", "run-8")
    assert t1["id"] == t2["id"]
    inbox = gd.js("--as", "spartan", "inbox")
    assert [m["text"] for m in inbox["messages"] if m["op"] == "send"] == ["ship it"]
