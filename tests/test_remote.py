"""The remote hub client over file:// URLs: a local mirror, the same core, a real
`git push` into a hub with the real hook, races redone on the fetched tip and the
hook's refusals handed back as the same Refusal."""

import os
import subprocess
import threading

import pytest

from gitdrop import hub as hubmod
from gitdrop.opener import open_hub
from gitdrop.transports import remote
from gitdrop.errors import NotFound, Refusal, UsageError
from gitdrop.transports.remote import RemoteHub, Unreachable, is_url, parse_refusal

from conftest import git


@pytest.fixture
def url(hub):
    return "file://" + hub.path


def client(url, tmp_path, name, fresh=0.0):
    return RemoteHub(url, cache=str(tmp_path / f"cache-{name}"), fresh=fresh)


def objects(path):
    out = git("cat-file", "--batch-all-objects", "--batch-check=%(objectname)", cwd=path).stdout
    return set(out.split())


def refs(path):
    return git("for-each-ref", "--format=%(refname) %(objectname)", cwd=path).stdout


@pytest.mark.parametrize("s, expected", [
    ("file:///srv/hub.git", True), ("git://host/hub.git", True), ("http://h/hub.git", True),
    ("https://h:8443/x/hub.git", True), ("ssh://me@host:22/srv/hub.git", True),
    ("me@host:hub.git", True), ("host:srv/hub.git", True), ("/srv/hub.git", False),
    ("./a:b", False), ("hub.git", False), ("", False), ("ftp://h/x", False)])
def test_is_url(s, expected):
    assert is_url(s) is expected


def test_open_hub_takes_a_url(hub, url, tmp_path, monkeypatch):
    monkeypatch.setenv("GITDROP_CACHE", str(tmp_path / "cache"))
    h = open_hub(url)
    assert isinstance(h, RemoteHub)
    assert h.path.startswith(str(tmp_path / "cache"))
    assert [r["room"] for r in h.rooms()] == ["lobby"]
    assert type(open_hub(hub.path)) is hubmod.Hub


def test_writes_land_on_the_hub(hub, url, tmp_path):
    h = client(url, tmp_path, "a")
    lobby = h.room("lobby")
    lobby.register("core/juno", ["lead"])
    lobby.register("core/spartan", ["coder"])
    sent = lobby.send("juno", "spartan", "hello from afar")
    task = lobby.create_task("juno", "ship it", assignee="spartan")
    # the hub itself has every commit, and the mirror agrees with it
    server = hub.room("lobby")
    assert hub.store.room_tip("lobby") == h.store.tip("refs/heads/rooms/lobby") == task["commit"]
    inbox = server.inbox("core/spartan", peek=True)
    assert [m["text"] for m in inbox["messages"] if m["op"] == "send"] == ["hello from afar"]
    assert inbox["messages"][0]["id"] == sent["commit"]
    assert server.task(task["id"])["assignee"] == "core/spartan"
    assert [op for _, op in hub.verify("lobby")][-2:] == ["send", "task-create"]
    # hub-branch and room-lifecycle writes too
    h.register_team("core", "core/juno", ["core/spartan"], by="core/juno")
    h.create_room("core/juno", "dev", ["core"])
    assert hub.team("core")["members"] == ["core/juno", "core/spartan"]
    assert [r["room"] for r in hub.rooms()] == ["dev", "lobby"]


def test_reads_fetch_what_others_wrote(hub, url, tmp_path):
    h = client(url, tmp_path, "a")
    hub.room("lobby").register("core/juno", ["lead"])          # written on the hub directly
    assert [a["agent"] for a in h.room("lobby").who()] == ["core/juno"]
    stale = client(url, tmp_path, "b", fresh=3600)
    hub.room("lobby").create_task("core/juno", "later")
    assert stale.room("lobby").list_tasks() == []               # within its freshness window
    stale.refresh()
    assert [t["title"] for t in stale.room("lobby").list_tasks()] == ["later"]


def test_a_local_refusal_pushes_nothing(hub, url, tmp_path):
    h = client(url, tmp_path, "a")
    h.room("lobby").register("core/juno", ["lead"])
    before_refs, before_objects = refs(hub.path), objects(hub.path)
    with pytest.raises(Refusal) as e:
        h.room("lobby").send("core/juno", "core/ghost", "anyone?")
    assert e.value.rule == "unknown-recipient"
    assert refs(hub.path) == before_refs and objects(hub.path) == before_objects


