"""The auto-responder (gitdrop/autorespond.py, gitdrop autorespond) on a real hub:
acknowledgements, escalation to the lead or a person as a task or a message, the cap
per sender across restarts, no ping-pong between two responders, no answering for a
person, the loop guard as the backstop, and the long-running command woken by the
notifier and stopped by SIGTERM."""

import contextlib
import json
import os
import select
import signal
import subprocess
import time

import pytest

from cli_helpers import ENTRY, Gitdrop
from gitdrop.autorespond import (AUTO_PREFIX, Responder, check_rules, classify,
                                 load_rules)
from gitdrop.errors import UsageError

RULES = """
away = "back on Monday"
[escalate]
questions = "lead"
decisions = "person:core/pat"
as = "{as_}"
[limits]
per_sender = {cap}
window = 3600
"""


@pytest.fixture
def room(team):
    team.register("core/pat", human=True)
    return team


def rules_file(tmp_path, as_="task", cap=3, extra="") -> str:
    p = tmp_path / f"rules-{as_}-{cap}.toml"
    p.write_text(RULES.format(as_=as_, cap=cap) + extra)
    return str(p)


def responder(room, agent="core/spartan", path=None, **kw):
    rules = load_rules(path) if path else check_rules({})
    return Responder(room.store.path, room.name, agent, rules, **kw)


def say(room, frm, to, text):
    """A message from `frm`, who reads what waits for it first (as it must)."""
    room.inbox(frm, limit=0)
    return room.send(frm, to, text)


def inbox(room, agent):
    return room.inbox(agent, limit=0)["messages"]


def auto_messages(room, author):
    return [m for m in room.history(n=1000) if m["from"] == author
            and m["text"].startswith(AUTO_PREFIX)]


# --- what a message is ---------------------------------------------------------------

@pytest.mark.parametrize("text,kind", [
    ("Thanks, the build is green.", "message"),
    ("Can you look at the login page", "question"),
    ("The tests fail on main. Any idea why? I am stuck.", "question"),
    ("how do I run the migrations", "question"),
    ("Please approve the schema change.", "decision"),
    ("Which option do we take: A or B?", "decision"),
    ("Is it ok to merge before the release?", "decision"),
    ("We need to decide on the cache.", "decision"),
    ("I will look into it tomorrow.", "message"),   # "I will": not a question word first
])
def test_classify(text, kind):
    assert classify(text) == kind


def test_classify_takes_time_linear_in_the_text():
    import time
    import attacks
    for text in attacks.BACKTRACKING_TEXTS:
        start = time.monotonic()
        assert classify(text) == "message" and classify(text + "? ok") == "question"
        assert time.monotonic() - start < 1, text[:20]


def test_the_rules_file_is_checked(tmp_path):
    with pytest.raises(UsageError, match="limits.per_sender"):
        check_rules({"limits": {"per_sender": 0}})
    with pytest.raises(UsageError, match="escalate.questions"):
        check_rules({"escalate": {"questions": "boss"}})
    with pytest.raises(UsageError, match="escalate.colour"):
        check_rules({"escalate": {"colour": "red"}})
    with pytest.raises(UsageError, match="placeholder"):
        check_rules({"ack": {"text": "{nobody} is away"}})
    bad = tmp_path / "bad.toml"
    bad.write_text("away = \n")
    with pytest.raises(UsageError, match="not TOML"):
        load_rules(str(bad))
    got = load_rules(rules_file(tmp_path))
    assert got["away"] == "back on Monday" and got["limits"]["per_sender"] == 3
    assert got["escalate"]["decisions"] == "person:core/pat"
    assert got["ack"]["text"]   # defaults filled in


# --- answering ---------------------------------------------------------------------

def test_a_plain_message_gets_an_acknowledgement(room, tmp_path):
    sent = room.send("core/kai", "core/spartan", "The staging server is up again.")
    evs = responder(room, path=rules_file(tmp_path)).run_once()
    assert [e["event"] for e in evs] == ["ack"]
    got = inbox(room, "core/kai")
    assert len(got) == 1 and got[0]["from"] == "core/spartan"
    assert got[0]["text"].startswith(AUTO_PREFIX)
    assert "core/spartan is away: back on Monday" in got[0]["text"]
    c = room.store.reader.commit(got[0]["id"])
    assert ("reply-to", sent["commit"]) in c.trailers
    assert inbox(room, "core/spartan") == []           # read: the responder answered it
    assert room.list_tasks(include_done=True) == []    # nothing to escalate


