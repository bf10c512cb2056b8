"""gitdrop room export / import: a room's history and the teams it needs in one git
bundle, brought into a second hub, judged by the rules first (a tampered bundle is
refused by rule with nothing written), verified there, commit for commit the same;
under another name (every commit rewritten, judged again); an old-layout room moved
as it arrives; an import that loses a race or is killed leaves nothing half done."""

import json
import os
import signal
import stat
import subprocess
import sys
import time
import tempfile

import pygit2
import pytest

from gitdrop import bundle as bundlemod
from gitdrop import fmt, layout, model
from gitdrop import hub as hubmod
from gitdrop import verify as verifymod
from gitdrop.errors import Conflict, Refusal

from conftest import git

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cli(hub_path, *args, ok=True, env=None):
    p = subprocess.run([sys.executable, "-m", "gitdrop", "--hub", hub_path, "--json", *args],
                       capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, NO_COLOR="1", **(env or {})))
    doc = json.loads(p.stdout) if p.stdout.strip() else {}
    assert (p.returncode == 0) is ok, (p.returncode, p.stdout, p.stderr)
    return doc, p


def log(path, ref="refs/heads/rooms/dev"):
    return git("log", "--format=%H %an %ad %s", ref, cwd=path).stdout


def state(path):
    """Everything a write would change: every ref and every object."""
    refs = git("for-each-ref", "--format=%(refname) %(objectname)", cwd=path).stdout
    objs = git("cat-file", "--batch-all-objects", "--batch-check=%(objectname)", cwd=path).stdout
    return refs, set(objs.split())


def make_source(path):
    """A hub with a room dev for team core: agents, messages, a claimed task."""
    a = hubmod.init(path)
    a.room("lobby").register("core/juno", ["lead"])
    a.register_team("core", "core/juno", ["core/spartan"], by="core/juno")
    a.create_room("core/juno", "dev", ["core"])
    dev = a.room("dev")
    dev.register("core/juno", ["lead"])
    dev.register("core/spartan", ["coder"])
    dev.send("core/juno", "core/spartan", "welcome to dev")
    tid = dev.create_task("core/juno", "port the parser")["id"]
    dev.inbox("core/spartan")
    dev.move_task("core/spartan", tid, "claim")
    return a


@pytest.fixture
def source(tmp_path):
    """Hub A with a room dev for team core: agents, messages, a claimed task."""
    return make_source(str(tmp_path / "a.git"))


def test_round_trip_to_a_second_hub(source, tmp_path):
    b = hubmod.init(str(tmp_path / "b.git"))
    assert b.team("core", missing_ok=True) is None
    bundle = str(tmp_path / "dev.bundle")
    out, _ = cli(source.path, "room", "export", "dev", bundle)
    assert out["teams"] == ["core"] and os.path.isfile(bundle)
    got, _ = cli(b.path, "room", "import", bundle)
    assert got["room"] == "dev" and got["teams"] == ["core"] and got["commits"] > 5
    # the same history, commit for commit, and the team as the source has it
    assert log(b.path) == log(source.path)
    assert b.team("core")["lead"] == "core/juno"
    assert b.team("core")["members"] == source.team("core")["members"]
    v, _ = cli(b.path, "verify", "dev")
    assert v["verified"] is True and v["commits"] == got["commits"]
    # the imported room works: a new write lands on it, judged as usual
    hubmod.Hub(b.path).room("dev").send("core/spartan", "core/juno", "claimed it")
    # an older copy of a history the room already holds is a no-op; a diverged one is refused
    again, _ = cli(b.path, "room", "import", bundle)
    assert again["up_to_date"] is True and again["commits"] == 0
    source.room("dev").send("core/juno", "core/spartan", "one more")
    cli(source.path, "room", "export", "dev", bundle)
    refused, p = cli(b.path, "room", "import", bundle, ok=False)
    assert refused["rule"] == "linear-history"     # b's dev has moved on its own


def test_an_extension_is_taken_and_the_same_history_is_a_no_op(source, tmp_path):
    b = hubmod.init(str(tmp_path / "b.git"))
    bundle = str(tmp_path / "dev.bundle")
    cli(source.path, "room", "export", "dev", bundle)
    cli(b.path, "room", "import", bundle)
    same, _ = cli(b.path, "room", "import", bundle)
    assert same["up_to_date"] is True and same["commits"] == 0
    source.room("dev").send("core/juno", "core/spartan", "later news")
    cli(source.path, "room", "export", "dev", bundle)
    more, _ = cli(b.path, "room", "import", bundle)
    assert more["extended"] is True and more["commits"] == 1 and more["teams"] == []
    assert log(b.path) == log(source.path)


