"""Working while a remote hub is unreachable: a real git daemon on 127.0.0.1 is
stopped and started again. Writes are queued in the mirror (GITDROP_OFFLINE=queue),
reads come from it, and `gitdrop sync` sends the queue in order, each write rebased
onto the hub's tip and judged again; one refused is reported and left, the others
land, and later syncs skip it until --retry or --drop; a push the hub turns away
without a rule stops the sync with the rest still queued; a sync killed mid-way
loses and doubles nothing; a hub that accepts connections and never answers costs
GITDROP_REMOTE_TIMEOUT. Also: lost push races are retried with backoff until a
time budget, then a Conflict that says so."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from gitdrop import hub as hubmod
from gitdrop.errors import Conflict, NotFound, Refusal, UsageError
from gitdrop.transports import remote
from gitdrop.transports.remote import RemoteHub, Unreachable

from conftest import free_port, git

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Daemon:
    """git daemon serving one hub, stopped and started on the same port."""

    def __init__(self, base):
        self.base = str(base)
        self.hub = hubmod.init(os.path.join(self.base, "hub.git"))
        self.port = free_port()   # kept across a stop and a start: this run hands it out once
        self.url = f"git://127.0.0.1:{self.port}/hub.git"
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(
            ["git", "daemon", "--reuseaddr", "--listen=127.0.0.1", f"--port={self.port}",
             f"--base-path={self.base}", "--export-all", "--enable=receive-pack", self.base],
            start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("git daemon did not listen")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(10)


@pytest.fixture
def served(tmp_path):
    d = Daemon(tmp_path).start()
    room = d.hub.room("lobby")
    for who in ("core/juno", "core/spartan", "core/kai"):
        room.register(who, ["lead"] if who == "core/juno" else [])
    yield d
    d.stop()


def client(served, tmp_path, offline=True):
    return RemoteHub(served.url, cache=str(tmp_path / "cache"), fresh=0.0, offline=offline)


def texts(hub, who="core/kai"):
    return [m["text"] for m in hub.room("lobby").inbox(who, peek=True, limit=0)["messages"]
            if m["op"] == "send"]


def cli(served, tmp_path, *args, ok=True, env=None):
    e = dict(os.environ, GITDROP_CACHE=str(tmp_path / "cache"), GITDROP_REMOTE_FRESH="0",
             NO_COLOR="1", **(env or {}))
    p = subprocess.run([sys.executable, "-m", "gitdrop", "--hub", served.url, "--json", *args],
                       capture_output=True, text=True, cwd=ROOT, env=e)
    assert (p.returncode == 0) is ok, (p.returncode, p.stdout, p.stderr)
    return json.loads(p.stdout), p


def test_unreachable_without_offline_mode_says_how_to_queue(served, tmp_path):
    h = client(served, tmp_path, offline=False)
    served.stop()
    with pytest.raises(Unreachable) as e:
        h.room("lobby").send("core/juno", "core/kai", "lost?")
    assert "GITDROP_OFFLINE=queue" in e.value.fix
    assert h.store.queue.entries() == []


def test_writes_queue_offline_and_sync_in_order(served, tmp_path):
    h = client(served, tmp_path)
    tip = served.hub.store.room_tip("lobby")
    served.stop()
    lobby = h.room("lobby")
    assert lobby.send("core/spartan", "core/kai", "one")["commit"]
    assert lobby.send("core/spartan", "core/kai", "two")["commit"]
    assert [e["subject"] for e in h.store.take_queued()] == [
        s for s in [e["subject"] for e in h.store.queue.entries()]]
    assert len(h.store.queue.pending()) == 2
    assert texts(h) == ["one", "two"]                 # reads come from the mirror
    assert served.hub.store.room_tip("lobby") == tip  # nothing reached the hub
    served.start()
    served.hub.room("lobby").send("core/juno", "core/kai", "meanwhile")
    # a later write while the queue waits is queued too (the order is kept)
    h.room("lobby").send("core/spartan", "core/kai", "three")
    assert [e["id"] for e in h.store.take_queued()] == [3]
    assert texts(served.hub) == ["meanwhile"]
    r = h.store.sync()
    assert [e["id"] for e in r["synced"]] == [1, 2, 3] and r["refused"] == [] and not r["queued"]
    assert texts(served.hub) == ["meanwhile", "one", "two", "three"]
    assert [op for _, op in served.hub.verify("lobby")][-4:] == ["send"] * 4
    assert h.store.tip("refs/heads/rooms/lobby") == served.hub.store.room_tip("lobby")
    assert not [r for r in h.store.repo.references if r.startswith("refs/gitdrop/queue/")]
    # back online, with an empty queue: writes go straight to the hub
    h.room("lobby").send("core/spartan", "core/kai", "four")
    assert h.store.take_queued() == [] and texts(served.hub)[-1] == "four"


def test_a_team_and_a_room_made_offline_land_in_order(served, tmp_path):
    h = client(served, tmp_path)
    served.stop()
    h.register_team("core", "core/juno", ["core/kai"], by="core/juno")   # the hub branch
    h.create_room("core/juno", "dev", ["core"])                          # a new room branch
    h.room("dev").register("core/juno", ["lead"])
    assert [e["ref"] for e in h.store.take_queued()] == [
        "refs/heads/hub", "refs/heads/rooms/dev", "refs/heads/rooms/dev"]
    assert served.hub.team("core")["members"] == ["core/juno"]   # not yet on the hub
    served.start()
    r = h.store.sync()
    assert len(r["synced"]) == 3 and r["refused"] == []
    assert served.hub.team("core")["members"] == ["core/juno", "core/kai"]
    assert [op for _, op in served.hub.verify("dev")] == ["room-create", "register"]


def test_what_a_kill_while_queueing_leaves_is_harmless(served, tmp_path):
    """A queued write is a ref, then its file written whole (temporary file, rename):
    a process killed between the two, or while writing the file, leaves a ref
    without a file or a temporary file, and neither is sent nor blocks the queue."""
    h = client(served, tmp_path)
    served.stop()
    h.room("lobby").send("core/spartan", "core/kai", "kept")
    [entry] = h.store.queue.entries()
    import pygit2
    h.store.repo.references.create("refs/gitdrop/queue/00000002", pygit2.Oid(hex=entry["commit"]))
    with open(os.path.join(h.store.queue.dir, "00000003.json.tmp"), "w") as f:
        f.write('{"id": 3, "ref": "refs/heads/rooms/lo')
    assert [e["id"] for e in h.store.queue.entries()] == [1]
    assert h.store.queue.add("refs/heads/rooms/lobby", entry["commit"], "", "x", "y")["id"] == 3
    h.store.queue.remove(3)
    served.start()
    r = h.store.sync()
    assert [e["id"] for e in r["synced"]] == [1] and r["queued"] == []
    assert texts(served.hub) == ["kept"]
    assert not [n for n in h.store.repo.references if n.startswith("refs/gitdrop/queue/")]


def test_writers_killed_at_random_moments_lose_no_acknowledged_write(served, tmp_path):
    """Offline writers killed with SIGKILL at random moments: each write that was
    answered (exit 0, queued) reaches the hub once, in order; one that was not may
    or may not, but never twice; and the queue is never left in the way."""
    import random
    cli(served, tmp_path, "who")                      # the mirror, while the hub is up
    served.stop()
    env = dict(os.environ, GITDROP_CACHE=str(tmp_path / "cache"), GITDROP_OFFLINE="queue")
    acked, whole = [], 0.0
    rng = random.Random(7)
    for i in range(6):
        start = time.monotonic()
        p = subprocess.Popen([sys.executable, "-m", "gitdrop", "--hub", served.url, "send",
                              "core/kai", "-m", f"w{i}", "--as", "core/spartan"], cwd=ROOT,
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if i:   # the first runs whole: how long a write takes here; the others die within it
            time.sleep(rng.uniform(0.6, 1.0) * whole)
            if p.poll() is None:
                p.kill()
        p.wait(30)
        whole = whole or time.monotonic() - start
        if p.returncode == 0:
            acked.append(f"w{i}")
    served.start()
    r = RemoteHub(served.url, cache=str(tmp_path / "cache"), fresh=0.0).store.sync()
    assert r["refused"] == [] and r["queued"] == []
    got = texts(served.hub)
    assert len(got) == len(set(got)) and got == sorted(got)       # once each, in order
    assert set(acked) <= set(got) <= {f"w{i}" for i in range(6)}


def test_one_refused_at_sync_is_reported_and_left(served, tmp_path):
    tid = served.hub.room("lobby").create_task("core/juno", "the one task")["id"]
    h = client(served, tmp_path)
    served.stop()
    lobby = h.room("lobby")
    lobby.send("core/juno", "core/kai", "before")
    lobby.move_task("core/spartan", tid, "claim")     # accepted by the mirror's state
    lobby.send("core/juno", "core/kai", "after")
    assert [e["id"] for e in h.store.take_queued()] == [1, 2, 3]
    served.start()
    served.hub.room("lobby").move_task("core/kai", tid, "claim")   # kai got there first
    r = h.store.sync()
    assert [e["id"] for e in r["synced"]] == [1, 3]
    [refused] = r["refused"]
    assert refused["id"] == 2 and refused["refused"]["rule"] == "task-state-machine"
    assert "core/kai" in refused["refused"]["reason"] and refused["refused"]["commit"]
    assert texts(served.hub) == ["before", "after"]
    assert served.hub.room("lobby").task(tid)["assignee"] == "core/kai"
    # left for its owner: the status shows it, with the rule and how to drop it
    doc, p = cli(served, tmp_path, "status", "--as", "core/spartan")
    assert [e["id"] for e in doc["queue"]] == [2] and doc["queue"][0]["refused"]
    p = subprocess.run([sys.executable, "-m", "gitdrop", "--hub", served.url, "status"],
                       capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, GITDROP_CACHE=str(tmp_path / "cache")))
    assert "refused by rule task-state-machine" in p.stdout and "--drop 2" in p.stdout
    # a refused write does not hold the line: the next write goes straight in
    h.room("lobby").send("core/juno", "core/kai", "online")
    assert h.store.take_queued() == [] and texts(served.hub)[-1] == "online"
    # sync again: skipped, still refused (exit 3), then dropped
    doc, p = cli(served, tmp_path, "sync", ok=False)
    assert p.returncode == 3 and doc["refused"] == [] and doc["synced"] == []
    assert doc["skipped"][0]["refused"]["rule"] == "task-state-machine"
    doc, _ = cli(served, tmp_path, "sync", "--drop", "2")
    assert doc["dropped"]["id"] == 2 and doc["queued"] == []
    assert h.store.queue.entries() == []


def test_offline_needs_a_mirror_made_while_the_hub_was_up(served, tmp_path):
    served.stop()
    doc, p = cli(served, tmp_path, "send", "core/kai", "-m", "hello", "--as", "core/juno",
                 env={"GITDROP_OFFLINE": "queue"}, ok=False)
    assert p.returncode == 7 and doc["rule"] == "unreachable"


def test_the_cli_queues_and_syncs(served, tmp_path):
    cli(served, tmp_path, "who")                      # the mirror is made while the hub is up
    served.stop()
    env = {"GITDROP_OFFLINE": "queue"}
    doc, p = cli(served, tmp_path, "send", "core/kai", "-m", "from the train", "--as",
                 "core/juno", env=env)
    assert doc["queued"] is True and doc["queue_ids"] == [1] and "gitdrop sync" in doc["note"]
    p = subprocess.run([sys.executable, "-m", "gitdrop", "--hub", served.url, "send", "core/kai",
                        "-m", "still offline", "--as", "core/juno"], capture_output=True,
                       text=True, cwd=ROOT, env=dict(os.environ, GITDROP_CACHE=str(
                           tmp_path / "cache"), NO_COLOR="1"))
    assert p.returncode == 0 and "QUEUED, not yet on the hub" in p.stdout, p.stderr
    assert p.stdout.startswith("queued for core/kai"), p.stdout   # not "sent to"
    doc, _ = cli(served, tmp_path, "status", env=env)
    assert [e["id"] for e in doc["queue"]] == [1, 2] and doc["offline"] is True
    doc, p = cli(served, tmp_path, "sync", ok=False)
    assert doc["rule"] == "unreachable" and p.returncode == 7
    served.start()
    doc, _ = cli(served, tmp_path, "sync")
    assert [e["id"] for e in doc["synced"]] == [1, 2] and doc["queued"] == []
    assert texts(served.hub) == ["from the train", "still offline"]


def test_a_queue_is_found_however_the_hub_s_url_is_spelled(served, tmp_path):
    """The mirror, and the queue in it, was keyed by the URL as typed: a password
    changed while writes waited, or a trailing "/", opened another, empty mirror,
    whose status said every write was on the hub; the queued write was never sent."""
    cli(served, tmp_path, "who")
    served.stop()
    doc, _ = cli(served, tmp_path, "send", "core/kai", "-m", "queued one way", "--as",
                 "core/juno", env={"GITDROP_OFFLINE": "queue"})
    assert doc["queued"] is True
    served.start()
    other = type("Spelled", (), {"url": served.url + "/"})()
    doc, _ = cli(other, tmp_path, "status")
    assert [e["id"] for e in doc["queue"]] == [1], doc
    doc, _ = cli(other, tmp_path, "sync")
    assert [e["id"] for e in doc["synced"]] == [1]
    assert texts(served.hub) == ["queued one way"]
    # a password is no part of which mirror it is, and never shown
    cache = str(tmp_path / "c2")
    a = remote.mirror_path("https://core%2Fjuno:old@h/hub.git", cache)
    assert a == remote.mirror_path("https://core%2Fjuno:new@h/hub.git/", cache)
    assert a != remote.mirror_path("https://core%2Fkai:old@h/hub.git", cache)
    # a mirror made under the old key (the URL as typed) is moved to the new one
    import hashlib
    typed = "https://core%2Fjuno:old@h2/hub.git"
    old = os.path.join(cache, hashlib.sha256(typed.encode()).hexdigest()[:16] + ".git")
    os.makedirs(os.path.join(old, "gitdrop-queue"))
    new = remote.mirror_path(typed, cache)
    assert new != old and os.path.isdir(os.path.join(new, "gitdrop-queue"))
    assert not os.path.exists(old)


def test_queued_writes_that_name_an_earlier_one_follow_it_to_where_it_landed(served,
                                                                            tmp_path):
    """Two agents on one machine, offline: kai read juno's queued message (its cursor:
    that commit) and replied to it. At sync juno's message was rebased onto what the
    hub had meanwhile, under a new id, and kai's read was refused for ever (the cursor
    named a commit the hub never had), and so was every send of kai's after it; the
    reply named a commit the hub never had. They now name the commit it landed as."""
    h = client(served, tmp_path)
    h.room("lobby").who()
    served.stop()
    room = h.room("lobby")
    sent = room.send("core/juno", "core/kai", "ping from the train")
    got = room.inbox("core/kai")["messages"]
    assert [m["text"] for m in got] == ["ping from the train"]
    room.send("core/kai", "core/juno", "pong", reply_to=sent["commit"])
    assert [e["id"] for e in h.store.queue.entries()] == [1, 2, 3]
    served.start()
    served.hub.room("lobby").set_status("core/spartan", "on the hub")   # it moved on
    out = h.store.sync()
    assert [e["id"] for e in out["synced"]] == [1, 2, 3], out
    assert out["refused"] == [] and out["queued"] == []
    hub_room = served.hub.room("lobby")
    landed = [m for m in hub_room.history(n=10) if m["text"] == "ping from the train"]
    assert len(landed) == 1 and landed[0]["id"] != sent["commit"]
    assert hub_room.inbox("core/kai", peek=True)["unread"] == 0   # the read landed
    pong = [m for m in hub_room.history(n=10) if m["text"] == "pong"][0]
    from gitdrop import fmt
    said = fmt.trailer(served.hub.store.reader.commit(pong["id"]).trailers, "reply-to")
    assert said == landed[0]["id"], (said, pong)
    # and kai, nothing unread, sends on
    hub_room.send("core/kai", "core/juno", "after the sync")


def test_a_burst_the_loop_guard_holds_back_waits_in_line_for_the_next_sync(served,
                                                                          tmp_path,
                                                                          monkeypatch):
    """Sync sends the queue at once, each write dated now: past the room's loop cap the
    hub refused the rest, and each was marked refused, to be retried by hand one a
    sync, landing out of order. Now the sync stops there, and the next one, once the
    window has passed, sends the rest in order."""
    served.hub.room_settings("lobby", "hub/admin", {"loop_cap": 2, "loop_window": 3})
    h = client(served, tmp_path)
    h.room("lobby").who()
    served.stop()
    for i in range(4):   # queued at the pace the room allows
        if i == 2:
            time.sleep(3.2)
        h.room("lobby").send("core/juno", "core/kai", f"m{i}")
    monkeypatch.setattr(remote, "REDATE_AFTER", 0)   # queued long ago: all dated now
    served.start()
    with pytest.raises(remote.SyncStopped) as e:
        h.store.sync()
    assert e.value.rule == "loop-guard" and "sync again" in e.value.fix, e.value
    assert [x["id"] for x in e.value.synced] == [1, 2]
    left = h.store.queue.entries()
    assert [x["id"] for x in left] == [3, 4] and not any(x.get("refused") for x in left)
    time.sleep(3.5)
    out = h.store.sync()
    assert [x["id"] for x in out["synced"]] == [3, 4] and out["queued"] == []
    assert texts(served.hub) == ["m0", "m1", "m2", "m3"]


def _sync_killed_after(served, tmp_path, pushes: int) -> None:
    """`gitdrop sync`, killed by the hub right after it took push number `pushes`:
    the write landed, the sync never heard so."""
    pidfile, count = tmp_path / "sync.pid", tmp_path / "count"
    hook = os.path.join(served.hub.path, "hooks", "reference-transaction")
    with open(hook, "w") as f:
        f.write(f"#!/bin/sh\n[ \"$1\" = committed ] || exit 0\necho x >> {count}\n"
                f"[ $(wc -l < {count}) -eq {pushes} ] && kill -9 $(cat {pidfile})\n"
                "exit 0\n")
    os.chmod(hook, 0o755)
    p = subprocess.Popen([sys.executable, "-m", "gitdrop", "--hub", served.url, "sync"],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=dict(os.environ, GITDROP_CACHE=str(tmp_path / "cache")))
    pidfile.write_text(str(p.pid))
    out, err = p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL, (out, err)
    os.unlink(hook)


@pytest.mark.parametrize("kill_after", [1, 3])
def test_a_sync_killed_midway_loses_and_doubles_nothing(served, tmp_path, kill_after):
    h = client(served, tmp_path)
    served.stop()
    sent = [f"m{i}" for i in range(5)]
    for t in sent:
        h.room("lobby").send("core/juno", "core/kai", t)
    served.start()
    _sync_killed_after(served, tmp_path, kill_after)
    assert texts(served.hub) == sent[:kill_after]
    r = RemoteHub(served.url, cache=str(tmp_path / "cache"), fresh=0.0).store.sync()
    assert r["refused"] == [] and r["queued"] == []
    assert texts(served.hub) == sent                   # each once, in order
    git("fsck", "--no-progress", cwd=served.hub.path)


def test_a_sync_killed_after_a_rebased_write_landed_still_names_it_anew(served, tmp_path):
    """A queued write the hub took under another id (built again on what the hub had
    meanwhile), and the sync killed before it noted so: the next sync found it on
    the hub and dropped it, unnoted, and the writes queued after it went on naming the
    id it was queued under (a read cursor the hub has no commit for)."""
    h = client(served, tmp_path)
    h.room("lobby").inbox("core/kai")
    h.room("lobby").inbox("core/spartan")
    served.stop()
    h.room("lobby").send("core/spartan", "core/kai", "queued")
    h.room("lobby").inbox("core/kai")              # its cursor: the queued send's id
    queued = h.room("lobby").view().agent("core/kai")["cursor"]
    served.hub.room("lobby").register("core/ada")   # the hub moves on meanwhile
    served.start()
    _sync_killed_after(served, tmp_path, 1)       # the send landed, under a new id
    r = RemoteHub(served.url, cache=str(tmp_path / "cache"), fresh=0.0).store.sync()
    assert r["refused"] == [] and r["queued"] == [], json.dumps(r["refused"])
    room = served.hub.room("lobby")
    assert [m["text"] for m in room.history(10)] == ["queued"]   # once
    assert texts(served.hub) == []               # and read by kai
    cursor = room.view().agent("core/kai")["cursor"]
    assert cursor != queued   # named by the id it landed as
    assert served.hub.store.reader.commit(cursor).subject.startswith("spartan → kai")
    git("fsck", "--no-progress", cwd=served.hub.path)


def test_racing_writers_on_their_own_mirrors_all_land(served, tmp_path):
    """Three machines send at once: git rejects the pushes that lost, each is redone
    on the fetched tip after a jittered pause, and every message lands once."""
    import threading
    for who in ("core/ada", "core/zed"):
        served.hub.room("lobby").register(who)
    senders = ("core/spartan", "core/kai", "core/ada")
    hubs = [RemoteHub(served.url, cache=str(tmp_path / f"m{i}"), fresh=0.0, offline=False)
            for i in range(3)]
    errors, go = [], threading.Barrier(3)

    def run(h, who):
        try:
            go.wait()
            for i in range(3):
                h.room("lobby").send(who, "core/zed", f"{who} {i}")
        except Exception as e:   # reported below
            errors.append(e)
    threads = [threading.Thread(target=run, args=a) for a in zip(hubs, senders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    got = texts(served.hub, "core/zed")
    assert sorted(got) == sorted(f"{w} {i}" for w in senders for i in range(3))
    for w in senders:   # each sender's own messages in the order it sent them
        assert [t for t in got if t.startswith(w)] == [f"{w} {i}" for i in range(3)]
    assert sum(h.store.lost_races for h in hubs) >= 1
    assert [op for _, op in served.hub.verify("lobby")][-9:] == ["send"] * 9


def test_lost_races_back_off_then_conflict(served, tmp_path, monkeypatch):
    h = client(served, tmp_path, offline=False)
    monkeypatch.setattr(remote, "RACE_SECONDS", 1.0)
    monkeypatch.setattr(remote, "RACE_TRIES", 3)
    # git reports every push as lost to another writer (rejected, fetch first)
    monkeypatch.setattr(h.store, "_push", lambda ref, new: (
        "stale", " ! [rejected] x -> x (fetch first)"))
    start = time.monotonic()
    with pytest.raises(Conflict) as e:
        h.room("lobby").send("core/juno", "core/kai", "never")
    spent = time.monotonic() - start
    assert 0.9 <= spent < 5
    tries = h.store.lost_races
    assert tries >= 3 and f"{tries} pushes lost the race" in e.value.reason
    assert "again" in e.value.fix and e.value.exit_code == 6
    assert 0 < h.store.backoff <= spent
    # the mirror holds the hub's tip again, and the hub has nothing of it
    assert h.store.tip("refs/heads/rooms/lobby") == served.hub.store.room_tip("lobby")
    assert texts(served.hub) == []
    monkeypatch.undo()
    h.room("lobby").send("core/juno", "core/kai", "now")   # the budget is per write
    assert texts(served.hub) == ["now"]


def test_the_mcp_answer_says_queued(served, tmp_path, monkeypatch):
    from gitdrop.mcp.server import ToolCalls
    from gitdrop.mcp.tools import ToolBox
    monkeypatch.setenv("GITDROP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GITDROP_OFFLINE", "queue")
    calls = ToolCalls(ToolBox(served.url, "lobby", "core/spartan"), ["send"])
    served.stop()
    out = calls.call("send", {"to_agent": "kai", "message": "from the MCP server"})
    doc = out["structuredContent"]
    assert not out.get("isError") and doc["queued"] is True and "gitdrop sync" in doc["note"]
    assert '"queued":true' in out["content"][0]["text"]
    served.start()
    out = calls.call("send", {"to_agent": "kai", "message": "second"})
    assert out["structuredContent"]["queued"] is True      # behind the first
    assert RemoteHub(served.url, cache=str(tmp_path / "cache")).store.sync()["queued"] == []
    assert texts(served.hub) == ["from the MCP server", "second"]


def test_a_write_rebuilt_after_lost_races_is_dated_when_built(served, tmp_path, monkeypatch):
    """Lost races can last seconds on a busy server: each rebuild dates the commit
    anew, so the hub's clock rule (clock_skew) never refuses a write for its wait."""
    h = client(served, tmp_path, offline=False)
    real, lost = h.store._push, []

    def slow_race(ref, new):
        if len(lost) < 3:
            lost.append(new)
            time.sleep(0.8)   # a push that takes a while, and loses
            return "stale", " ! [rejected] x -> x (fetch first)"
        return real(ref, new)
    monkeypatch.setattr(h.store, "_push", slow_race)
    began = int(time.time())
    sent = h.room("lobby").send("core/juno", "core/kai", "late")
    assert len(lost) == 3 and texts(served.hub) == ["late"]
    assert served.hub.store.reader.commit(sent["commit"]).time >= began + 2


