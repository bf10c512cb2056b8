"""gitdrop room export / import: a room's history and the teams it needs in one git
bundle, brought into a second hub, judged by the rules first (a tampered bundle is
refused by rule with nothing written), verified there, commit for commit the same."""

import json
import os
import subprocess
import sys

import pygit2
import pytest

from gitdrop import fmt
from gitdrop import hub as hubmod

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


@pytest.fixture
def source(tmp_path):
    """Hub A with a room dev for team core: agents, messages, a claimed task."""
    a = hubmod.init(str(tmp_path / "a.git"))
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
