"""Every rule, through a real `git push` into a hub with the installed hook, and
through the same rules in process on the very same commits: one accepted and one
refused case each, and the two paths agree."""

import os

import pytest

from gitdrop import fmt, model, view
from gitdrop.errors import Refusal

from conftest import git, refused_rule


def task_doc(tid, creator, state="pending", assignee="", **extra):
    header = {"id": str(tid), "title": extra.pop("title", f"task {tid}"), "state": state,
              "creator": creator, "assignee": assignee, **extra}
    return fmt.dumps_doc(header, "Do the thing.")


def msg(text, to, op="send"):
    return fmt.format_message(text.split("\n")[0], text, [("op", op), ("to", to)])


def attempt(hub, c, expect):
    """Push the clone's new commits; the hook and the in-process check must agree."""
    before = hub.store.room_tip(c.room)
    local = c.local_verdict(before)
    ok, err = c.push()
    pushed = None if ok else refused_rule(err)
    assert local == expect, f"in-process verdict {local!r}, expected {expect!r}"
    assert pushed == expect, f"push verdict {pushed!r}, expected {expect!r}: {err}"
    if expect is None:
        assert hub.store.room_tip(c.room) == c.head()
    else:
        assert "fix:" in err and "commit:" in err and "why:" in err
        assert hub.store.room_tip(c.room) == before          # nothing moved
        gone = git("cat-file", "-e", c.head(), cwd=hub.path, check=False)
        assert gone.returncode != 0                          # and no object stayed
    return err


def test_registered_author(hub, team, clone):
    c = clone("core/nobody")
    c.write(model.task_path(50), task_doc(50, "core/nobody")).commit("a task")
    attempt(hub, c, "registered-author")
    c.pull().as_("core/spartan")
    c.write(model.task_path(50), task_doc(50, "core/spartan")).commit("a task")
    attempt(hub, c, None)
    assert team.task(50)["creator"] == "core/spartan"


def test_room_membership(hub, team, clone):
    hub.register_team("core", "core/juno")
    hub.create_room("core/juno", "ops", teams=["core"])
    c = clone("web/ana", room="ops")
    agent = {"id": "web/ana", "cursor": hub.store.room_tip("ops")}
    c.write(model.agent_path("web/ana"), fmt.dumps_toml(agent)).commit("ana joins")
    err = attempt(hub, c, "room-membership")
    assert "team 'web' is not a member" in err
    c.pull().as_("core/ana")
    c.write(model.agent_path("core/ana"), fmt.dumps_toml({"id": "core/ana", "cursor": c.head()}))
    c.commit("ana joins")
    # a closed room's teams are their registry members (the clone has no registry: the
    # hub's hook alone judges this one)
    ok, err = c.push()
    assert not ok and refused_rule(err) == "room-membership", err
    assert "gitdrop team add core ana --as core/juno" in err
    assert hub.store.room_tip("ops") != c.head()
    hub.register_team("core", "core/juno", ["ana"], by="core/juno")
    attempt(hub, c, None)


def test_linear_history(hub, team, clone):
    c = clone("core/spartan")
    base = c.head()
    git("checkout", "-q", "-b", "side", cwd=c.path)
    c.write(model.task_path(60), task_doc(60, "core/spartan")).commit("side task")
    git("checkout", "-q", "-", cwd=c.path)
    c.write("context/notes.md", "hello\n").commit("notes")
    git("merge", "-q", "--no-edit", "side", cwd=c.path)
    attempt(hub, c, "linear-history")
    git("reset", "-q", "--hard", base, cwd=c.path)
    c.write("context/notes.md", "hello\n").commit("notes")
    attempt(hub, c, None)


def test_one_operation(hub, team, clone):
    c = clone("core/spartan")
    c.write(model.task_path(70), task_doc(70, "core/spartan"))
    c.write(model.task_path(71), task_doc(71, "core/spartan")).commit("two tasks")
    attempt(hub, c, "one-operation")
    c.pull()
    c.write(model.task_path(70), task_doc(70, "core/spartan"))
    c.commit(fmt.format_message("a note", "hi", [("op", "send"), ("to", "all")]))
    err = attempt(hub, c, "one-operation")
    assert "must not change files" in err
    c.pull()
    c.write(model.task_path(70), task_doc(70, "core/spartan")).commit("one task")
    attempt(hub, c, None)


def test_format(hub, team, clone):
    c = clone("core/spartan")
    # a file at no known path says why, with or without a declared op (it said "one
    # context file per commit" when the key was the trouble)
    c.write("context/a b.md", "notes\n").commit(
        fmt.format_message("notes", "", [("op", "context-set")]))
    err = attempt(hub, c, "format")
    assert "context/a b.md is not a path gitdrop knows" in err and "contains ' '" in err
    c.pull()
    c.write(model.task_path(80), "title: no front matter\n").commit("bad task")
    err = attempt(hub, c, "format")
    assert "+++" in err
    c.pull()
    c.write(model.task_path(80), task_doc(80, "core/spartan", priority="high")).commit("bad field")
    attempt(hub, c, "format")
    c.pull()
    c.write(model.task_path(80), task_doc(80, "core/spartan", priority=2)).commit("good")
    attempt(hub, c, None)