def tampered(source, bundle, tmp_path, change):
    """The exported bundle with one more commit on the room, made by `change(repo, tip)`."""
    work = str(tmp_path / "tamper.git")
    git("init", "-q", "--bare", work)
    git("fetch", "-q", bundle, "refs/heads/rooms/dev:refs/heads/rooms/dev",
        "refs/gitdrop/export/teams:refs/gitdrop/export/teams", cwd=work)
    repo = pygit2.Repository(work)
    tip = repo.references["refs/heads/rooms/dev"].target
    new = change(repo, repo[tip])
    repo.references["refs/heads/rooms/dev"].set_target(new)
    out = str(tmp_path / "tampered.bundle")
    git("bundle", "create", "-q", out, "refs/heads/rooms/dev", "refs/gitdrop/export/teams",
        cwd=work)
    return out


def test_a_tampered_bundle_is_refused_by_rule_and_writes_nothing(source, tmp_path):
    b = hubmod.init(str(tmp_path / "b.git"))
    bundle = str(tmp_path / "dev.bundle")
    cli(source.path, "room", "export", "dev", bundle)

    def forged_lead(repo, tip):
        # spartan makes itself the room's lead: room.toml is for the leads to change
        text = repo[tip.tree["room.toml"].id].data.decode()
        doc = fmt.loads_toml(text)
        doc["leads"] = {"core": "core/spartan"}
        tb = repo.TreeBuilder(tip.tree)
        tb.insert("room.toml", repo.create_blob(fmt.dumps_toml(doc).encode()),
                  pygit2.GIT_FILEMODE_BLOB)
        sig = pygit2.Signature("core/spartan", "spartan@core.gitdrop")
        return repo.create_commit(None, sig, sig, "lead now\n", tb.write(), [tip.id])
    bad = tampered(source, bundle, tmp_path, forged_lead)
    before = state(b.path)
    refused, p = cli(b.path, "room", "import", bad, ok=False)
    assert p.returncode == 3 and refused["rule"] not in ("format", "usage", "error")
    assert "lead now" in refused["commit"]
    assert "refused by rule " + refused["rule"] in p.stderr
    assert state(b.path) == before            # no team, no ref, no object
    assert b.team("core", missing_ok=True) is None


def test_a_bundle_of_something_else_is_refused(source, tmp_path):
    b = hubmod.init(str(tmp_path / "b.git"))
    junk = tmp_path / "junk.bundle"
    junk.write_text("not a bundle\n")
    refused, _ = cli(b.path, "room", "import", str(junk), ok=False)
    assert refused["rule"] == "format"
    # a bundle with a hostile ref name besides the room
    work = str(tmp_path / "w.git")
    git("init", "-q", "--bare", work)
    git("fetch", "-q", source.path, "refs/heads/rooms/dev:refs/heads/rooms/dev",
        "refs/heads/hub:refs/heads/hub", cwd=work)
    two = str(tmp_path / "two.bundle")
    git("bundle", "create", "-q", two, "refs/heads/rooms/dev", "refs/heads/hub", cwd=work)
    before = state(b.path)
    refused, _ = cli(b.path, "room", "import", two, ok=False)
    assert refused["rule"] == "format" and "refs/heads/hub" in refused["reason"]
    assert state(b.path) == before


def test_a_team_led_by_someone_else_here_is_refused(source, tmp_path):
    b = hubmod.init(str(tmp_path / "b.git"))
    b.register_team("core", "core/other", by="core/other")
    bundle = str(tmp_path / "dev.bundle")
    cli(source.path, "room", "export", "dev", bundle)
    before = state(b.path)
    refused, _ = cli(b.path, "room", "import", bundle, ok=False)
    assert refused["rule"] == "lead-only" and "core/other" in refused["reason"]
    assert state(b.path) == before


def test_export_from_a_url_and_import_only_on_the_hubs_machine(source, tmp_path):
    b = hubmod.init(str(tmp_path / "b.git"))
    env = {"GITDROP_CACHE": str(tmp_path / "cache")}
    bundle = str(tmp_path / "dev.bundle")
    out, _ = cli("file://" + source.path, "room", "export", "dev", bundle, env=env)
    assert out["tip"] == source.store.room_tip("dev")
    refused, p = cli("file://" + b.path, "room", "import", bundle, ok=False, env=env)
    assert p.returncode == 2 and "hub's machine" in refused["reason"]
    assert b.store.tip("refs/heads/rooms/dev") == ""
    cli(b.path, "room", "import", bundle)
    assert log(b.path) == log(source.path)


def test_a_bundle_without_its_teams_cannot_name_leads_this_hub_has_not(source, tmp_path):
    """A bundle made by hand (git bundle, no team entries) whose room names a lead this
    hub's registry does not know is refused, whatever its history says."""
    b = hubmod.init(str(tmp_path / "b.git"))
    b.register_team("core", "core/other", by="core/other")
    bundle = str(tmp_path / "raw.bundle")
    git("bundle", "create", bundle, "refs/heads/rooms/dev", cwd=source.path)
    before = state(b.path)
    refused, _ = cli(b.path, "room", "import", bundle, ok=False)
    assert refused["rule"] == "lead-only", refused
    assert "core/juno" in refused["reason"] and "core/other" in refused["reason"]
    assert state(b.path) == before


def revs(path, room):
    """The room's commit ids, oldest first."""
    return git("rev-list", "--reverse", f"refs/heads/rooms/{room}", cwd=path).stdout.split()