def test_a_hook_refusal_comes_back_and_is_rolled_back(hub, url, tmp_path, monkeypatch):
    h = client(url, tmp_path, "a")
    h.room("lobby").register("core/juno", ["lead"])
    before_refs, before_objects = refs(hub.path), objects(hub.path)
    tip = hub.store.room_tip("lobby")
    # A file:// push runs the hook in our own environment: claim to be juno.
    monkeypatch.setenv("GITDROP_PUSHER", "core/juno")
    with pytest.raises(Refusal) as e:
        h.room("lobby").register("core/spartan", ["coder"])
    assert e.value.rule == "authenticated-pusher"
    assert "core/spartan" in e.value.reason and "core/juno" in e.value.fix
    assert e.value.commit                                      # the commit the hook named
    assert h.store.tip("refs/heads/rooms/lobby") == tip        # the mirror was put back
    assert refs(hub.path) == before_refs and objects(hub.path) == before_objects
    assert h.room("lobby").register("core/juno", ["lead", "coder"])["updated"] is True


def test_a_claim_that_lost_the_race_names_the_winner(hub, url, tmp_path):
    a, b = client(url, tmp_path, "a", fresh=3600), client(url, tmp_path, "b", fresh=3600)
    a.room("lobby").register("core/juno", ["lead"])
    a.room("lobby").register("core/spartan", ["coder"])
    tid = a.room("lobby").create_task("juno", "one task")["id"]
    b.refresh()                       # b sees the task, then goes stale
    assert a.room("lobby").move_task("spartan", tid, "claim")["assignee"] == "core/spartan"
    with pytest.raises(Refusal) as e:
        b.room("lobby").move_task("juno", tid, "claim")   # built on the old tip, pushed, rejected
    assert e.value.rule == "task-state-machine" and "core/spartan" in e.value.reason
    assert b.store.lost_races == 1
    assert hub.room("lobby").task(tid)["assignee"] == "core/spartan"
    assert b.store.tip("refs/heads/rooms/lobby") == hub.store.room_tip("lobby")


def test_a_stale_write_is_redone_on_the_new_tip(hub, url, tmp_path):
    a, b = client(url, tmp_path, "a", fresh=3600), client(url, tmp_path, "b", fresh=3600)
    for who in ("core/juno", "core/spartan", "core/kai"):
        a.room("lobby").register(who)
    b.refresh()
    a.room("lobby").send("juno", "kai", "first")
    b.room("lobby").send("spartan", "kai", "second")       # rejected once, then rebuilt
    assert b.store.lost_races == 1
    texts = [m["text"] for m in hub.room("lobby").inbox("core/kai", peek=True)["messages"]]
    assert texts == ["first", "second"]
    assert [op for _, op in hub.verify("lobby")][-2:] == ["send", "send"]
    git("fsck", "--no-progress", cwd=hub.path)