def test_a_question_goes_to_the_lead_as_a_task(room, tmp_path):
    q = room.send("core/kai", "core/spartan", "Can you review my PR today?\nIt is #42.")
    evs = responder(room, path=rules_file(tmp_path)).run_once()
    assert [e["event"] for e in evs] == ["escalated", "ack"]
    tid = evs[0]["task"]
    t = room.task(tid)
    assert t["assignee"] == "core/juno" and t["state"] == "assigned"
    assert t["creator"] == "core/spartan" and t["review"] is False
    assert "> Can you review my PR today?\n> It is #42." in t["body"]
    assert q["commit"] in t["body"]
    assert "kai" in t["title"] and "Can you review my PR today?" in t["title"]
    ack = inbox(room, "core/kai")[0]["text"]
    assert "passed on to core/juno as task " + tid in ack
    assert any(e.get("task") == tid for e in inbox(room, "core/juno"))   # juno is told


def test_a_question_goes_to_the_lead_as_a_message(room, tmp_path):
    room.send("core/kai", "core/spartan", "Why does CI take an hour?")
    evs = responder(room, path=rules_file(tmp_path, as_="message")).run_once()
    assert [(e["event"], e.get("as")) for e in evs[:1]] == [("escalated", "message")]
    assert room.list_tasks(include_done=True) == []
    to_juno = [m for m in inbox(room, "core/juno") if m["op"] == "send"
               and m["from"] == "core/spartan" and "core/juno" in m["to"]]
    assert len(to_juno) == 1
    assert to_juno[0]["text"].startswith(AUTO_PREFIX)
    assert "> Why does CI take an hour?" in to_juno[0]["text"]
    assert "passed on to core/juno." in inbox(room, "core/kai")[0]["text"]


def test_a_decision_request_goes_to_the_person(room, tmp_path):
    room.send("core/kai", "core/spartan", "Please approve the new schema.")
    evs = responder(room, path=rules_file(tmp_path)).run_once()
    assert evs[0]["event"] == "escalated" and evs[0]["kind"] == "decision"
    t = room.task(evs[0]["task"])
    assert t["assignee"] == "core/pat" and "Decision request" in t["title"]
    assert "> Please approve the new schema." in t["body"]


def test_no_lead_to_escalate_to_still_acknowledges(room, tmp_path):
    room.send("core/kai", "core/juno", "Should we ship on Friday?")
    evs = responder(room, agent="core/juno", path=rules_file(tmp_path)).run_once()
    assert [(e["event"], e.get("reason", "")) for e in evs] == [
        ("skipped", "no lead to escalate to"), ("ack", "")]
    assert room.list_tasks(include_done=True) == []


def test_only_direct_messages_are_answered(room, tmp_path):
    room.send("core/kai", "@core", "Standup moves to 10:00.")
    room.send("core/kai", "all", "Lunch?")
    evs = responder(room, path=rules_file(tmp_path)).run_once()
    assert [e["event"] for e in evs] == ["skipped", "skipped"]
    assert all(e["reason"].startswith("not-direct") for e in evs)
    assert inbox(room, "core/kai") == []


# --- the cap, restarts, ping-pong ---------------------------------------------------

def test_the_cap_per_sender_holds_across_restarts(room, tmp_path):
    path = rules_file(tmp_path, cap=2)
    for n in range(3):
        room.send("core/kai", "core/spartan", f"note {n}")
    evs = responder(room, path=path).run_once()
    assert [e["event"] for e in evs] == ["ack", "ack", "skipped"]
    assert evs[2]["reason"] == "capped"
    say(room, "core/kai", "core/spartan", "note 3")
    say(room, "core/juno", "core/spartan", "note from the lead")
    evs = responder(room, path=path).run_once()   # a new responder: counts from history
    assert [(e["event"], e["from"]) for e in evs] == [("skipped", "core/kai"),
                                                     ("ack", "core/juno")]
    assert len(auto_messages(room, "core/spartan")) == 3


def test_the_cap_holds_across_restarts_of_the_command(room, tmp_path):
    gd = Gitdrop(room.store.path, str(tmp_path), "core/spartan")
    path = rules_file(tmp_path, cap=1)
    room.send("core/kai", "core/spartan", "first")
    got = gd("autorespond", "--rules", path, "--once", "--json")
    assert got.rc == 0, got
    assert [json.loads(x)["event"] for x in got.out.splitlines()] == ["ack"]
    say(room, "core/kai", "core/spartan", "second")
    got = gd("autorespond", "--rules", path, "--once")
    assert got.rc == 0 and "skipped core/kai" in got.out and "capped" in got.out, got
    assert len(auto_messages(room, "core/spartan")) == 1