# The import in a process of its own, killed (kill -9) at a chosen line: "teams"
# when it registers the first team, "judging" when it judges the room's commits
# (the slowest part of a big import: the whole bundle is unpacked by then).
KILLED = """
import os, signal, sys
from gitdrop import bundle, hub, verify
def die(*a, **k):
    os.kill(os.getpid(), signal.SIGKILL)
if sys.argv[3] == "teams":
    hub.Hub.register_team = die
else:
    real = verify.check_commits
    def check(reader, ref, *a, **k):
        if ref.startswith("refs/heads/rooms/"):
            die()
        return real(reader, ref, *a, **k)
    verify.check_commits = check
bundle.import_room(hub.Hub(sys.argv[1]), sys.argv[2])
"""


def killed_import(hub_path, bundle, where, tmpdir):
    p = subprocess.run([sys.executable, "-c", KILLED, hub_path, bundle, where], cwd=ROOT,
                       capture_output=True, text=True,
                       env=dict(os.environ, TMPDIR=str(tmpdir)))
    assert p.returncode == -signal.SIGKILL, (p.returncode, p.stderr)


def test_an_import_that_loses_the_race_registers_no_team(source, tmp_path, monkeypatch):
    """The room is judged, then someone creates a room of that name here before the
    import moves the ref: the import is refused (conflict) and the teams it would
    have registered are not."""
    b = hubmod.init(str(tmp_path / "b.git"))
    bundle = str(tmp_path / "dev.bundle")
    bundlemod.export(source.store, "dev", bundle)
    real, raced = verifymod.check_commits, {}

    def racing(reader, ref, *a, **k):
        if ref == "refs/heads/rooms/dev" and not raced:
            raced.update(hubmod.Hub(b.path).create_room("hub/admin", "dev", open_=True))
        return real(reader, ref, *a, **k)
    monkeypatch.setattr(verifymod, "check_commits", racing)
    with pytest.raises(Conflict) as e:
        bundlemod.import_room(b, bundle)
    assert b.team("core", missing_ok=True) is None
    assert "team core" not in git("log", "--format=%s", "refs/heads/hub", cwd=b.path).stdout
    assert b.store.tip("refs/heads/rooms/dev") == raced["commit"]   # the winner's room
    assert "nothing was written" in e.value.reason and "again" in e.value.fix


def test_a_kill_between_the_room_and_its_teams_is_finished_by_running_again(source, tmp_path):
    b = hubmod.init(str(tmp_path / "b.git"))
    bundle = str(tmp_path / "dev.bundle")
    cli(source.path, "room", "export", "dev", bundle)
    (tmp_path / "tmp").mkdir()
    killed_import(b.path, bundle, "teams", tmp_path / "tmp")
    # the room's ref moved first; the kill came before its team was registered
    assert b.store.tip("refs/heads/rooms/dev") == source.store.room_tip("dev")
    assert b.team("core", missing_ok=True) is None
    again, _ = cli(b.path, "room", "import", bundle)
    assert again["up_to_date"] is True and again["teams"] == ["core"], again
    assert b.team("core")["lead"] == "core/juno"
    assert b.team("core")["members"] == source.team("core")["members"]
    third, _ = cli(b.path, "room", "import", bundle)
    assert third["up_to_date"] is True and third["teams"] == []
    v, _ = cli(b.path, "verify", "dev")
    assert v["verified"] is True


def test_a_killed_import_leaves_no_temporary_files_and_the_next_clears_them(source, tmp_path):
    b = hubmod.init(str(tmp_path / "b.git"))
    bundle = str(tmp_path / "dev.bundle")
    cli(source.path, "room", "export", "dev", bundle)
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    killed_import(b.path, bundle, "judging", tmpdir)
    assert os.listdir(tmpdir) == []        # nothing in the system's temporary directory
    scratch = os.path.join(b.path, "gitdrop", "tmp")
    left = os.listdir(scratch)
    assert len(left) == 1 and left[0].startswith("bundle-"), left
    # killed with the bundle unpacked there (the room's tip is in no hub ref)
    assert git("--git-dir", os.path.join(scratch, left[0]), "cat-file", "-e",
               source.store.room_tip("dev"), check=False).returncode == 0
    assert b.store.tip("refs/heads/rooms/dev") == "" and b.team("core", missing_ok=True) is None
    # the next import clears the dead one's scratch, not a live one's (this process)
    with bundlemod._scratch(b.path) as live:
        got, _ = cli(b.path, "room", "import", bundle, env={"TMPDIR": str(tmpdir)})
        assert got["commits"] > 5 and got["teams"] == ["core"]
        assert os.listdir(scratch) == [os.path.basename(live)]
    assert os.listdir(scratch) == [] and os.listdir(tmpdir) == []
    assert log(b.path) == log(source.path)


