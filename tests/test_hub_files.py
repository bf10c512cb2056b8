"""gitdrop's own files in a hub's folders, against someone who may write those
folders (a shared hub's group): a symbolic link planted in place of one is never
followed, so no writer writes to, or truncates, a file of the planter's choosing."""

import json
import os
import time

import pytest

from gitdrop import hub as hubmod
from cli_helpers import Gitdrop

PRECIOUS = b"someone else's file\n"


def _hub(tmp_path):
    path = str(tmp_path / "hub.git")
    hubmod.init(path, room="")
    h = hubmod.Hub(path)
    h.create_room("hub/admin", "r", open_=True, settings={"loop_cap": 0})
    r = h.room("r")
    r.register("t/ann", ["lead"])
    r.register("t/bob")
    g = Gitdrop(path, str(tmp_path), "t/ann")
    g.ok("--room", "r", "send", "t/bob", "-m", "first")   # the room's files exist now
    return h, g


def _plant(path: str, victim) -> None:
    os.unlink(path)
    os.symlink(victim, path)


@pytest.mark.parametrize("name", ["queue/refs%heads%rooms%r.slots",
                                  "queue/refs%heads%rooms%r.briefs", "walks", "tasks/r.idx"])
def test_a_link_in_place_of_a_rooms_own_file_is_not_written_through(tmp_path, name):
    """The request slots, the shared briefs, the walk memo and the task index: writes and reads still go through (each writer for itself, a cache
    rebuilt), and the linked file is untouched."""
    h, g = _hub(tmp_path)
    g.ok("--room", "r", "task", "create", "a task")
    g.ok("--room", "r", "task", "list")
    path = os.path.join(h.path, "gitdrop", name)
    assert os.path.exists(path), sorted(os.listdir(os.path.dirname(path)))
    victim = tmp_path / "victim"
    victim.write_bytes(PRECIOUS)
    _plant(path, victim)
    for n in range(3):
        g.ok("--room", "r", "send", "t/bob", "-m", f"after the link {n}")
        g.ok("--room", "r", "task", "create", f"task {n}")
        g.ok("--room", "r", "task", "list")
    assert victim.read_bytes() == PRECIOUS
    assert os.path.islink(path)
    texts = [m["text"] for m in h.room("r").inbox("t/bob", limit=10)["messages"]]
    assert texts == ["first", "after the link 0", "after the link 1", "after the link 2"]


@pytest.mark.parametrize("name", ["wal", "wal.sync"])
def test_a_link_in_place_of_the_hubs_log_is_refused_and_said(tmp_path, name):
    """The write-ahead log itself, or the file its syncs take turns on: the write is
    refused with what to do (remove the link), not a traceback, and nothing is
    written to the linked file."""
    h, g = _hub(tmp_path)
    victim = tmp_path / "victim"
    victim.write_bytes(PRECIOUS)
    path = os.path.join(h.path, "gitdrop", name)
    _plant(path, victim)
    r = g("--room", "r", "send", "t/bob", "-m", "after the link", "--json")
    assert r.rc in (8, 9) and "Traceback" not in r.err, r
    doc = json.loads(r.out)
    assert doc["ok"] is False and doc["rule"] in ("damaged", "storage"), doc
    assert "symbolic link" in doc["reason"] or "Too many levels" in doc["reason"], doc
    assert victim.read_bytes() == PRECIOUS
    # Once the link is gone, the hub writes again.
    os.unlink(path)
    if name == "wal":
        hubmod.Hub(h.path)   # makes a new log
    g.ok("--room", "r", "send", "t/bob", "-m", "after the link is gone")
    texts = [m["text"] for m in h.room("r").inbox("t/bob", limit=10)["messages"]]
    assert texts[0] == "first" and texts[-1] == "after the link is gone"
    assert victim.read_bytes() == PRECIOUS