def test_a_garbage_or_lying_queue_file_is_set_aside_and_the_rest_syncs(served, tmp_path,
                                                                       capfd):
    h = client(served, tmp_path)
    served.stop()
    lobby = h.room("lobby")
    lobby.send("core/spartan", "core/kai", "kept")
    qdir = h.store.queue.dir
    with open(os.path.join(qdir, "00000007.json"), "w") as f:
        f.write("{not json")
    first = json.load(open(os.path.join(qdir, "00000001.json")))
    lies = [dict(first, id=3), dict(first, ref="refs/heads/*"),    # not its name, no room
            # fields of the wrong kind gave tracebacks in status and sync
            dict(first, queued="yesterday"), dict(first, refused="x"),
            dict(first, pushing=12345), dict(first, queued=True)]
    for n, lie in enumerate(lies, 8):
        with open(os.path.join(qdir, f"{n:08d}.json"), "w") as f:
            json.dump(dict(lie, id=lie["id"] if lie["id"] == 3 else n), f)
    # a folder or a FIFO there gave a traceback, or hung every command on the hub
    os.mkdir(os.path.join(qdir, "00000014.json"))
    os.mkfifo(os.path.join(qdir, "00000015.json"))
    # a link at the temporary name the next write used had it write through the link
    target = tmp_path / "precious"
    target.write_text("mine")
    for n in range(2, 30):
        os.symlink(target, os.path.join(qdir, f"{n:08d}.json.tmp"))
    assert [e["id"] for e in h.store.queue.entries()] == [1]
    assert sorted(n for n in os.listdir(qdir) if n.endswith(".bad")) == [
        f"{n:08d}.json.bad" for n in range(7, 16)]
    assert "set aside" in capfd.readouterr().err
    lobby.send("core/spartan", "core/kai", "kept too")
    assert target.read_text() == "mine"
    assert [e["id"] for e in h.store.queue.entries()] == [1, 2]
    served.start()
    r = h.store.sync()
    assert [e["id"] for e in r["synced"]] == [1, 2] and not r["queued"]
    assert texts(served.hub) == ["kept", "kept too"]