def test_two_responders_do_not_ping_pong(room, tmp_path):
    path = rules_file(tmp_path)
    room.send("core/kai", "core/spartan", "See you next week.")   # then kai goes away too
    spartan = responder(room, "core/spartan", path)
    kai = responder(room, "core/kai", path)
    for _ in range(4):
        spartan.run_once()
        kai.run_once()
    assert len(auto_messages(room, "core/spartan")) == 1   # the one ack to kai
    assert auto_messages(room, "core/kai") == []           # which kai's responder left alone


def test_escalated_messages_are_not_answered_by_the_lead_s_responder(room, tmp_path):
    room.send("core/kai", "core/spartan", "Who owns the billing service?")
    responder(room, "core/spartan", rules_file(tmp_path, as_="message")).run_once()
    evs = responder(room, "core/juno", rules_file(tmp_path)).run_once()
    reasons = {e["reason"] for e in evs if e["event"] == "skipped"}
    assert "auto-reply" in reasons
    assert auto_messages(room, "core/juno") == []


def test_a_person_is_never_answered_for(room, tmp_path):
    with pytest.raises(UsageError, match="person"):
        responder(room, "core/pat", rules_file(tmp_path))
    gd = Gitdrop(room.store.path, str(tmp_path), "core/pat")
    doc = gd.refused(2, "usage", "autorespond", "--rules", rules_file(tmp_path), "--once")
    assert "answers for themselves" in doc["reason"]


def test_the_loop_guard_refusal_is_reported_not_raised(hub, room, tmp_path):
    hub.room_settings("lobby", "hub/admin", {"loop_cap": 1})
    room.send("core/spartan", "core/kai", "Off until Monday.")   # spartan's one message
    room.inbox("core/kai")
    room.send("core/kai", "core/spartan", "ok, noted")
    evs = responder(room, path=rules_file(tmp_path)).run_once()
    assert [(e["event"], e.get("rule")) for e in evs] == [("refused", "loop-guard")]
    assert evs[0]["reason"]


# --- the long-running command ----------------------------------------------------------

def _lines(proc, until, timeout):
    """JSON lines of proc's stdout until one satisfies `until` (or the timeout)."""
    got, end, buf = [], time.monotonic() + timeout, b""
    fd = proc.stdout.fileno()
    poll = select.poll()   # not select(): a test worker's descriptors may pass 1024
    poll.register(fd, select.POLLIN)
    while time.monotonic() < end:
        if not poll.poll(max(0.0, end - time.monotonic()) * 1000):
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            ev = json.loads(line)
            got.append(ev)
            if until(ev):
                return got
    raise AssertionError(f"no such event within {timeout} s; got {got}")