def test_writers_sharing_one_mirror_lose_nothing(hub, url, tmp_path):
    setup = client(url, tmp_path, "shared")
    for who in ("core/juno", "core/spartan", "core/kai"):
        setup.room("lobby").register(who)
    # two hub objects on the same mirror (same cache, same URL), as two processes would be
    hubs = [client(url, tmp_path, "shared"), client(url, tmp_path, "shared")]
    assert hubs[0].path == hubs[1].path
    errors = []

    def sender(h, agent):
        try:
            for i in range(4):
                h.room("lobby").send(agent, "kai", f"{agent} {i}")
        except Exception as e:   # reported below
            errors.append(e)
    threads = [threading.Thread(target=sender, args=(h, a))
               for h, a in zip(hubs, ("core/juno", "core/spartan"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    texts = [m["text"] for m in hub.room("lobby").inbox("core/kai", peek=True, limit=0)["messages"]]
    assert sorted(texts) == sorted(f"{a} {i}" for a in ("core/juno", "core/spartan")
                                   for i in range(4))


def test_a_refusal_from_a_stale_mirror_is_checked_again(hub, url, tmp_path):
    a, b = client(url, tmp_path, "a", fresh=3600), client(url, tmp_path, "b", fresh=3600)
    a.room("lobby").register("core/juno", ["lead"])
    b.refresh()
    a.room("lobby").register("core/kai")            # b does not know kai yet
    assert b.room("lobby").send("core/juno", "core/kai", "welcome")["to"] == ["core/kai"]
    with pytest.raises(Refusal) as e:               # and a real refusal stays one
        b.room("lobby").send("core/juno", "core/nobody", "hello?")
    assert e.value.rule == "unknown-recipient"


def test_a_push_whose_answer_was_lost_is_applied_once(hub, url, tmp_path):
    h = client(url, tmp_path, "a", fresh=3600)
    for who in ("core/juno", "core/kai"):
        h.room("lobby").register(who)
    # The hub takes the push, then its receive-pack dies before it answers.
    hook = os.path.join(hub.path, "hooks", "reference-transaction")
    with open(hook, "w") as f:
        f.write(f"#!/bin/sh\n[ \"$1\" = committed ] && [ ! -e {tmp_path}/died ] && "
                f"touch {tmp_path}/died && kill -9 $PPID\nexit 0\n")
    os.chmod(hook, 0o755)
    # No answer: the client fetches, finds its commit on the hub, and says it landed.
    first = h.room("lobby").send("core/juno", "core/kai", "once", key="msg-1")
    landed = hub.store.room_tip("lobby")
    assert first["commit"] == landed and os.path.exists(tmp_path / "died")
    assert hub.store.reader.commit(landed).body.strip() == "once"
    again = h.room("lobby").send("core/juno", "core/kai", "once", key="msg-1")
    assert again.get("replayed") is True and again["commit"] == landed, (again, landed, hub.room("lobby").log(5))
    assert hub.store.room_tip("lobby") == landed


def test_a_push_cut_off_before_it_landed_is_made_again(hub, url, tmp_path):
    h = client(url, tmp_path, "a", fresh=3600)
    for who in ("core/juno", "core/kai"):
        h.room("lobby").register(who)
    before = hub.store.room_tip("lobby")
    # The hub's receive-pack dies once before it moves the ref: no answer, nothing landed.
    hook = os.path.join(hub.path, "hooks", "reference-transaction")
    with open(hook, "w") as f:
        f.write(f"#!/bin/sh\n[ \"$1\" = prepared ] && [ ! -e {tmp_path}/died ] && "
                f"touch {tmp_path}/died && kill -9 $PPID\nexit 0\n")
    os.chmod(hook, 0o755)
    sent = h.room("lobby").send("core/juno", "core/kai", "once")
    landed = hub.store.room_tip("lobby")
    assert os.path.exists(tmp_path / "died") and sent["commit"] == landed
    assert hub.store.reader.commit(landed).parent == before   # once, on the tip it had
    assert hub.store.reader.commit(landed).body.strip() == "once"


def test_ref_moves_belong_to_the_hub_machine(hub, url, tmp_path):
    h = client(url, tmp_path, "a")
    h.room("lobby").register("core/juno", ["lead"])
    for call in (lambda: h.archive_room("lobby", "hub/admin"),   # an open room: the operator's
                 lambda: h.destroy_room("lobby", "hub/admin"), lambda: h.reap()):
        with pytest.raises(UsageError) as e:
            call()
        assert "hub's machine" in e.value.fix
    assert hub.store.room_tip("lobby")


def test_unreachable_and_not_a_hub(tmp_path):
    with pytest.raises(Unreachable) as e:
        RemoteHub("file://" + str(tmp_path / "nowhere.git"), cache=str(tmp_path / "c"))
    assert e.value.rule == "unreachable" and e.value.exit_code == 7
    subprocess.run(["git", "init", "-q", "--bare", str(tmp_path / "plain.git")], check=True)
    with pytest.raises(NotFound):
        RemoteHub("file://" + str(tmp_path / "plain.git"), cache=str(tmp_path / "c"))


def test_parse_refusal_reads_the_hook_block():
    err = ("remote: gitdrop: refused by rule unread-before-send\x1b[K\n"
           "remote:   commit: 0123456789ab \"juno → kai: hi\"\n"
           "remote:   why: core/juno has 2 unread message(s)\n"
           "remote:   fix: read them first (gitdrop inbox)\n"
           "error: failed to push some refs to 'x'\n")
    r = parse_refusal(err)
    assert (r.rule, r.reason, r.fix) == ("unread-before-send", "core/juno has 2 unread message(s)",
                                         "read them first (gitdrop inbox)")
    assert r.commit.startswith("0123456789ab")
    assert parse_refusal("fatal: unable to access\n") is None


def test_public_url_hides_the_password():
    assert remote.public_url("https://core%2Fjuno:s3cret@h/hub.git") == "https://core%2Fjuno@h/hub.git"
    assert os.path.basename(remote.mirror_path("git://h/x", "/c")).endswith(".git")


def test_a_room_move_through_a_remote_hub_says_who_may_before_where(hub, url, tmp_path):
    """Archive, restore and destroy are the hub's machine's: through a URL, one who
    may not was told to run it there, and the CLI's destroy had a lead type the
    room's name before saying it could not be done at all."""
    from cli_helpers import Gitdrop
    hub.register_team("core", "core/juno", ["kai"])
    hub.create_room("hub/admin", "proj", teams=["core"])
    h = client(url, tmp_path, "a")
    for act in (lambda by: h.archive_room("proj", by), lambda by: h.destroy_room("proj", by)):
        with pytest.raises(Refusal) as e:
            act("core/kai")
        assert e.value.rule == "lead-only", e.value
        with pytest.raises(UsageError) as e:
            act("core/juno")
        assert "on the hub's machine" in e.value.fix, e.value
    hub.archive_room("proj", "core/juno")
    with pytest.raises(Refusal):
        client(url, tmp_path, "b").restore_room("proj", "core/kai")
    gd = Gitdrop(url, str(tmp_path / "home"), "core/juno")
    hub.restore_room("proj", "core/juno")
    r = gd("room", "destroy", "proj", "--yes", input="proj\n")
    assert r.rc == 2 and "through a remote hub" in r.err and "Type the room" not in r.err, r
    assert hub.store.tip("refs/heads/rooms/proj")