def test_a_write_queued_a_while_ago_is_redated_at_sync(served, tmp_path, monkeypatch):
    """The hub takes commits dated within clock_skew (30 s) of its clock: a write
    queued a minute before the sync is dated anew, even on an unchanged tip."""
    h = client(served, tmp_path)
    served.stop()
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - 45)
    h.room("lobby").send("core/spartan", "core/kai", "from before")
    monkeypatch.setattr(time, "time", real)
    served.start()
    r = h.store.sync()
    assert [e["id"] for e in r["synced"]] == [1] and r["refused"] == [], r
    assert texts(served.hub) == ["from before"]


def test_a_push_that_times_out_is_queued_not_left_in_the_mirror(served, tmp_path,
                                                                monkeypatch):
    h = client(served, tmp_path)
    real = h.store._git

    def timing_out(*args):
        if args[0] == "push":
            raise Unreachable("git push timed out", "check the network")
        return real(*args)
    monkeypatch.setattr(h.store, "_git", timing_out)
    h.room("lobby").send("core/spartan", "core/kai", "during timeout")
    assert [e["subject"] for e in h.store.queue.pending()][0].endswith("during timeout")
    monkeypatch.undo()
    h.store.sync()
    assert texts(served.hub) == ["during timeout"]


def ours(hub):
    """The messages the tests below send to the lead, in the hub's order."""
    return [t for t in texts(hub, "core/juno") if len(t) == 1]