def test_task_state_machine(hub, team, clone):
    t = team.create_task("core/juno", "Parser")
    c = clone("core/spartan")
    path = model.task_path(t['id'])
    c.write(path, c.read(path).replace('state = "pending"', 'state = "completed"'))
    c.commit("done already")
    err = attempt(hub, c, "task-state-machine")
    assert "from pending you may: assign (→ assigned), claim (→ assigned)" in err
    c.pull()
    text = c.read(path).replace('state = "pending"', 'state = "assigned"')
    c.write(path, text.replace('assignee = ""', 'assignee = "core/spartan"')).commit("mine")
    attempt(hub, c, None)
    assert team.task(t["id"])["assignee"] == "core/spartan"
    # the core refuses the same illegal move with the same rule
    with pytest.raises(Refusal) as e:
        team.move_task("core/spartan", t["id"], "approve")
    assert e.value.rule == "task-state-machine"


def test_unread_before_send(hub, team, clone):
    team.send("core/juno", "core/spartan", "status?")
    c = clone("core/spartan")
    c.commit(msg("all good", "core/juno"), allow_empty=True)
    err = attempt(hub, c, "unread-before-send")
    assert "1 unread" in err and "inbox" in err
    with pytest.raises(Refusal) as e:
        team.send("core/spartan", "core/juno", "all good")
    assert e.value.rule == "unread-before-send"
    assert team.inbox("core/spartan")["messages"][0]["text"] == "status?"
    c.pull()
    c.commit(msg("all good", "core/juno"), allow_empty=True)
    attempt(hub, c, None)


def test_unknown_recipient(hub, team, clone):
    c = clone("core/spartan")
    c.commit(msg("hello?", "core/ghost"), allow_empty=True)
    attempt(hub, c, "unknown-recipient")
    with pytest.raises(Refusal) as e:
        team.send("core/spartan", "ghost", "hello?")
    assert e.value.rule == "unknown-recipient"
    c.pull()
    c.commit(msg("hello", "core/kai"), allow_empty=True)
    attempt(hub, c, None)


def test_size_limit(hub, team, clone):
    c = clone("core/spartan")
    c.commit(msg("x" * 20000, "core/kai"), allow_empty=True)
    err = attempt(hub, c, "size-limit")
    assert "16384" in err
    with pytest.raises(Refusal) as e:
        team.send("core/spartan", "core/kai", "y" * 20000)
    assert e.value.rule == "size-limit"
    c.pull()
    c.commit(msg("x" * 1000, "core/kai"), allow_empty=True)
    attempt(hub, c, None)


def test_a_push_brings_at_most_max_push_commits(hub, team, clone):
    """Each commit costs the hook milliseconds: one push of 100,000 would hold the
    server for minutes, so a push is bounded (gitdrop.maxPushCommits, all refs
    together) and refused whole before any commit is checked."""
    from gitdrop.hook import MAX_PUSH_COMMITS, max_push_commits
    assert max_push_commits(hub.path) == MAX_PUSH_COMMITS == 10000
    git("config", "gitdrop.maxPushCommits", "3", cwd=hub.path)
    assert max_push_commits(hub.path) == 3
    c = clone("core/spartan")
    before = hub.store.room_tip("lobby")
    for k in range(4):
        c.write(f"context/note{k}.md", f"note {k}\n")
        c.commit(fmt.format_message(f"note {k}", "", [("op", "context-set")]))
    ok, err = c.push()
    assert not ok and refused_rule(err) == "size-limit", err
    assert "more than 3 commits" in err and "push in parts" in err and "fix:" in err
    assert hub.store.room_tip("lobby") == before
    assert git("cat-file", "-e", c.head(), cwd=hub.path, check=False).returncode != 0
    # in parts, each within the limit, the same commits go in
    git("push", "origin", "HEAD~1:rooms/lobby", cwd=c.path)
    ok, err = c.push()
    assert ok, err
    assert hub.store.room_tip("lobby") == c.head()
    git("config", "gitdrop.maxPushCommits", "many", cwd=hub.path)   # no number: the default
    assert max_push_commits(hub.path) == MAX_PUSH_COMMITS
    # and git itself refuses a pack past receive.maxInputSize before it is all on disk
    import base64
    git("config", "receive.maxInputSize", "20k", cwd=hub.path)
    c.write("context/big.md", base64.b64encode(os.urandom(45000)).decode() + "\n")
    c.commit(fmt.format_message("big", "", [("op", "context-set")]))
    ok, err = c.push()
    assert not ok and "exceeds maximum allowed size" in err, err
    assert hub.store.room_tip("lobby") != c.head()