def test_a_room_imported_under_another_name(source, tmp_path):
    """--name: beside the original in its own hub, and in a second hub; every commit
    rewritten (room.toml's name, read cursors, reply ids), judged by the rules again;
    the same bundle renamed twice gives the same commits."""
    dev = source.room("dev")
    asked = dev.send("core/juno", "core/spartan", "is the parser ready?")["commit"]
    dev.inbox("core/spartan")
    dev.send("core/spartan", "core/juno", "nearly", reply_to=asked[:10])
    bundle = str(tmp_path / "dev.bundle")
    cli(source.path, "room", "export", "dev", bundle)
    got, _ = cli(source.path, "room", "import", bundle, "--name", "copy")
    assert got["room"] == "copy" and got["from"] == "dev" and got["teams"] == []
    # the same commits (authors, dates, messages), none of the same ids
    fields = "--format=%an %ad %s%n%b"
    same = [git("log", fields, f"refs/heads/rooms/{r}", cwd=source.path).stdout
            for r in ("dev", "copy")]
    old, new = revs(source.path, "dev"), revs(source.path, "copy")
    assert len(old) == len(new) == got["commits"] and not set(old) & set(new)
    pos = {o: i for i, o in enumerate(old)}
    view = source.store.view("copy")
    assert view.room["name"] == "copy" and source.store.view("dev").room["name"] == "dev"
    for a in source.store.view("dev").agents():   # each cursor at the same place
        assert view.agent(a["id"])["cursor"] == new[pos[a["cursor"]]]
    reply = source.store.reader.commit(new[-1])
    assert fmt.trailer(reply.trailers, "reply-to") == new[pos[asked]][:10]
    assert same[0].replace(asked[:10], new[pos[asked]][:10]) == same[1]
    v, _ = cli(source.path, "verify", "copy")
    assert v["verified"] is True and v["commits"] == len(new)
    # two rooms now: a write to the copy leaves the original as it was
    tip = source.store.room_tip("copy")
    copy = source.room("copy")
    copy.inbox("core/juno")
    copy.send("core/juno", "all", "the copy lives on its own")
    assert revs(source.path, "dev") == old
    again, _ = cli(source.path, "room", "import", bundle, "--name", "copy")
    assert again["up_to_date"] is True
    # in a second hub: the same commits, its team registered, extended later
    b = hubmod.init(str(tmp_path / "b.git"))
    there, _ = cli(b.path, "room", "import", bundle, "--name", "copy")
    assert there["tip"] == tip and there["teams"] == ["core"]
    dev.inbox("core/juno")
    dev.send("core/juno", "core/spartan", "one more")
    cli(source.path, "room", "export", "dev", bundle)
    more, _ = cli(b.path, "room", "import", bundle, "--name", "copy")
    assert more["extended"] is True and more["commits"] == 2
    assert git("log", "-1", "--format=%s", "refs/heads/rooms/copy", cwd=b.path).stdout \
        .strip().endswith("one more")
    # a hostile name, and the name of a room this hub has: refused, nothing written
    before = state(b.path)
    refused, p = cli(b.path, "room", "import", bundle, "--name", "../hub", ok=False)
    assert p.returncode == 2 and refused["rule"] == "usage"
    refused, _ = cli(b.path, "room", "import", bundle, "--name", "lobby", ok=False)
    assert refused["rule"] == "linear-history"
    assert state(b.path) == before


@pytest.fixture
def old_source(tmp_path, monkeypatch):
    """make_source's hub as gitdrop made it in layout 1 (agents/<team>/<name>.toml,
    tasks/<id>.md), still unmoved."""
    with monkeypatch.context() as m:
        m.setattr(model, "LAYOUT", 1)
        a = make_source(str(tmp_path / "old.git"))
    assert a.store.view("dev").layout == 1
    return a


def test_a_room_is_not_imported_beside_its_case_twin(source, tmp_path):
    """The rules judge an import on a scratch copy that holds no other room: a room
    DEV came in beside dev (one ref file on macOS or Windows)."""
    bundle = str(tmp_path / "dev.bundle")
    cli(source.path, "room", "export", "dev", bundle)
    before = state(source.path)
    doc, p = cli(source.path, "room", "import", bundle, "--name", "DEV", ok=False)
    assert p.returncode == 3 and "only in case" in p.stderr and "'dev'" in p.stderr, p.stderr
    assert state(source.path) == before