def test_a_refused_write_is_skipped_until_retried_and_then_lands_last(served, tmp_path):
    """Refused at a sync, a write is not tried again by later syncs: once the state
    changed it would land after the writes queued behind it, out of order, without
    anyone deciding so. gitdrop sync --retry ID sends it, after the others."""
    h = client(served, tmp_path)
    served.stop()
    h.room("lobby").send("core/spartan", "core/juno", "A")   # #1
    h.room("lobby").send("core/kai", "core/juno", "B")      # #2
    served.start()
    served.hub.room("lobby").send("core/kai", "core/spartan", "read me first")
    r = h.store.sync()
    assert [e["id"] for e in r["synced"]] == [2]
    assert [e["refused"]["rule"] for e in r["refused"]] == ["unread-before-send"]
    served.hub.room("lobby").inbox("core/spartan")   # spartan reads, elsewhere: A would pass
    doc, p = cli(served, tmp_path, "sync", ok=False)
    assert p.returncode == 3 and doc["synced"] == [] and doc["refused"] == []
    assert [e["id"] for e in doc["skipped"]] == [1]
    assert ours(served.hub) == ["B"]                      # A was not sent behind B's back
    p = subprocess.run([sys.executable, "-m", "gitdrop", "--hub", served.url, "sync"],
                       capture_output=True, text=True, cwd=ROOT, env=dict(
                           os.environ, GITDROP_CACHE=str(tmp_path / "cache"), NO_COLOR="1"))
    assert p.returncode == 3 and "refused at an earlier sync, not sent again" in p.stdout
    assert "gitdrop sync --retry 1" in p.stdout and "--drop 1" in p.stdout
    assert ours(served.hub) == ["B"]
    p = subprocess.run([sys.executable, "-m", "gitdrop", "--hub", served.url, "sync",
                        "--retry", "1"], capture_output=True, text=True, cwd=ROOT, env=dict(
                            os.environ, GITDROP_CACHE=str(tmp_path / "cache"), NO_COLOR="1"))
    assert p.returncode == 0 and "sent #1" in p.stdout, (p.stdout, p.stderr)
    assert "after the writes queued behind it" in p.stdout
    assert ours(served.hub) == ["B", "A"] and h.store.queue.entries() == []
    doc, p = cli(served, tmp_path, "sync", "--retry", "1", ok=False)
    assert p.returncode == 4 and re.search(r"gitdrop (--hub \S+ )?status", doc["fix"])   # nothing to retry now