def test_lead_only_handshake(hub, team, clone):
    plan = {"id": 1, "initiator": "core/spartan", "targets": ["core/kai"]}
    c = clone("core/spartan")
    c.write("handshakes/1.md", fmt.dumps_doc(plan, "The plan.")).commit("plan")
    attempt(hub, c, "lead-only")
    with pytest.raises(Refusal) as e:
        team.start_handshake("core/spartan", "The plan.", ["core/kai"])
    assert e.value.rule == "lead-only"
    c.pull().as_("core/juno")
    c.write("handshakes/1.md", fmt.dumps_doc(dict(plan, initiator="core/juno"), "The plan."))
    c.commit("plan")
    attempt(hub, c, None)


def test_handshake_ack_once_and_go(hub, team, clone):
    h = team.start_handshake("core/juno", "Build it in two parts", ["core/spartan", "core/kai"])
    t = team.create_task("core/juno", "part one", assignee="core/spartan", handshake=h["id"])
    with pytest.raises(Refusal) as e:
        team.move_task("core/spartan", t["id"], "start")
    assert e.value.rule == "handshake-go"
    team.ack_handshake("core/spartan", h["id"])
    with pytest.raises(Refusal) as e:
        team.ack_handshake("core/spartan", h["id"])
    assert e.value.rule == "handshake-ack-once"
    # by hand: juno is not a target
    c = clone("core/juno")
    path = f"handshakes/{h['id']}.md"
    c.write(path, c.read(path).replace('acks = ["core/spartan"]',
                                       'acks = ["core/spartan", "core/juno"]')).commit("ack")
    attempt(hub, c, "handshake-ack-once")
    # by hand: starting before GO
    c.pull().as_("core/spartan")
    tp = model.task_path(t['id'])
    c.write(tp, c.read(tp).replace('state = "assigned"', 'state = "in_progress"')).commit("go!")
    err = attempt(hub, c, "handshake-go")
    assert "core/kai" in err
    # kai acks by hand: GO is recorded, then the start is accepted
    c.pull().as_("core/kai")
    c.write(path, c.read(path).replace('acks = ["core/spartan"]',
                                       'acks = ["core/spartan", "core/kai"]')
            .replace('status = "pending"', 'status = "go"')).commit("ack")
    attempt(hub, c, None)
    assert team.handshake(h["id"])["status"] == "go"
    c.pull().as_("core/spartan")
    c.write(tp, c.read(tp).replace('state = "assigned"', 'state = "in_progress"')).commit("go!")
    attempt(hub, c, None)


def test_contract_owner_and_version(hub, team, clone):
    team.declare_contract("core/kai", "parse_config", "def parse_config(path) -> dict",
                          kind="function")
    c = clone("core/spartan")
    p = "contracts/parse_config.md"
    c.write(p, c.read(p).replace("version = 1", "version = 2") + "# changed\n").commit("edit")
    err = attempt(hub, c, "contract-owner")
    assert "core/kai" in err
    c.pull().as_("core/kai")
    c.write(p, c.read(p) + "# changed\n").commit("edit without bump")
    attempt(hub, c, "contract-version")
    c.pull()
    c.write(p, c.read(p).replace("version = 1", "version = 2") + "# changed\n").commit("v2")
    attempt(hub, c, None)
    assert team.contract("parse_config")["version"] == 2
    assert team.declare_contract("core/kai", "parse_config", "v3 text")["version"] == 3


def test_loop_guard(hub, team, clone):
    team.update_room("hub/admin", "room-settings", "loop cap 2",
                     settings={"loop_cap": 2, "loop_window": 3600})
    team.send("core/kai", "all", "one")
    team.send("core/kai", "all", "two")
    with pytest.raises(Refusal) as e:
        team.send("core/kai", "all", "three")
    assert e.value.rule == "loop-guard" and "wait" in e.value.fix
    c = clone("core/kai")
    c.commit(msg("three", "all"), allow_empty=True)
    attempt(hub, c, "loop-guard")
    c.pull().as_("core/spartan")
    team.inbox("core/spartan")
    c.pull()
    c.commit(msg("mine", "all"), allow_empty=True)
    attempt(hub, c, None)


def test_clock(hub, team, clone):
    c = clone("core/spartan")
    c.write("context/a.md", "a\n")
    git("add", "-A", cwd=c.path)
    git("commit", "-q", "-m", "from the future", cwd=c.path,
        env={"GIT_COMMITTER_DATE": "2099-01-01T00:00:00Z"})
    ok, err = c.push()
    assert refused_rule(err) == "clock"
    c.pull()
    c.write("context/a.md", "a\n").commit("now")
    assert c.push()[0]