def test_a_room_of_the_old_layout_is_moved_as_it_is_imported(old_source, tmp_path):
    a = old_source
    bundle = str(tmp_path / "dev.bundle")
    cli(a.path, "room", "export", "dev", bundle)
    assert a.store.view("dev").layout == 1          # exporting moved nothing
    b = hubmod.init(str(tmp_path / "b.git"))
    got, _ = cli(b.path, "room", "import", bundle)
    view, was = b.store.view("dev"), a.store.view("dev")
    assert view.layout == model.LAYOUT and view.commit == got["layout_moved"]
    # the source's history, then the hub's own move (layout.move_room), by hub/admin
    c = b.store.reader.commit(view.commit)
    assert c.author == layout.MOVER and fmt.trailer(c.trailers, "op") == layout.OP
    assert c.parent == a.store.room_tip("dev") and c.time == a.store.reader.commit(c.parent).time
    assert revs(b.path, "dev")[:-1] == revs(a.path, "dev")
    assert {x["id"]: x for x in view.agents()} == {x["id"]: x for x in was.agents()}
    assert {t: view.task(t) for t in view.task_ids()} == {t: was.task(t) for t in was.task_ids()}
    assert view.text(model.agent_path("core/spartan")) and \
        view.text(model.agent_path("core/spartan", 1)) is None
    v, _ = cli(b.path, "verify", "dev")
    assert v["verified"] is True and v["commits"] == got["commits"]
    again, _ = cli(b.path, "room", "import", bundle)
    assert again["up_to_date"] is True
    # every hub that imports the bundle gets the same commits; renamed, it moves too
    c2 = hubmod.init(str(tmp_path / "c.git"))
    assert cli(c2.path, "room", "import", bundle)[0]["tip"] == got["tip"]
    renamed, _ = cli(b.path, "room", "import", bundle, "--name", "dev2")
    assert renamed["layout_moved"] and b.store.view("dev2").layout == model.LAYOUT
    assert cli(b.path, "verify", "dev2")[0]["verified"] is True
    # the moved room works
    hubmod.Hub(b.path).room("dev").send("core/spartan", "core/juno", "on it")


def test_export_into_a_directory_or_nowhere(source, tmp_path):
    """A directory gets ROOM.bundle; a directory that is not there is a usage error;
    neither leaves a part file (a directory ended in a traceback and DIR.part)."""
    out = tmp_path / "out"
    out.mkdir()
    r, _ = cli(source.path, "room", "export", "dev", str(out))
    assert r["file"] == str(out / "dev.bundle") and os.path.isfile(r["file"])
    assert sorted(os.listdir(out)) == ["dev.bundle"] and not os.path.exists(f"{out}.part")
    b = hubmod.init(str(tmp_path / "b.git"))
    cli(b.path, "room", "import", r["file"])
    assert log(b.path) == log(source.path)
    missing = tmp_path / "no" / "such" / "x.bundle"
    refused, p = cli(source.path, "room", "export", "dev", str(missing), ok=False)
    assert p.returncode == 2 and "no directory" in refused["reason"], refused
    assert not os.path.exists(tmp_path / "no")


def test_an_import_registers_only_the_rooms_teams_and_takes_only_commits(source, tmp_path):
    """A bundle's teams ref carried a team the room does not name (ops, led by an
    outsider): the import registered it. And refs naming a tree, not a commit, were
    a traceback."""
    b = hubmod.init(str(tmp_path / "b.git"))
    bundle = str(tmp_path / "dev.bundle")
    cli(source.path, "room", "export", "dev", bundle)
    work = str(tmp_path / "squat.git")
    git("init", "-q", "--bare", work)
    git("fetch", "-q", bundle, "refs/heads/rooms/dev:refs/heads/rooms/dev",
        "refs/gitdrop/export/teams:refs/gitdrop/export/teams", cwd=work)
    repo = pygit2.Repository(work)
    teams = repo.references["refs/gitdrop/export/teams"]
    old = repo[teams.target]
    ops = repo.create_blob(fmt.dumps_toml({"name": "ops", "lead": "ops/mallory",
                                           "members": ["ops/mallory"],
                                           "created": 1700000000}).encode())
    sub = repo.TreeBuilder(repo[old.tree["teams"].id])
    sub.insert("ops.toml", ops, pygit2.GIT_FILEMODE_BLOB)
    top = repo.TreeBuilder(old.tree)
    top.insert("teams", sub.write(), pygit2.GIT_FILEMODE_TREE)
    sig = pygit2.Signature("core/juno", "juno@core.gitdrop")
    teams.set_target(repo.create_commit(None, sig, sig, "teams\n", top.write(), [old.id]))
    squat = str(tmp_path / "squat.bundle")
    git("bundle", "create", "-q", squat, "refs/heads/rooms/dev", "refs/gitdrop/export/teams",
        cwd=work)
    done, _ = cli(b.path, "room", "import", squat)
    assert done["teams"] == ["core"] and b.team("ops", missing_ok=True) is None
    # the room's ref naming its tree
    tree = str(repo[repo.references["refs/heads/rooms/dev"].target].tree_id)
    git("pack-refs", "--all", cwd=work)   # git will not put a tree on a branch: by hand
    with open(os.path.join(work, "packed-refs")) as f:
        packed = f.read()
    with open(os.path.join(work, "packed-refs"), "w") as f:
        f.write("".join(ln if not ln.endswith(" refs/heads/rooms/dev\n") else
                        f"{tree} refs/heads/rooms/dev\n" for ln in packed.splitlines(True)))
    odd = str(tmp_path / "odd.bundle")
    git("bundle", "create", "-q", odd, "refs/heads/rooms/dev", cwd=work)
    c = hubmod.init(str(tmp_path / "c.git"))
    before = state(c.path)
    refused, p = cli(c.path, "room", "import", odd, ok=False)
    assert refused["rule"] == "format" and "not a commit" in refused["reason"], p.stderr
    assert "Traceback" not in p.stderr and state(c.path) == before