def test_links_planted_where_files_are_rewritten_are_not_written_through(tmp_path):
    """Files rewritten whole (tokens, the hook) went through a temp file of a
    predictable name: a link planted there had the write, and a chmod, land on its
    target. A link in place of the token file itself is refused, and said."""
    h, g = _hub(tmp_path)
    victims = {}
    for name in ("gitdrop/tokens.json.tmp", "hooks/pre-receive.tmp"):
        victim = tmp_path / ("victim-" + name.replace("/", "-"))
        victim.write_bytes(PRECIOUS)
        victim.chmod(0o640)
        os.symlink(victim, os.path.join(h.path, name))
        victims[name] = victim
    g.ok("token", "t/bob")   # rewrites the token file
    g.ok("init", h.path)     # an upgrade in place: rewrites the hook
    for name, victim in victims.items():
        assert victim.read_bytes() == PRECIOUS, name
        assert victim.stat().st_mode & 0o777 == 0o640, name
    tokens_file = os.path.join(h.path, "gitdrop", "tokens.json")
    assert os.stat(tokens_file).st_mode & 0o777 == 0o600
    assert "t/bob" in json.loads(open(tokens_file).read())["agents"]
    hook = os.path.join(h.path, "hooks", "pre-receive")
    assert not os.path.islink(hook) and os.stat(hook).st_mode & 0o777 == 0o755
    # The token file itself a link: refused as damaged, the link's target untouched.
    victim = tmp_path / "victim-tokens"
    victim.write_bytes(PRECIOUS)
    os.unlink(tokens_file)
    os.symlink(victim, tokens_file)
    r = g("token", "t/bob", "--json")
    assert r.rc == 8 and "Traceback" not in r.err, r
    assert r.json["rule"] == "damaged" and "symbolic link" in r.json["reason"], r.json
    assert victim.read_bytes() == PRECIOUS


def test_a_hub_made_under_umask_zero_is_writable_by_its_owner_alone(tmp_path):
    """A service manager or container may start gitdrop with umask 0: a world-writable
    hub let any local user replace its hook, which runs on every push."""
    import subprocess
    from cli_helpers import ENTRY
    path = str(tmp_path / "hub.git")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GITDROP")}
    p = subprocess.run([*ENTRY, "init", path], env=dict(env, HOME=str(tmp_path)),
                       capture_output=True, text=True, preexec_fn=lambda: os.umask(0),
                       timeout=60)
    assert p.returncode == 0, p.stderr
    g = Gitdrop(path, str(tmp_path), "t/ann")
    g.ok("--room", "lobby", "register", "t/ann")
    g.ok("--room", "lobby", "token", "t/ann")
    loose = []
    for top, dirs, names in os.walk(path):
        for n in dirs + names:
            full = os.path.join(top, n)
            if not os.path.islink(full) and os.stat(full).st_mode & 0o002:
                loose.append(full)
    assert not loose, loose


def test_repair_removes_the_temp_files_of_killed_writers(tmp_path):
    """A writer killed between making a temporary file and putting it in place left
    it for ever; repair removes those whose process is gone, and no other."""
    import subprocess
    h, g = _hub(tmp_path)
    dead = subprocess.Popen(["true"])
    dead.wait()
    old = time.time() - 3600
    stale = [f"gitdrop/tokens.json.{dead.pid}-0a1b2c.tmp", f"hooks/pre-receive.{dead.pid}.tmp",
             f"objects/ab/tmp_obj_{dead.pid}_0a1b2c3d", f"gitdrop/wal.new{dead.pid}"]
    kept = [f"gitdrop/tokens.json.{os.getpid()}-0a1b2c.tmp",   # its writer lives
            f"gitdrop/walks.{dead.pid}.tmpx"]                  # not a temp file of ours
    young = f"gitdrop/tasks/r.idx.{dead.pid}-ffee.tmp"          # just made: left alone
    for name in stale + kept + [young]:
        full = os.path.join(h.path, name)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(b"half")
        if name != young:
            os.utime(full, (old, old))
    doc = g.js("repair")
    assert sorted(doc["temp_removed"]) == sorted(stale), doc
    for name in stale:
        assert not os.path.exists(os.path.join(h.path, name)), name
    for name in kept + [young]:
        assert os.path.exists(os.path.join(h.path, name)), name
    assert doc["healthy"] is True