def test_retry_sends_the_refused_one_after_the_pending_ones(served, tmp_path):
    h = client(served, tmp_path)
    served.stop()
    h.room("lobby").send("core/spartan", "core/juno", "A")   # #1, refused below
    served.start()
    served.hub.room("lobby").send("core/kai", "core/spartan", "read me first")
    assert h.store.sync()["refused"][0]["id"] == 1
    served.hub.room("lobby").inbox("core/spartan")
    served.stop()
    h.room("lobby").send("core/kai", "core/juno", "C")      # #2, queued after
    served.start()
    with pytest.raises(UsageError):                       # #2 was never refused
        h.store.sync(retry=2)
    r = h.store.sync(retry=1)
    assert [e["id"] for e in r["synced"]] == [2, 1] and r["retried"] == 1
    assert ours(served.hub) == ["C", "A"]


HOOK_FAILS = {
    # gitdrop's own hook, crashed: its words, but no rule's verdict on the write
    "crashed": ("hub-rejected", 'echo "gitdrop: the hook failed (KeyError: x); push '
                'refused" >&2; exit 1'),
    # another hook of the server (a permission check) says no, in its own words
    "permission": ("hub-rejected", 'echo "access denied: core/juno may not push here" >&2; '
                   "exit 1"),
    # the connection goes down while the hub is taking the push
    "dropped": ("unreachable", "kill -9 $PPID; exit 1"),
}


@pytest.mark.parametrize("how", sorted(HOOK_FAILS))
def test_a_push_the_hub_turns_away_without_a_rule_stops_the_sync(served, tmp_path, how):
    """Not a rule's refusal, so nothing to mark refused: the sync stops at that write,
    it and the ones after stay pending in order, and the answer says what to do."""
    rule, body = HOOK_FAILS[how]
    h = client(served, tmp_path)
    served.stop()
    for t in ("m1", "m2", "m3"):
        h.room("lobby").send("core/juno", "core/kai", t)
    served.start()
    hook = os.path.join(served.hub.path, "hooks", "pre-receive")
    os.rename(hook, hook + ".real")
    count = tmp_path / "count"
    with open(hook, "w") as f:   # the second push fails; the others go to the real hook
        f.write(f"#!/bin/sh\necho x >> {count}\nif [ $(wc -l < {count}) -eq 2 ]; then "
                f"{body}; fi\nexec {hook}.real\n")
    os.chmod(hook, 0o755)
    if how == "crashed" or how == "dropped":
        with pytest.raises(remote.SyncStopped) as e:
            h.store.sync()
        err = e.value
    else:   # the command line: exit 7, the error with what was sent and what waits
        doc, p = cli(served, tmp_path, "sync", ok=False)
        assert p.returncode == 7, p.stderr
        assert "access denied" in doc["reason"] and "access denied" in p.stderr
        err = remote.SyncStopped(doc["rule"], doc["reason"], doc["fix"], doc["synced"],
                                 doc["queued"])
    assert err.rule == rule and "#2" in err.reason and "1 write(s) after it" in err.reason
    assert re.search(r"gitdrop (--hub \S+ )?sync again", err.fix), err.fix
    assert [e["id"] for e in err.synced] == [1]
    assert [(e["id"], e["refused"]) for e in err.queued] == [(2, None), (3, None)]
    assert texts(served.hub) == ["m1"]
    os.rename(hook + ".real", hook)
    r = h.store.sync()
    assert [e["id"] for e in r["synced"]] == [2, 3] and r["refused"] == []
    assert texts(served.hub) == ["m1", "m2", "m3"]


def test_one_function_words_the_queued_answer_for_both_faces(served, tmp_path,
                                                              monkeypatch):
    """The CLI and the MCP server add the same fields, from RemoteStore.queued_answer;
    the MCP server's note does not tell an agent with no shell to run a command."""
    import re
    from gitdrop.mcp.server import ToolCalls
    from gitdrop.mcp.tools import ToolBox
    src = os.path.join(ROOT, "gitdrop")
    wording = [os.path.relpath(os.path.join(d, n), src) for d, _, names in os.walk(src)
               for n in names if n.endswith(".py") and "not yet on the hub" in
               open(os.path.join(d, n)).read()]
    assert wording == ["transports/remote.py"]
    cli(served, tmp_path, "who")
    monkeypatch.setenv("GITDROP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GITDROP_OFFLINE", "queue")
    calls = ToolCalls(ToolBox(served.url, "lobby", "core/spartan"), ["send"])
    served.stop()
    mcp = calls.call("send", {"to_agent": "kai", "message": "via MCP"})["structuredContent"]
    doc, _ = cli(served, tmp_path, "send", "core/kai", "-m", "via CLI", "--as",
                 "core/spartan", env={"GITDROP_OFFLINE": "queue"})
    assert mcp["queued"] is True and doc["queued"] is True
    assert mcp["queue_ids"] == [1] and doc["queue_ids"] == [2]
    first = re.compile(r"^QUEUED, not yet on the hub: .*? the hub has not judged it\. ")
    assert first.match(mcp["note"]) and first.match(doc["note"])
    assert "Send the queue with gitdrop sync" in doc["note"]
    assert "when gitdrop sync runs on the machine this server runs on" in mcp["note"]
    assert "nothing to do here" in mcp["note"] and not re.search(r"\bRun gitdrop", mcp["note"])


class Silent:
    """A TCP server on 127.0.0.1 that accepts connections and never says a word."""

    def __init__(self, port=0):
        import threading
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.held = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while True:
            try:
                self.held.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self):
        # shutdown wakes the accept() under way (close alone leaves it listening)
        self.sock.shutdown(socket.SHUT_RDWR)
        self.thread.join(10)
        self.sock.close()
        for c in self.held:
            c.close()


def test_a_hub_that_accepts_and_never_answers_costs_the_timeout_not_minutes(
        served, tmp_path, monkeypatch):
    cli(served, tmp_path, "who")            # the mirror, while the hub is up
    served.stop()
    silent = Silent(served.port)            # the hub's port now answers nothing
    env = dict(os.environ, GITDROP_CACHE=str(tmp_path / "cache"), GITDROP_REMOTE_TIMEOUT="1",
               NO_COLOR="1")

    def run(*args, **extra):
        start = time.monotonic()
        p = subprocess.run([sys.executable, "-m", "gitdrop", "--hub", served.url, "--json",
                            *args], capture_output=True, text=True, cwd=ROOT, timeout=60,
                           env=dict(env, **extra))
        return json.loads(p.stdout), p, time.monotonic() - start
    try:
        doc, p, spent = run("who")
        assert p.returncode == 7 and doc["rule"] == "unreachable", p.stderr
        assert "sent nothing for 1 s" in doc["reason"] and \
            "GITDROP_REMOTE_TIMEOUT" in doc["reason"] + doc["fix"]
        assert spent < 8, spent
        # working offline: the write is queued after one timeout, not two
        doc, p, spent = run("send", "core/kai", "-m", "into the void", "--as", "core/juno",
                            GITDROP_OFFLINE="queue")
        assert p.returncode == 0 and doc["queued"] is True, p.stderr
        assert spent < 8, spent
        # a client with no mirror yet, over HTTP: the same bound
        other = Silent()
        monkeypatch.setenv("GITDROP_REMOTE_TIMEOUT", "1")
        try:
            start = time.monotonic()
            with pytest.raises(Unreachable) as e:
                RemoteHub(f"http://127.0.0.1:{other.port}/hub.git",
                          cache=str(tmp_path / "fresh"), offline=False, fresh=0.0)
            assert time.monotonic() - start < 6 and "sent nothing" in e.value.reason
        finally:
            other.close()
    finally:
        silent.close()
    served.start()
    assert h_sync(served, tmp_path)["synced"][0]["subject"].endswith("into the void")