def test_the_command_answers_while_running_and_stops_on_sigterm(room, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GITDROP_")}
    env.update(HOME=str(tmp_path), GITDROP_HUB=room.store.path, GITDROP_AGENT="core/spartan")
    proc = subprocess.Popen([*ENTRY, "autorespond", "--rules", rules_file(tmp_path),
                             "--json"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        _lines(proc, lambda ev: ev["event"] == "started", 30)
        assert room.view().agent("core/spartan")["status"] == "away: back on Monday"
        t0 = time.monotonic()
        room.send("core/kai", "core/spartan", "The release notes are in.")
        got = _lines(proc, lambda ev: ev["event"] == "ack", 10)
        took = time.monotonic() - t0
        assert took < 3, took
        assert got[-1]["from"] == "core/kai"
        assert len(auto_messages(room, "core/spartan")) == 1
        proc.send_signal(signal.SIGTERM)
        rest = _lines(proc, lambda ev: ev["event"] == "stopped", 10)
        assert rest[-1]["handled"] == 1
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    assert room.view().agent("core/spartan")["status"] == ""   # put back


def test_questions_refused_by_the_loop_guard_stay_pending_until_they_pass(hub, room,
                                                                           tmp_path):
    """In a flood the loop guard refuses the responder's escalations and acks; the
    messages were taken for handled all the same: read, and passed on to nobody (no
    escalation, no ack, nothing unread for the agent when back). They stay pending
    now, and a later round passes them on, once per message."""
    for q in ("Why is CI red?", "How do I run the migrations?", "Where is the config?"):
        room.send("core/kai", "core/spartan", q)
    hub.room_settings("lobby", "hub/admin", {"loop_cap": 2, "loop_window": 2})
    r = responder(room, path=rules_file(tmp_path, as_="message", cap=10))
    evs = r.run_once()
    assert ("refused", "loop-guard") in [(e["event"], e.get("rule")) for e in evs]
    assert os.path.exists(r.pending_path)
    deadline = time.monotonic() + 30
    while os.path.exists(r.pending_path) and time.monotonic() < deadline:
        time.sleep(1.0)   # the loop window passes: the next round goes on
        r.run_once()
    assert not os.path.exists(r.pending_path)
    escalated = [m["text"] for m in inbox(room, "core/juno") if m["op"] == "send"
                 and m["from"] == "core/spartan" and "core/juno" in m["to"]]
    assert len(escalated) == 3 and all(x.startswith(AUTO_PREFIX) for x in escalated)
    for q in ("Why is CI red?", "How do I run the migrations?", "Where is the config?"):
        assert sum(f"> {q}" in x for x in escalated) == 1, (q, escalated)
    acks = [m for m in inbox(room, "core/kai") if m["from"] == "core/spartan"]
    assert len(acks) == 3


@pytest.mark.parametrize("planted", ["fifo", "dir", "zero"])
def test_a_pending_file_that_is_no_plain_file_is_not_read(room, tmp_path, planted):
    """The pending file was read with open(): a FIFO planted there (by anyone who may
    write the hub's folders) hung every round, a folder raised, and a link to
    /dev/zero was read until memory ran out. It is read only as a plain file."""
    import threading
    r = responder(room, path=rules_file(tmp_path))
    os.makedirs(os.path.dirname(r.pending_path), exist_ok=True)
    {"fifo": os.mkfifo, "dir": os.mkdir,
     "zero": lambda p: os.symlink("/dev/zero", p)}[planted](r.pending_path)
    room.send("core/kai", "core/spartan", "Off until Monday?")
    got = []
    t = threading.Thread(target=lambda: got.append(r._pending()), daemon=True)
    t.start()
    t.join(10)
    assert got == [[]], "the pending file was waited on"


def test_the_status_comes_back_after_a_killed_responder_and_a_second_is_refused(room,
                                                                                tmp_path):
    """A responder killed with -9 left "away: ..." as the agent's status; the next one
    took that for the agent's own status and put it back as it stopped, for good. A
    second responder for the same agent did the same, sharing its pending file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GITDROP_")}
    env.update(HOME=str(tmp_path), GITDROP_HUB=room.store.path, GITDROP_AGENT="core/spartan")
    room.set_status("core/spartan", "coding the parser")
    args = [*ENTRY, "autorespond", "--rules", rules_file(tmp_path), "--json"]

    @contextlib.contextmanager
    def started():
        p = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             stdin=subprocess.DEVNULL)
        try:
            _lines(p, lambda ev: ev["event"] == "started", 30)
            yield p
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            p.stdout.close()
            p.stderr.close()
    with started() as first:
        second = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
        assert second.returncode != 0 and "already answering for core/spartan" in \
            second.stdout + second.stderr, (second.stdout, second.stderr)
        first.kill()
        first.wait(10)
    assert room.view().agent("core/spartan")["status"] == "away: back on Monday"
    with started() as again:
        again.send_signal(signal.SIGTERM)
        _lines(again, lambda ev: ev["event"] == "stopped", 10)
        assert again.wait(10) == 0
    assert room.view().agent("core/spartan")["status"] == "coding the parser"


def test_the_cap_per_sender_holds_past_the_history_the_count_reads(room, tmp_path,
                                                                   monkeypatch):
    """The answers were counted by walking back HISTORY_MAX commits (20,000): in a room
    that busy within the window, earlier answers fell out of the count, and a sender got
    answers (and the lead escalations) past per_sender."""
    import gitdrop.autorespond as ar
    monkeypatch.setattr(ar, "HISTORY_MAX", 5)   # a busy room, made small
    path = rules_file(tmp_path, cap=2)
    answered = 0
    for n in range(4):
        say(room, "core/kai", "core/spartan", f"note {n}")
        for i in range(6):   # other work in the room pushes the answers back
            room.set_status("core/juno", f"busy {n}.{i}")
        answered += sum(e["event"] == "ack" for e in responder(room, path=path).run_once())
    assert answered == 2