def test_export_writes_through_a_link_a_fifo_and_stdout(source, tmp_path):
    """A FILE that is not a regular file is written into, as a shell redirection
    would: a link keeps pointing where it did (its target gets the bundle), a FIFO
    stays a FIFO and its reader gets the bundle, "-" is standard output. They were
    replaced by a regular file (as root, /dev/stdout itself)."""
    import threading
    b = hubmod.init(str(tmp_path / "b.git"))
    head = f"# v2 git bundle\n{source.store.room_tip('dev')} refs/heads/rooms/dev\n".encode()
    backup = tmp_path / "backup"
    backup.mkdir()
    (backup / "dev.bundle").write_text("old backup\n")
    link = tmp_path / "latest.bundle"
    link.symlink_to(backup / "dev.bundle")
    cli(source.path, "room", "export", "dev", str(link))
    assert os.path.islink(link) and os.readlink(link) == str(backup / "dev.bundle")
    assert (backup / "dev.bundle").read_bytes().startswith(head)
    cli(b.path, "room", "import", str(backup / "dev.bundle"))
    assert log(b.path) == log(source.path)
    fifo = str(tmp_path / "pipe")
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()), daemon=True)
    reader.start()
    cli(source.path, "room", "export", "dev", fifo)
    reader.join(30)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert got and got[0].startswith(head) and len(got[0]) > 1000
    assert sorted(os.listdir(tmp_path)) == ["a.git", "b.git", "backup", "latest.bundle",
                                            "pipe"]
    p = subprocess.run([sys.executable, "-m", "gitdrop", "--hub", source.path, "room",
                        "export", "dev", "-"], capture_output=True, cwd=str(tmp_path),
                       env=dict(os.environ, NO_COLOR="1"))
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(head) and b"written to standard output" in p.stderr
    piped = tmp_path / "piped.bundle"
    piped.write_bytes(p.stdout)
    c = hubmod.init(str(tmp_path / "c.git"))
    cli(c.path, "room", "import", str(piped))
    assert log(c.path) == log(source.path)
    assert not os.path.exists(tmp_path / "-")
    # a regular file is still replaced whole
    plain = tmp_path / "plain.bundle"
    plain.write_text("old\n")
    cli(source.path, "room", "export", "dev", str(plain))
    assert plain.read_bytes().startswith(head) and not os.path.exists(f"{plain}.part")


def with_teams_file(source, bundle, tmp_path, text):
    """The exported bundle with its teams/core.toml holding `text`."""
    work = str(tmp_path / "teams.git")
    git("init", "-q", "--bare", work)
    git("fetch", "-q", bundle, "refs/heads/rooms/dev:refs/heads/rooms/dev", cwd=work)
    repo = pygit2.Repository(work)
    sub = repo.TreeBuilder()
    sub.insert("core.toml", repo.create_blob(text.encode()), pygit2.GIT_FILEMODE_BLOB)
    top = repo.TreeBuilder()
    top.insert("teams", sub.write(), pygit2.GIT_FILEMODE_TREE)
    sig = pygit2.Signature("hub/admin", "admin@hub.gitdrop")
    repo.create_commit("refs/gitdrop/export/teams", sig, sig, "teams\n", top.write(), [])
    out = str(tmp_path / "teams.bundle")
    git("bundle", "create", "-q", out, "refs/heads/rooms/dev", "refs/gitdrop/export/teams",
        cwd=work)
    return out


@pytest.mark.parametrize("field", ['members = 5', 'lead = "core/ju<no"', 'lead = ""',
                                   'members = [5]'])
def test_a_bundles_team_file_of_the_wrong_shape_is_refused(source, tmp_path, field):
    """A team file whose members are no list, or whose lead no signature takes (a
    "<", nothing), was a traceback before any rule ran."""
    bundle = str(tmp_path / "dev.bundle")
    cli(source.path, "room", "export", "dev", bundle)
    fields = {"name": '"core"', "lead": '"core/juno"', "members": '["core/spartan"]',
              "created": "1700000000"}
    key, _, value = field.partition(" = ")
    fields[key] = value
    bad = with_teams_file(source, bundle, tmp_path,
                          "".join(f"{k} = {v}\n" for k, v in fields.items()))
    b = hubmod.init(str(tmp_path / "b.git"))
    before = state(b.path)
    for name in ([], ["--name", "dev2"]):
        refused, p = cli(b.path, "room", "import", bad, *name, ok=False)
        assert p.returncode == 3 and refused["rule"] == "format", (refused, p.stderr)
        assert "teams/core.toml in the bundle" in refused["reason"] and refused["fix"]
        assert "Traceback" not in p.stderr
    assert state(b.path) == before and b.team("core", missing_ok=True) is None