def test_a_busy_hub_that_answered_is_waited_on_past_the_timeout(served, tmp_path,
                                                                  monkeypatch):
    """A hook that checks a push for longer than GITDROP_REMOTE_TIMEOUT (a loaded
    hub) is not taken for a dead one: once the hub has answered, git may wait BUSY
    times the timeout without a byte."""
    monkeypatch.setenv("GITDROP_REMOTE_TIMEOUT", "1")
    h = client(served, tmp_path, offline=False)
    hook = os.path.join(served.hub.path, "hooks", "pre-receive")
    os.rename(hook, hook + ".real")
    with open(hook, "w") as f:
        f.write(f"#!/bin/sh\nsleep 2.5\nexec {hook}.real\n")
    os.chmod(hook, 0o755)
    h.room("lobby").send("core/juno", "core/kai", "slowly")
    assert texts(served.hub) == ["slowly"] and h.store.take_queued() == []


def _hook(served, body: str) -> None:
    """Put `body` (sh) in place of the served hub's pre-receive hook."""
    hook = os.path.join(served.hub.path, "hooks", "pre-receive")
    with open(hook, "w") as f:
        f.write("#!/bin/sh\n" + body)
    os.chmod(hook, 0o755)


def test_a_hub_that_trickles_bytes_is_not_waited_on_for_ever(served, tmp_path, monkeypatch):
    """A byte now and then resets the silence limit: a hub doing so held a client,
    and the mirror's lock, as long as it liked. One git command may take WHOLE
    times the timeout in all."""
    from gitdrop.transports import remote
    monkeypatch.setenv("GITDROP_REMOTE_TIMEOUT", "0.2")
    # over file:// the hook's bytes reach git push as they come (a daemon may buffer)
    h = RemoteHub("file://" + served.hub.path, cache=str(tmp_path / "cache"), fresh=0.0,
                  offline=False)
    _hook(served, "while true; do echo . >&2; sleep 0.1; done\n")
    start = time.monotonic()
    with pytest.raises(Unreachable) as e:
        h.room("lobby").send("core/juno", "core/kai", "never lands")
    spent = time.monotonic() - start
    assert f"still ran after {0.2 * remote.WHOLE:g} s" in e.value.reason, e.value.reason
    assert spent < 0.2 * remote.WHOLE * 3, spent
    assert texts(served.hub) == []


def test_a_hubs_refusal_is_shown_as_its_words_not_as_terminal_commands(served, tmp_path,
                                                                      monkeypatch):
    """A hub given as a URL writes what it likes in its refusal: escapes that retitle
    the terminal or erase lines reach the person as text."""
    h = client(served, tmp_path, offline=False)
    _hook(served, "printf 'gitdrop: refused by rule x\\033[2J\\n  why: \\033]0;pwned\\007"
          "all good\\n  fix: \\033[1Arun this\\n' >&2; exit 1\n")
    with pytest.raises(Refusal) as e:
        h.room("lobby").send("core/juno", "core/kai", "refused")
    text = e.value.rule + e.value.reason + e.value.fix
    assert "\x1b" not in text and "\x07" not in text, repr(text)
    assert "\\x1b]0;pwned\\x07all good" in e.value.reason and "\\x1b[1Arun" in e.value.fix


def h_sync(served, tmp_path):
    return RemoteHub(served.url, cache=str(tmp_path / "cache"), fresh=0.0).store.sync()


def test_sync_judges_a_room_write_by_the_hubs_team_registry(served, tmp_path):
    """At sync a room write is judged by the team registry of the hub's branch as
    just fetched, with what this sync sent to it, not by the mirror's branch."""
    served.hub.register_team("core", "core/juno", ["core/kai"], by="core/juno")
    h = client(served, tmp_path)
    served.stop()
    # A room made for team core (lead juno), then core's lead handed to kai, both
    # offline: the room goes first, while the hub's registry still says juno (the
    # mirror's branch already says kai).
    h.create_room("core/juno", "dev", ["core"])                           # #1
    h.register_team("core", "core/kai", ["core/juno"], by="core/juno")    # #2, the hub
    # #3, #4: juno hands its lead in the rooms to kai (the lobby's and dev's)
    assert [e["ref"] for e in h.store.take_queued()] == [
        "refs/heads/rooms/dev", "refs/heads/hub", "refs/heads/rooms/dev",
        "refs/heads/rooms/lobby"]
    served.start()
    r = h.store.sync()
    assert r["refused"] == [] and [e["id"] for e in r["synced"]] == [1, 2, 3, 4], r["refused"]
    assert served.hub.team("core")["lead"] == "core/kai"
    # Now kai makes a room for core offline, while on the hub the lead goes back to
    # juno: the registry the sync fetched refuses it here, before any push.
    served.stop()
    h.create_room("core/kai", "ops", ["core"])
    served.start()
    served.hub.register_team("core", "core/juno", ["core/kai"], by="core/kai")
    r = h.store.sync()
    [refused] = r["refused"]
    assert refused["refused"]["rule"] == "lead-only"
    assert "registry says core/juno" in refused["refused"]["reason"]
    assert refused["refused"]["commit"] == f"#{refused['id']} \"{refused['subject']}\""
    assert refused["pushing"] == ""        # judged here: never sent
    assert "refs/heads/rooms/ops" not in served.hub.store.repo.references


def test_a_hub_serving_what_the_rules_refuse_is_said_so_not_a_traceback(tmp_path):
    """A hub given as a URL may run without gitdrop's hook: a room.toml whose leads
    is no table ended who, inbox and status in a traceback."""
    path = str(tmp_path / "evil.git")
    h = hubmod.init(path)
    h.room("lobby").register("core/juno", ["lead"])
    os.remove(os.path.join(path, "hooks", "pre-receive"))   # a server without the hook
    work = str(tmp_path / "w")
    subprocess.run(["git", "clone", "-q", "-b", "rooms/lobby", path, work], check=True)
    with open(os.path.join(work, "room.toml")) as f:
        text = f.read()
    with open(os.path.join(work, "room.toml"), "w") as f:
        f.write(text.replace("[leads]", 'leads = "x"\n[other]'))
    for args in (["add", "-A"], ["-c", "user.name=core/juno", "-c", "user.email=j@x",
                                 "commit", "-qm", "odd"], ["push", "-q", "origin",
                                                          "HEAD:rooms/lobby"]):
        subprocess.run(["git", *args], cwd=work, check=True)
    env = dict(os.environ, GITDROP_CACHE=str(tmp_path / "cache"), NO_COLOR="1")
    for args in (["who"], ["inbox", "--as", "core/juno"]):
        p = subprocess.run([sys.executable, "-m", "gitdrop", "--hub", "file://" + path, "--json",
                            *args], capture_output=True, text=True, cwd=ROOT, env=env,
                           timeout=60)
        assert p.returncode == 8 and "Traceback" not in p.stderr, p.stderr
        doc = json.loads(p.stdout)
        assert doc["rule"] == "damaged" and "gitdrop verify" in doc["fix"], doc