def test_hand_note_without_trailers_is_a_message_to_all(hub, team, clone):
    c = clone("core/spartan")
    c.commit("standup: parser is half done", allow_empty=True)
    attempt(hub, c, None)
    inbox = team.inbox("core/kai")["messages"]
    assert [m["text"] for m in inbox] == ["standup: parser is half done"]
    assert inbox[0]["via"] == "all"


def test_ref_deletion_and_foreign_refs_refused(hub, team, clone):
    c = clone("core/spartan")
    p = git("push", "origin", "HEAD:refs/heads/main", cwd=c.path, check=False)
    assert p.returncode != 0 and "refused by rule format" in p.stderr
    p = git("push", "origin", ":rooms/lobby", cwd=c.path, check=False)
    assert p.returncode != 0
    assert hub.store.room_tip("lobby")


def test_view_parses_what_core_writes(team):
    t = team.create_task("core/juno", "Title with \"quotes\" and \\ a backslash?", "body\n\nmore",
                         tags=["a", "b"], priority=3)
    got = team.task(t["id"])
    assert got["tags"] == ["a", "b"] and got["priority"] == 3
    assert got["body"].strip() == "body\n\nmore"
    assert view.parse_file("task", team.view().text(model.task_path(t['id'])))[0]["priority"] == 3


def test_protocol_doc_has_the_machine_table():
    import os
    from gitdrop import machine
    doc = open(os.path.join(os.path.dirname(__file__), "..", "docs", "PROTOCOL.md")).read()
    assert machine.table_markdown() in doc
    for rule in ("registered-author", "room-membership", "linear-history", "one-operation",
                 "task-state-machine", "unread-before-send", "handshake-ack-once",
                 "handshake-go", "contract-owner", "contract-version", "size-limit",
                 "loop-guard", "dual-sign", "unknown-recipient", "lead-only", "clock",
                 "authenticated-pusher", "format"):
        assert f"`{rule}`" in doc, rule


def test_protocol_doc_by_hand_example_is_accepted(hub, lobby, tmp_path):
    """The doc's git-only example, run as written against a real hub."""
    import os
    import re
    import subprocess
    lobby.register("core/spartan")
    doc = open(os.path.join(os.path.dirname(__file__), "..", "docs", "PROTOCOL.md")).read()
    script = re.search(r"## By hand, with git only\n\n```sh\n(.*?)```", doc, re.S).group(1)
    script = script.replace("~/.gitdrop/hub.git", hub.path)
    p = subprocess.run(["bash", "-euc", script], cwd=tmp_path, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert lobby.task(42)["title"] == "Write the changelog"
    assert lobby.inbox("core/spartan")["unread"] == 0
    assert [e["subject"] for e in lobby.log(2)][-1] == "standup: parser half done"


def test_text_with_unicode_line_separators_round_trips(team, hub, clone):
    body = "odd\u2028title\u0085here\n\nline\u2029para"
    t = team.create_task("core/juno", "odd title", body=body)
    assert team.task(t["id"])["body"].rstrip("\n") == body
    with pytest.raises(Refusal) as e:   # a title is listed one per line: it may not break
        team.create_task("core/juno", "odd\u2028title")
    assert e.value.rule == "format"
    c = clone("core/spartan")   # and the hook reads the same file back
    c.write("context/x.md", "a\u2028b\n").commit("context")
    attempt(hub, c, None)


def test_a_late_claim_by_push_is_told_who_won(hub, team, clone):
    t = team.create_task("core/juno", "one of a kind")
    c = clone("core/kai")
    team.move_task("core/spartan", t["id"], "claim")   # spartan is first
    c.pull()
    path = model.task_path(t['id'])
    c.write(path, c.read(path).replace('assignee = "core/spartan"', 'assignee = "core/kai"'))
    c.commit(fmt.format_message("kai claims", "", [("op", "task-claim"), ("task", t["id"])]))
    err = attempt(hub, c, "task-state-machine")
    assert "already claimed by core/spartan" in err


def test_the_hook_imports_stay_light():
    """The hook starts on every push: it must not pay for pygit2 (~100 ms),
    nor for modules only a crash replay needs (hashlib: OpenSSL) or contextlib."""
    import subprocess
    import sys
    import os
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.run([sys.executable, "-S", "-X", "importtime", "-c", "import gitdrop.hook"],
                       capture_output=True, text=True, cwd=root)   # -S: as the hook runs
    assert p.returncode == 0, p.stderr
    mods = {line.split("|")[-1].strip() for line in p.stderr.splitlines() if "|" in line}
    assert "gitdrop.wal" in mods
    heavy = {m for m in mods if m.split(".")[0] in ("pygit2", "hashlib", "_hashlib",
                                                    "contextlib", "threading", "json")}
    assert not heavy, sorted(heavy)