def test_a_bundle_whose_room_toml_is_a_directory_is_refused(tmp_path):
    """Without --name the layout move read it as a file, with --name the renaming
    did: both were tracebacks before the rules judged the history."""
    work = str(tmp_path / "w.git")
    git("init", "-q", "--bare", work)
    repo = pygit2.Repository(work)
    inner = repo.TreeBuilder()
    inner.insert("x", repo.create_blob(b"x"), pygit2.GIT_FILEMODE_BLOB)
    top = repo.TreeBuilder()
    top.insert("room.toml", inner.write(), pygit2.GIT_FILEMODE_TREE)
    sig = pygit2.Signature("hub/admin", "admin@hub.gitdrop")
    repo.create_commit("refs/heads/rooms/x", sig, sig, "room x\n\nGitdrop-Op: room-create\n",
                       top.write(), [])
    bundle = str(tmp_path / "x.bundle")
    git("bundle", "create", "-q", bundle, "refs/heads/rooms/x", cwd=work)
    b = hubmod.init(str(tmp_path / "b.git"))
    before = state(b.path)
    for name in ([], ["--name", "y"]):
        refused, p = cli(b.path, "room", "import", bundle, *name, ok=False)
        assert p.returncode == 3 and refused["rule"] == "format", (refused, p.stderr)
        assert "room.toml/x" in refused["reason"] and "Traceback" not in p.stderr
    assert state(b.path) == before


def deep_commit(repo, tip, top, depth=3000):
    """A commit on `tip` adding a file under `top`/ nested `depth` directories deep."""
    tree = repo.TreeBuilder()
    tree.insert("f.toml", repo.create_blob(b"x = 1\n"), pygit2.GIT_FILEMODE_BLOB)
    oid = tree.write()
    for _ in range(depth):
        tb = repo.TreeBuilder()
        tb.insert("d", oid, pygit2.GIT_FILEMODE_TREE)
        oid = tb.write()
    root = repo.TreeBuilder(repo[tip].tree)
    if top in repo[tip].tree:   # beside what is there (agents/core/...)
        sub = repo.TreeBuilder(repo[repo[tip].tree[top].id])
        sub.insert("d", oid, pygit2.GIT_FILEMODE_TREE)
        oid = sub.write()
    root.insert(top, oid, pygit2.GIT_FILEMODE_TREE)
    sig = pygit2.Signature("core/juno", "juno@core.gitdrop")
    return repo.create_commit(None, sig, sig, "deep\n", root.write(), [pygit2.Oid(hex=tip)])


@pytest.mark.parametrize("top", ["agents", "tasks"])
def test_a_tree_nested_thousands_deep_is_refused_by_rule(source, tmp_path, top):
    """Import (with and without --name), verify and the push hook walked such a tree
    one Python call a level: a RecursionError traceback (the hook refused, but as a
    failure of its own). Each now refuses it by rule format, naming the commit."""
    bundle = str(tmp_path / "dev.bundle")
    cli(source.path, "room", "export", "dev", bundle)
    deep = tampered(source, bundle, tmp_path,
                    lambda repo, tip: deep_commit(repo, str(tip.id), top))
    b = hubmod.init(str(tmp_path / "b.git"))
    before = state(b.path)
    for name in ([], ["--name", "dev2"]):
        refused, p = cli(b.path, "room", "import", deep, *name, ok=False)
        assert p.returncode == 3 and refused["rule"] == "format", (refused, p.stderr)
        assert f"{top}/d/d/" in refused["reason"] and "deeper than 16" in refused["reason"]
        assert "deep" in refused["commit"] and "Traceback" not in p.stderr
    assert state(b.path) == before
    # in a hub's refs by hand (no hook), gitdrop verify says the same
    git("fetch", "-q", deep, "refs/heads/rooms/dev:refs/heads/rooms/dev", cwd=b.path)
    refused, p = cli(b.path, "verify", "dev", ok=False)
    assert p.returncode == 3 and refused["rule"] == "format", (refused, p.stderr)
    assert "deeper than 16" in refused["reason"] and "Traceback" not in p.stderr
    # pushed, the hook refuses it by the same rule, in its own words
    tip = source.store.room_tip("dev")
    git("fetch", "-q", deep, "refs/heads/rooms/dev:refs/heads/deep", cwd=source.path)
    p = git("push", source.path, "refs/heads/deep:refs/heads/rooms/dev", cwd=source.path,
            check=False)
    assert p.returncode != 0 and "refused by rule format" in p.stderr, p.stderr
    assert "deeper than 16" in p.stderr and "the hook failed" not in p.stderr
    assert source.store.room_tip("dev") == tip