def test_a_sync_whose_push_runs_out_of_time_stops_and_tries_no_more(served, tmp_path,
                                                                  monkeypatch):
    """A push that ran out of time while the hub still talked was taken by sync for a
    lost race and pushed again, 12 times over (20 minutes each by default), holding
    the mirror's lock, and ended in a wrong "conflict". It stops the sync now, the
    write still queued, as a hub that does not answer does."""
    from gitdrop.transports import remote
    monkeypatch.setenv("GITDROP_REMOTE_TIMEOUT", "0.2")
    h = RemoteHub("file://" + served.hub.path, cache=str(tmp_path / "cache"), fresh=0.0,
                  offline=True)
    h.room("lobby").who()
    log = tmp_path / "pushes"
    _hook(served, f"echo push >> '{log}'; while true; do echo . >&2; sleep 0.1; done\n")
    h.room("lobby").send("core/juno", "core/kai", "slow to land")
    assert [x["id"] for x in h.store.queue.entries()] == [1]   # it ran out of time: queued
    log.unlink()
    start = time.monotonic()
    with pytest.raises(remote.SyncStopped) as e:
        h.store.sync()
    assert e.value.rule == "unreachable" and "in the time allowed" in e.value.reason
    assert log.read_text().split() == ["push"]   # one push, not a dozen
    assert time.monotonic() - start < 0.2 * remote.WHOLE * 3
    assert [x["id"] for x in h.store.queue.entries()] == [1]


def test_a_hub_that_says_a_great_deal_costs_the_client_little_memory(served, tmp_path):
    """The client kept all of git's stderr (what the hub's hook says) in memory: 300 MB
    from a hostile or broken hub took it to 2.3 GB. It keeps the end of it, where a
    refusal is."""
    cli(served, tmp_path, "who")
    served.stop()
    cli(served, tmp_path, "send", "core/kai", "-m", "queued", "--as", "core/juno",
        env={"GITDROP_OFFLINE": "queue"})
    served.start()
    _hook(served, "yes 'remote noise remote noise remote noise' | head -c 120M >&2\n"
          "printf 'gitdrop: refused by rule format\\n  commit: x\\n  why: too noisy\\n"
          "  fix: say less\\n' >&2; exit 1\n")
    e = dict(os.environ, GITDROP_CACHE=str(tmp_path / "cache"), GITDROP_REMOTE_FRESH="0",
             NO_COLOR="1")
    # its peak memory as /proc says it at exit (wait4's ru_maxrss counts from the
    # fork: the test process's own)
    peak = ("import atexit, sys\n"
            "atexit.register(lambda: sys.stderr.write(open('/proc/self/status').read()))\n"
            "from gitdrop.cli.main import main\n"
            "sys.argv = ['gitdrop'] + sys.argv[1:]\nmain()\n")
    p = subprocess.run([sys.executable, "-c", peak, "--hub", served.url, "--json", "sync"],
                       capture_output=True, text=True, cwd=ROOT, env=e, timeout=120)
    doc = json.loads(p.stdout)
    assert [x["refused"]["rule"] for x in doc["refused"]] == ["format"], doc
    assert "too noisy" in doc["refused"][0]["refused"]["reason"]
    hwm = int(re.search(r"VmHWM:\s+(\d+) kB", p.stderr).group(1))
    assert hwm < 150 * 1024, hwm   # KiB: not the 120 MB said, and more


def test_queue_ids_only_grow_so_a_drop_never_hits_a_newer_write(served, tmp_path):
    """Ids started again at 1 once the queue emptied: someone read "#1 ... oops" in
    status, a sync ran meanwhile, another agent's write was queued as #1, and
    `sync --drop 1` dropped that one."""
    h = client(served, tmp_path)
    h.room("lobby").who()
    served.stop()
    h.room("lobby").send("core/juno", "core/kai", "oops")
    assert [e["id"] for e in h.store.queue.entries()] == [1]
    served.start()
    h.store.sync()
    assert h.store.queue.entries() == []
    served.stop()
    h.room("lobby").send("core/spartan", "core/juno", "important report")
    assert [e["id"] for e in h.store.queue.entries()] == [2]
    with pytest.raises(NotFound):
        h.store.sync(drop=1)
    assert [e["id"] for e in h.store.queue.entries()] == [2]


# The command line, dying as SIGKILL does (os._exit) where a write would be queued:
# after its commit moved the mirror's room ref, before the queue entry was made.
_KILLED_WHILE_QUEUEING = (
    "import os, sys\n"
    "from gitdrop.transports import queue\n"
    "queue.Queue.add = lambda *a, **k: os._exit(137)\n"
    "from gitdrop.cli.main import main\n"
    "sys.argv[0] = 'gitdrop'\n"
    "main()\n")


def _killed_while_queueing(served, tmp_path, *args):
    """One queued write, then the command `args` killed where its write is queued."""
    cli(served, tmp_path, "who")
    served.stop()
    cli(served, tmp_path, "send", "core/kai", "-m", "first", "--as", "core/juno",
        env={"GITDROP_OFFLINE": "queue"})
    e = dict(os.environ, GITDROP_CACHE=str(tmp_path / "cache"), GITDROP_OFFLINE="queue")
    p = subprocess.run([sys.executable, "-c", _KILLED_WHILE_QUEUEING, "--hub", served.url,
                        "--as", "core/juno", *args], capture_output=True, text=True, cwd=ROOT,
                       env=e)
    assert p.returncode == 137, (p.stdout, p.stderr)


def test_a_write_killed_while_queueing_is_sent_with_the_writes_made_on_it(served, tmp_path):
    """A kill between the mirror's ref move and the queue entry left a "phantom": reads
    showed the task, kai started it (queued, built on it), and sync sent the start
    alone, which the hub refused (no such task); the task itself was never sent."""
    env = {"GITDROP_OFFLINE": "queue"}
    _killed_while_queueing(served, tmp_path, "task", "create", "made offline", "--assign",
                           "core/kai")
    doc, _ = cli(served, tmp_path, "task", "list", "--all", "--as", "core/kai", env=env)
    [task] = [t for t in doc["tasks"] if t["title"] == "made offline"]   # reads show it
    doc, p = cli(served, tmp_path, "task", "start", task["id"], "--as", "core/kai", env=env)
    assert doc["queued"] is True and "made offline" in p.stderr and "queued now as #2" in p.stderr
    doc, _ = cli(served, tmp_path, "status", "--as", "core/kai", env=env)
    assert [(q["id"], q["author"]) for q in doc["queue"]] == [
        (1, "core/juno"), (2, "core/juno"), (3, "core/kai")], doc["queue"]
    served.start()
    doc, _ = cli(served, tmp_path, "sync")
    assert [q["id"] for q in doc["synced"]] == [1, 2, 3] and doc["refused"] == [] \
        and doc["queued"] == [], doc
    assert served.hub.room("lobby").task(task["id"])["state"] == "in_progress"
    assert [op for _, op in served.hub.verify("lobby")][-3:] == [
        "send", "task-create", "task-start"]


def test_a_write_killed_while_queueing_last_is_sent_at_sync(served, tmp_path):
    """The same kill with nothing made on it after: the room's ref holds it above
    the queued writes, and sync queues it in its place and sends it."""
    env = {"GITDROP_OFFLINE": "queue"}
    _killed_while_queueing(served, tmp_path, "send", "core/kai", "-m", "second")
    served.start()
    doc, p = cli(served, tmp_path, "sync")
    assert [q["id"] for q in doc["synced"]] == [1, 2] and doc["queued"] == [], doc
    assert texts(served.hub) == ["first", "second"]
    # and a write that was pushed, not queued, is never taken for one
    cli(served, tmp_path, "send", "core/kai", "-m", "third", "--as", "core/juno", env=env)
    served.stop()
    doc, p = cli(served, tmp_path, "send", "core/kai", "-m", "fourth", "--as", "core/juno",
                 env=env)
    assert doc["queue_ids"] == [3] and "queued now" not in p.stderr


def test_other_commands_go_on_while_a_sync_sends_a_long_queue(served, tmp_path):
    """Sync held the mirror's lock for the whole queue: every command on that hub
    waited for it without a word (161 s for 1,000 writes), `gitdrop status` too.
    It now takes the lock for one write at a time, and sends what is queued meanwhile."""
    env = {"GITDROP_OFFLINE": "queue"}
    cli(served, tmp_path, "who")
    served.stop()
    for i in range(5):
        cli(served, tmp_path, "send", "core/kai", "-m", f"m{i}", "--as", "core/juno", env=env)
    served.start()
    count = tmp_path / "count"
    hook = os.path.join(served.hub.path, "hooks", "reference-transaction")
    with open(hook, "w") as f:   # each write the hub takes keeps the push a second longer
        f.write(f"#!/bin/sh\n[ \"$1\" = committed ] || exit 0\necho x >> {count}\nsleep 1\n")
    os.chmod(hook, 0o755)
    started = time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", "gitdrop", "--hub", served.url, "--json", "sync"],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, GITDROP_CACHE=str(tmp_path / "cache")))
    while not count.exists() and time.monotonic() - started < 30:
        time.sleep(0.05)
    t0 = time.monotonic()
    doc, _ = cli(served, tmp_path, "status", "--as", "core/juno", env=env)
    took = time.monotonic() - t0
    assert doc["queue"], doc   # the sync is not over ...
    doc, _ = cli(served, tmp_path, "send", "core/kai", "-m", "meanwhile", "--as", "core/juno",
                 env=env)
    assert doc.get("queued") is True, (doc, took, time.monotonic() - t0)   # ... so it waits behind them
    out, err = p.communicate(timeout=60)
    whole = time.monotonic() - started
    assert p.returncode == 0, err
    assert [e["subject"].split(": ", 1)[-1] for e in json.loads(out)["synced"]][-1:] and \
        len(json.loads(out)["synced"]) == 6, out
    assert took < whole / 2, (took, whole)
    assert texts(served.hub) == [f"m{i}" for i in range(5)] + ["meanwhile"]


def test_dropping_a_write_a_killed_sync_landed_says_it_is_on_the_hub(served, tmp_path):
    """A sync killed right after a push landed left the entry queued; `--drop` said
    "it will not be sent" of a message the hub already had."""
    h = client(served, tmp_path)
    served.stop()
    for t in ("m0", "m1"):
        h.room("lobby").send("core/juno", "core/kai", t)
    served.start()
    _sync_killed_after(served, tmp_path, 1)
    assert texts(served.hub) == ["m0"]
    doc, out = cli(served, tmp_path, "sync", "--drop", "1")
    assert doc["landed"] is True and [e["id"] for e in doc["queued"]] == [2], doc
    p = subprocess.run([sys.executable, "-m", "gitdrop", "--hub", served.url, "sync", "--drop",
                        "2"], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, GITDROP_CACHE=str(tmp_path / "cache")))
    assert p.returncode == 0 and "it will not be sent" in p.stdout, (p.stdout, p.stderr)
    assert texts(served.hub) == ["m0"]


def test_a_keyed_write_also_made_on_the_hub_is_taken_as_landed(served, tmp_path):
    """The same keyed operation queued here and made on the hub meanwhile (a retry from
    another machine) is applied once, and sync took the replay's refusal for a rule's
    verdict on the write: it stayed queued, and every later sync exited 3."""
    h = client(served, tmp_path)
    h.room("lobby").who()
    served.stop()
    h.room("lobby").send("core/juno", "core/kai", "pay invoice 42", key="pay-42")
    served.start()
    served.hub.room("lobby").set_status("core/spartan", "in between")   # another parent
    served.hub.room("lobby").send("core/juno", "core/kai", "pay invoice 42", key="pay-42")
    r = h.store.sync()
    assert [e["id"] for e in r["synced"]] == [1] and r["refused"] == [] and r["queued"] == []
    assert texts(served.hub) == ["pay invoice 42"]


def test_a_hub_gone_after_the_last_push_still_says_what_was_sent(served, tmp_path):
    """Sync fetched once more after its last push; a hub gone by then made the whole
    sync "unreachable" (exit 7), and what it had sent was never said."""
    h = client(served, tmp_path)
    h.room("lobby").who()
    served.stop()
    h.room("lobby").send("core/juno", "core/kai", "one")
    served.start()
    hook = os.path.join(served.hub.path, "hooks", "post-receive")
    with open(hook, "w") as f:   # the hub stops answering once the push is in
        f.write(f"#!/bin/sh\nkill {served.proc.pid}\n")
    os.chmod(hook, 0o755)
    r = h.store.sync()
    assert [e["id"] for e in r["synced"]] == [1] and r["queued"] == []
    assert texts(served.hub) == ["one"]


def test_a_write_to_a_room_archived_or_destroyed_on_the_hub_says_so(served, tmp_path):
    """Both were refused as "team core is not a member of room proj", with the fix
    to join it: the room looked absent, since sync fetched only the active rooms."""
    hub = served.hub
    hub.register_team("core", "core/juno")
    for name in ("proj", "tmp"):
        hub.create_room("core/juno", name, ["core"])
        hub.room(name).register("core/juno", ["lead"])
    h = client(served, tmp_path)
    h.room("proj").who()
    h.room("tmp").who()
    served.stop()
    h.room("proj").send("core/juno", "all", "to the archive")
    h.room("tmp").send("core/juno", "all", "to a destroyed room")
    hub.archive_room("proj", "core/juno")
    hub.archive_room("tmp", "core/juno")
    hub.destroy_room("tmp", "core/juno")
    served.start()
    r = h.store.sync()
    got = {e["ref"].rsplit("/", 1)[1]: e["refused"] for e in r["refused"]}
    assert got["proj"]["rule"] == "room-archived" and "room restore proj" in got["proj"]["fix"]
    assert got["tmp"]["rule"] == "room-gone" and "--drop 2" in got["tmp"]["fix"]


def test_a_room_the_hub_moved_back_is_said_so(served, tmp_path, capfd):
    """A hub restored from a backup: the mirror followed it, and a write the client
    saw accepted vanished from every read without a word."""
    h = client(served, tmp_path)
    h.room("lobby").send("core/juno", "core/kai", "one")
    before = served.hub.store.room_tip("lobby")
    h.room("lobby").send("core/juno", "core/kai", "two")
    capfd.readouterr()
    git("update-ref", "refs/heads/rooms/lobby", before, cwd=served.hub.path)
    h.store.refresh(force=True)
    err = capfd.readouterr().err
    assert "room lobby on" in err and "moved back" in err, err
    assert texts(h) == ["one"]
    h.room("lobby").send("core/juno", "core/kai", "three")   # moving on is said nothing of
    h.store.refresh(force=True)
    assert "moved back" not in capfd.readouterr().err
    # what the hub prints itself ("remote: ...") is not taken for git's own report
    lie = "remote:  + 1234567...89abcde rooms/x -> refs/gitdrop/tips/rooms/\x1b[2Jx (forced update)"
    assert remote._moved_back(lie) == []