def test_an_extension_is_judged_at_receipt_and_no_history_from_the_future(source, tmp_path):
    """An import judged every commit with no clock: a bundle extending a room here
    reaped a task whose lease was live here (or took a lease another held, or brought
    a flood of messages past the loop guard), and a room's history could be dated in
    2100. Commits extending a room are judged as a push is, but for their dates (made
    before); no commit may be dated ahead of this hub's clock."""
    import time
    from gitdrop.core import Room
    b = hubmod.init(str(tmp_path / "b.git"))
    bundle = str(tmp_path / "dev.bundle")
    cli(source.path, "room", "export", "dev", bundle)
    cli(b.path, "room", "import", bundle)
    tid = source.room("dev").list_tasks()[0]["id"]
    later = int(time.time()) + 7 * 86400   # the source's clock: spartan's lease is long gone
    Room(source.store, "dev", clock=lambda: later).move_task("core/juno", tid, "reap")
    cli(source.path, "room", "export", "dev", bundle)

    def dated_now(repo, tip):   # the reap as it would be made by hand, now
        when = int(time.time())
        a = pygit2.Signature(tip.author.name, tip.author.email, when, 0)
        return repo.create_commit(None, a, a, tip.message, tip.tree_id, tip.parent_ids)
    reap = tampered(source, bundle, tmp_path, dated_now)
    before = state(b.path)
    refused, _ = cli(b.path, "room", "import", reap, ok=False)
    assert refused["rule"] == "task-lease", refused
    assert "a reap needs an expired lease" in refused["reason"], refused
    assert state(b.path) == before
    # the same, dated as the source made it: from the future
    refused, _ = cli(b.path, "room", "import", bundle, ok=False)
    assert refused["rule"] == "clock", refused
    # a room new to a hub: its history as verify judges it, but not from the future
    c = hubmod.init(str(tmp_path / "c.git"))
    refused, _ = cli(c.path, "room", "import", bundle, ok=False)
    assert refused["rule"] == "clock" and "ahead of this hub's clock" in refused["reason"]
    assert not c.store.tip("refs/heads/rooms/dev")


def test_a_team_claimed_here_while_the_room_is_judged_stops_the_import(source, tmp_path,
                                                                      monkeypatch):
    """The bundle's team core is missing here when the import plans it; while the room
    is judged, core/eve claims team core. The room landed naming the bundle's lead,
    one the registry does not have, who then acted as the room's lead."""
    b = hubmod.init(str(tmp_path / "b.git"))
    bundle = str(tmp_path / "dev.bundle")
    bundlemod.export(source.store, "dev", bundle)
    real, raced = verifymod.check_commits, []

    def racing(reader, ref, *a, **k):
        if ref == "refs/heads/rooms/dev" and not raced:
            raced.append(hubmod.Hub(b.path).register_team("core", "core/eve", [],
                                                          by="core/eve"))
        return real(reader, ref, *a, **k)
    monkeypatch.setattr(verifymod, "check_commits", racing)
    with pytest.raises(Refusal) as e:
        bundlemod.import_room(b, bundle)
    assert raced and e.value.rule != "error"
    assert not b.store.tip("refs/heads/rooms/dev")           # the room did not land
    assert b.team("core")["lead"] == "core/eve"


def test_an_extension_is_not_dated_before_the_room_it_extends(source, tmp_path):
    """Past dates are let in for an extension (it was made before), but 2,001 of them
    two days back hid every idempotency key behind them, so a retry of a key used a
    minute before was applied twice. A commit is not dated before the one it builds on."""
    import time
    b = hubmod.init(str(tmp_path / "b.git"))
    bundle = str(tmp_path / "dev.bundle")
    cli(source.path, "room", "export", "dev", bundle)
    cli(b.path, "room", "import", bundle)
    source.room("dev").send("core/juno", "core/spartan", "two days late")
    cli(source.path, "room", "export", "dev", bundle)

    def two_days_back(repo, tip):
        when = int(time.time()) - 2 * 86400
        a = pygit2.Signature(tip.author.name, tip.author.email, when, 0)
        return repo.create_commit(None, a, a, tip.message, tip.tree_id, tip.parent_ids)
    before = state(b.path)
    refused, _ = cli(b.path, "room", "import", tampered(source, bundle, tmp_path,
                                                         two_days_back), ok=False)
    assert refused["rule"] == "clock" and "before the commit it builds on" in refused["reason"]
    assert state(b.path) == before
    # dated as made, after the room it extends: taken
    got, _ = cli(b.path, "room", "import", bundle)
    assert got["extended"] is True and got["commits"] == 1


def test_an_import_after_one_killed_holding_the_rooms_lock_goes_through(source, tmp_path):
    """A kill while the import held the new room's ref lock: the next import cleared
    the dead lock, then said the room 'moved in this hub while it was imported' (exit
    6) and wrote nothing; only a third run went through."""
    b = hubmod.init(str(tmp_path / "b.git"))
    bundle = str(tmp_path / "dev.bundle")
    cli(source.path, "room", "export", "dev", bundle)
    lock = os.path.join(b.path, "refs", "heads", "rooms", "dev.lock")
    os.makedirs(os.path.dirname(lock), exist_ok=True)
    with open(lock, "w"):   # as a killed writer leaves it: nobody holds it
        pass
    os.utime(lock, (time.time() - 60, time.time() - 60))
    got, _ = cli(b.path, "room", "import", bundle)
    assert got["commits"] > 5 and b.store.tip("refs/heads/rooms/dev") == \
        source.store.room_tip("dev")
    assert not os.path.exists(lock)
