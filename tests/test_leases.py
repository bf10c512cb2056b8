"""Path leases: the rules on both paths (the core's writes and a raw `git push`
through the hub's hook), the glob overlap test, the CLI, and the guard's hooks in
a real work repository."""

import os
import subprocess
import sys
import time

import pygit2
import pytest
from hypothesis import given, settings, strategies as st

from gitdrop import fmt, model
from gitdrop.core import Room
from gitdrop.errors import Refusal
from gitdrop.guard import matches
from gitdrop.store import Reader
from gitdrop.verify import check_commits

from conftest import git, refused_rule


def at(team, t):
    """The room on a hub whose clock reads t[0]."""
    return Room(team.store, "lobby", clock=lambda: t[0])


# --- globs ------------------------------------------------------------------------

def test_glob_overlap_is_conservative_and_matching_follows_it():
    assert model.globs_overlap("src/api/**", "src/api/x.py")
    assert model.globs_overlap("src/api", "src/api/x.py")          # a directory covers below
    assert model.globs_overlap("src/*.py", "src/**")
    assert not model.globs_overlap("src/api/**", "src/web/**")
    assert not model.globs_overlap("src/api", "src/apix")
    assert not model.globs_overlap("docs/a.md", "docs/b.md")
    assert matches("src/api/**", "src/api/v1/x.py") and matches("src/api", "src/api/x.py")
    assert matches("src/*.py", "src/a.py") and not matches("src/*.py", "src/a/b.py")
    assert matches("**/*.md", "README.md") and matches("**/*.md", "a/b/c.md")
    assert not matches("src/api/**", "src/apix/y.py")
    # soundness: whenever a path matches both, the globs are said to overlap
    globs = ["src/**", "src/api/**", "src/api", "src/*.py", "src/a?.py", "**/*.md", "docs",
             "docs/x.md", "src/apix/**", "*"]
    paths = ["src/a.py", "src/ab.py", "src/api/x.py", "src/api", "docs/x.md", "README.md",
             "src/apix/y.md", "docs"]
    for a in globs:
        for b in globs:
            if any(matches(a, p) and matches(b, p) for p in paths):
                assert model.globs_overlap(a, b), (a, b)
    for bad in ("", "/etc/x", "a/../b", "a//b", "./a"):
        assert model.glob_problem(bad), bad


def _reference(glob: str, path: str) -> bool:
    """The globs' meaning as a regex: right, and exponential on a hostile glob."""
    import re
    out, i = [], 0
    while i < len(glob):
        for wild, rx in (("**/", "(?:.*/)?"), ("**", ".*"), ("*", "[^/]*"), ("?", "[^/]")):
            if glob.startswith(wild, i):
                out.append(rx)
                i += len(wild)
                break
        else:
            out.append(re.escape(glob[i]))
            i += 1
    return re.fullmatch("".join(out) + "(?:/.*)?", path) is not None


@given(st.lists(st.sampled_from(["a", "b", "/", "*", "**", "**/", "?", "."]), max_size=7),
       st.lists(st.sampled_from(["a", "b", "/", "."]), max_size=9))
@settings(max_examples=3000, deadline=None)
def test_matching_means_what_the_glob_says(glob, path):
    glob, path = "".join(glob), "".join(path)
    assert matches(glob, path) == _reference(glob, path), (glob, path)


def test_a_hostile_glob_is_matched_in_linear_time():
    """A lease on '**a' * 100 + 'b' took the guard (every teammate's commit check)
    minutes against a long path: a regex backtracked; the matcher walks once."""
    import attacks
    glob = attacks.BACKTRACKING_GLOBS[0]
    assert not model.glob_problem(glob)   # a lease anyone may take
    start = time.monotonic()
    assert not matches(glob, "a" * 300) and matches(glob, "a" * 120 + "b/x")
    assert time.monotonic() - start < 2


# --- the core ---------------------------------------------------------------------

def test_core_overlap_refused_naming_the_holder_and_expiry(team):
    t = [1_800_000_000]
    room = at(team, t)
    lease = room.take_lease("core/kai", "src/api/**", ttl=600)
    assert lease["until"] == t[0] + 600 and lease["mode"] == "exclusive"
    with pytest.raises(Refusal) as e:
        room.take_lease("core/spartan", "src/api/routes.py", shared=True)
    assert e.value.rule == "lease-conflict"
    assert "core/kai" in e.value.reason and lease["id"] in e.value.reason
    assert "2027-01-15 08:10:00Z" in e.value.reason        # the holder's expiry
    room.take_lease("core/spartan", "src/web/**")             # no overlap: fine
    room.take_lease("core/kai", "src/api/v2/**")              # my own leases never conflict


def test_core_shared_leases_coexist_but_not_with_an_exclusive(team):
    t = [1_800_000_000]
    room = at(team, t)
    room.take_lease("core/kai", "docs/**", shared=True)
    room.take_lease("core/spartan", "docs/api.md", shared=True)
    with pytest.raises(Refusal) as e:
        room.take_lease("core/juno", "docs", shared=False)
    assert e.value.rule == "lease-conflict" and "(shared)" in e.value.reason
    assert len(room.leases()) == 2


def test_core_expired_lease_no_longer_blocks(team):
    t = [1_800_000_000]
    room = at(team, t)
    old = room.take_lease("core/kai", "src/**", ttl=60)
    t[0] += 60                                                # the hub's clock: expired
    assert room.leases() == [] and room.leases(live=False)[0]["id"] == old["id"]
    room.take_lease("core/spartan", "src/main.py")


def test_core_release_by_holder_or_lead_only_and_ttl_bounded(team):
    t = [1_800_000_000]
    room = at(team, t)
    a = room.take_lease("core/kai", "a/**")
    with pytest.raises(Refusal) as e:
        room.release_lease("core/spartan", a["id"])
    assert e.value.rule == "lease-holder" and "core/kai" in e.value.reason
    room.release_lease("core/kai", "a/**")                    # by its glob
    b = room.take_lease("core/kai", "b/**")
    room.release_lease("core/juno", b["id"])                  # a lead
    assert room.leases() == []
    with pytest.raises(Refusal) as e:
        room.take_lease("core/kai", "c", ttl=model.DEFAULT_SETTINGS["max_lease_ttl"] + 3600)
    assert e.value.rule == "lease-ttl"


def test_an_agent_holds_at_most_max_leases_and_settings_that_stop_every_claim_are_refused(
        team):
    """No bound on one agent's path leases: 3,000 of them held the hook 65 s, and every
    teammate's guarded commit 10 s. And a task_lease past max_task_lease was taken,
    after which every claim was refused, and `ready --claim` said nothing was ready."""
    team.update_room("hub/admin", "room-settings", "few leases", settings={"max_leases": 3})
    for i in range(3):
        team.take_lease("core/kai", f"d{i}/**")
    with pytest.raises(Refusal) as e:
        team.take_lease("core/kai", "d3/**")
    assert e.value.rule == "lease-limit" and "3" in e.value.reason
    team.take_lease("core/spartan", "d3/**")            # per agent
    team.release_lease("core/kai", "d0/**")
    team.take_lease("core/kai", "d4/**")
    with pytest.raises(Refusal) as e:
        team.update_room("hub/admin", "room-settings", "long leases",
                         settings={"task_lease": 7200, "max_task_lease": 3600})
    assert e.value.rule == "format" and "max_task_lease" in e.value.reason


# --- raw pushes through the hub's hook ---------------------------------------------

def lease_doc(lid, holder, glob, until, mode="exclusive", taken=0):
    return fmt.dumps_toml({"id": lid, "holder": holder, "glob": glob, "mode": mode,
                           "until": until, "taken": taken or until - 600})


def push_verdict(hub, c, expect, now=None):
    """Push; the hook and the in-process rules (at the same clock) must agree."""
    before = hub.store.room_tip(c.room)
    repo = pygit2.Repository(c.path)
    try:
        check_commits(Reader(repo), model.ROOM_PREFIX + c.room, before, str(repo.head.target),
                      now=now or int(time.time()))
        local = None
    except Refusal as e:
        local = e.rule
    ok, err = c.push()
    pushed = None if ok else refused_rule(err)
    assert local == expect and pushed == expect, (local, pushed, err)
    return err


def test_push_overlap_refused_shared_coexist(hub, team, clone):
    now = int(time.time())
    team.take_lease("core/kai", "src/api/**", ttl=1200)
    team.take_lease("core/kai", "docs/**", shared=True, ttl=1200)
    c = clone("core/spartan")
    c.write("leases/s1.toml", lease_doc("s1", "core/spartan", "src/api/x.py", now + 600))
    c.commit("spartan leases src/api/x.py")
    err = push_verdict(hub, c, "lease-conflict")
    assert "core/kai" in err and "src/api/**" in err
    c.pull()
    c.write("leases/s2.toml", lease_doc("s2", "core/spartan", "docs/a.md", now + 600, "shared"))
    c.commit("spartan shares docs/a.md")
    push_verdict(hub, c, None)
    c.write("leases/s3.toml", lease_doc("s3", "core/kai", "x/**", now + 600))
    c.commit("a lease for somebody else")
    push_verdict(hub, c, "format")


def test_push_expiry_is_the_hubs_clock_not_the_pushers_date(hub, team, clone):
    team.update_room("hub/admin", "room-settings", "wide clock skew",
                     settings={"clock_skew": 600, "loop_window": 3600})
    now = int(time.time())
    # A lease that ran out 100s ago by the hub's clock no longer blocks.
    Room(team.store, "lobby", clock=lambda: now - 700).take_lease("core/kai", "old/**", ttl=600)
    # One live for 300s more blocks, even from a commit dated after its end.
    team.take_lease("core/kai", "live/**", ttl=300)
    c = clone("core/spartan")
    c.write("leases/e1.toml", lease_doc("e1", "core/spartan", "old/a.py", now + 600))
    c.commit("spartan takes old/a.py")
    push_verdict(hub, c, None)
    c.write("leases/e2.toml", lease_doc("e2", "core/spartan", "live/a.py", now + 900))
    date = f"@{now + 400} +0000"
    git("add", "-A", cwd=c.path)
    git("commit", "-q", "-m", "spartan takes live/a.py (dated later)", cwd=c.path,
        env={"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date})
    push_verdict(hub, c, "lease-conflict")


def test_a_lease_the_hub_takes_is_one_verify_takes_again(hub, team, clone):
    """A lease pushed in a commit dated 25 s back (within clock_skew), running its
    limit from the hub's clock, was taken, and then refused by verify for good (the
    room's export could not be imported anywhere): its length was measured from the
    hub's clock at receipt and from the commit's date after."""
    s = team.view().settings
    now = int(time.time())
    c = clone("core/spartan")
    c.write("leases/v1.toml", lease_doc("v1", "core/spartan", "src/**",
                                        now + s["max_lease_ttl"] + 20))
    date = f"@{now - 25} +0000"
    git("add", "-A", cwd=c.path)
    git("commit", "-q", "-m", "spartan takes src/** (dated back)", cwd=c.path,
        env={"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date})
    push_verdict(hub, c, "lease-ttl", now=now)
    git("reset", "-q", "--hard", "HEAD~1", cwd=c.path)
    c.write("leases/v1.toml", lease_doc("v1", "core/spartan", "src/**",
                                        now - 25 + s["max_lease_ttl"]))
    git("add", "-A", cwd=c.path)
    git("commit", "-q", "-m", "spartan takes src/** (dated back, within)", cwd=c.path,
        env={"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date})
    push_verdict(hub, c, None, now=now)
    assert [op for _, op in hub.verify("lobby")][-1] == "lease-take"


def test_push_release_by_non_holder_refused(hub, team, clone):
    lease = team.take_lease("core/kai", "src/**")
    c = clone("core/spartan")
    c.delete(f"leases/{lease['id']}.toml").commit("spartan drops kai's lease")
    err = push_verdict(hub, c, "lease-holder")
    assert "core/kai" in err
    c.pull().as_("core/kai")
    c.delete(f"leases/{lease['id']}.toml").commit("kai releases")
    push_verdict(hub, c, None)
    assert team.leases() == []


# --- the CLI and the guard in a real work repository --------------------------------

def gd(hub, agent, *args, cwd=None, check=True):
    env = dict(os.environ, GITDROP_HUB=hub.path, GITDROP_AGENT=agent, NO_COLOR="1")
    env.pop("GITDROP_ROOM", None)
    p = subprocess.run([sys.executable, "-m", "gitdrop", *args], cwd=cwd, env=env,
                       capture_output=True, text=True)
    if check:
        assert p.returncode == 0, p.stderr
    return p


def work_repo(tmp_path, hub, agent, name="work"):
    path = tmp_path / name
    git("init", "-q", str(path))
    git("config", "user.name", agent, cwd=path)
    git("config", "user.email", "x@example.org", cwd=path)
    gd(hub, agent, "guard", "install", cwd=path)
    return str(path)


def commit(path, files, message="work", env=None):
    for name, text in files.items():
        full = os.path.join(path, name)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            f.write(text)
    git("add", "-A", cwd=path)
    e = dict(os.environ)
    e.pop("GITDROP_AGENT", None)
    e.pop("GITDROP_GUARD", None)
    e.update(env or {})
    return subprocess.run(["git", "commit", "-q", "-m", message], cwd=path, env=e,
                          capture_output=True, text=True)


def test_cli_lease_take_list_release(hub, team):
    r = gd(hub, "core/kai", "lease", "take", "src/api/**", "--ttl", "10m", "--json")
    import json
    lease = json.loads(r.stdout)["lease"]
    assert lease["until"] - lease["taken"] == 600
    p = gd(hub, "core/spartan", "lease", "take", "src/api/x.py", check=False)
    assert p.returncode == 3 and "lease-conflict" in p.stderr and "core/kai" in p.stderr
    out = gd(hub, "core/spartan", "lease", "list").stdout
    assert "src/api/**" in out and "core/kai" in out and lease["id"] in out
    p = gd(hub, "core/spartan", "lease", "release", lease["id"], check=False)
    assert p.returncode == 3 and "lease-holder" in p.stderr
    gd(hub, "core/kai", "lease", "release", "src/api/**")
    assert "no live leases" in gd(hub, "core/kai", "lease", "list").stdout
    assert gd(hub, "core/kai", "lease", "take", "x", "--ttl", "soon", check=False).returncode == 2


def test_guard_refuses_a_commit_on_anothers_exclusive_lease(hub, team, tmp_path):
    lease = team.take_lease("core/kai", "src/api/**")
    team.take_lease("core/kai", "docs/**", shared=True)
    work = work_repo(tmp_path, hub, "core/spartan")
    with open(os.path.join(work, ".git", "hooks", "pre-commit")) as f:
        assert "GITDROP_GUARD=off" in f.read()
    p = commit(work, {"src/api/x.py": "x\n"})
    assert p.returncode != 0
    assert "core/kai" in p.stderr and lease["id"] in p.stderr and "src/api/x.py" in p.stderr
    assert "GITDROP_GUARD=off" in p.stderr                      # the bypass is named
    # shared leases do not block; paths outside any lease do not either
    git("reset", "-q", cwd=work)
    os.remove(os.path.join(work, "src/api/x.py"))
    assert commit(work, {"docs/a.md": "a\n", "src/web/y.py": "y\n"}).returncode == 0
    # the holder commits freely in its own work repository
    kai = work_repo(tmp_path, hub, "core/kai", "kai")
    assert commit(kai, {"src/api/x.py": "x\n"}).returncode == 0
    # the bypass, for people
    assert commit(work, {"src/api/z.py": "z\n"}, env={"GITDROP_GUARD": "off"}).returncode == 0
    assert commit(work, {"src/api/w.py": "w\n"}).returncode != 0
    p = subprocess.run(["git", "commit", "-q", "--no-verify", "-m", "w"], cwd=work,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_guard_expired_release_and_offline(hub, team, tmp_path):
    now = int(time.time())
    Room(team.store, "lobby", clock=lambda: now - 700).take_lease("core/kai", "old/**", ttl=600)
    live = team.take_lease("core/kai", "new/**")
    work = work_repo(tmp_path, hub, "core/spartan")
    assert commit(work, {"old/a.py": "a\n"}).returncode == 0       # expired: no block
    assert commit(work, {"new/a.py": "a\n"}).returncode != 0
    # Offline: the hub out of reach, the last fetched state still judges.
    git("config", "gitdrop.hub", str(tmp_path / "gone.git"), cwd=work)
    p = commit(work, {"new/a.py": "a\n"})
    assert p.returncode != 0 and "last fetched state" in p.stderr
    git("reset", "-q", cwd=work)
    os.remove(os.path.join(work, "new/a.py"))
    p = commit(work, {"other/a.py": "a\n"})   # let through, but not silently
    assert p.returncode == 0 and "out of reach" in p.stderr, p.stderr
    git("config", "gitdrop.hub", hub.path, cwd=work)
    team.release_lease("core/kai", live["id"])
    assert commit(work, {"new/a.py": "a\n"}).returncode == 0


def test_guard_pre_push_refuses_commits_made_with_no_verify(hub, team, tmp_path):
    team.take_lease("core/kai", "src/**")
    upstream = tmp_path / "up.git"
    git("init", "-q", "--bare", str(upstream))
    work = work_repo(tmp_path, hub, "core/spartan")
    git("remote", "add", "origin", str(upstream), cwd=work)
    assert commit(work, {"README": "r\n"}).returncode == 0
    git("push", "-q", "origin", "HEAD:main", cwd=work)
    commit(work, {"src/a.py": "a\n"}, env={"GITDROP_GUARD": "off"})
    e = dict(os.environ)
    e.pop("GITDROP_AGENT", None)
    e.pop("GITDROP_GUARD", None)
    p = subprocess.run(["git", "push", "-q", "origin", "HEAD:main"], cwd=work, env=e,
                       capture_output=True, text=True)
    assert p.returncode != 0 and "core/kai" in p.stderr and "src/a.py" in p.stderr
    p = subprocess.run(["git", "push", "-q", "origin", "HEAD:main"], cwd=work,
                       env=dict(e, GITDROP_GUARD="off"), capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_the_guard_runs_gitdrop_not_the_projects_files(hub, team, tmp_path):
    """git runs the hook in the work tree and `python -m` imported from there first: a
    gitdrop/guard.py committed to the project replaced the guard (and ran on every
    teammate's commit), a top-level subprocess.py stopped every commit."""
    team.take_lease("core/kai", "src/api/**")
    work = work_repo(tmp_path, hub, "core/spartan")
    ran = tmp_path / "ran"
    planted = f"open({str(ran)!r}, 'w').write('planted')\n"
    assert commit(work, {"gitdrop/__init__.py": "", "gitdrop/guard.py": planted,
                         "subprocess.py": planted, "json.py": planted},
                  env={"GITDROP_GUARD": "off"}).returncode == 0
    assert commit(work, {"notes.txt": "n\n"}).returncode == 0
    p = commit(work, {"src/api/x.py": "x\n"})
    assert p.returncode != 0 and "core/kai" in p.stderr, p.stderr
    assert not ran.exists()


def test_the_guard_sees_what_a_merge_changes_itself(hub, team, tmp_path):
    """A merge's own changes (a conflict resolved, an edit made in the merge) were not
    among the pushed paths: an edit of a leased file went out inside a merge. What a
    merge takes from a parent is not counted again."""
    upstream = tmp_path / "up.git"
    git("init", "-q", "--bare", str(upstream))
    work = work_repo(tmp_path, hub, "core/spartan")
    git("remote", "add", "origin", str(upstream), cwd=work)
    assert commit(work, {"src/api/x.py": "1\n", "README": "r\n"}).returncode == 0
    git("branch", "-M", "main", cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    git("checkout", "-q", "-b", "side", cwd=work)
    assert commit(work, {"side.txt": "s\n"}).returncode == 0
    git("checkout", "-q", "main", cwd=work)
    assert commit(work, {"main.txt": "m\n"}).returncode == 0
    git("merge", "-q", "--no-commit", "side", cwd=work)
    team.take_lease("core/kai", "src/api/**")
    with open(os.path.join(work, "src/api/x.py"), "w") as f:
        f.write("rewritten in the merge\n")
    git("add", "-A", cwd=work)
    e = {k: v for k, v in os.environ.items() if k not in ("GITDROP_AGENT", "GITDROP_GUARD")}
    subprocess.run(["git", "commit", "-q", "--no-verify", "-m", "merge"], cwd=work, env=e,
                   check=True)
    p = subprocess.run(["git", "push", "-q", "origin", "main"], cwd=work, env=e,
                       capture_output=True, text=True)
    assert p.returncode != 0 and "src/api/x.py" in p.stderr and "core/kai" in p.stderr, p.stderr
    # a merge that only brings another branch's work is not held up by it
    git("reset", "-q", "--hard", "HEAD~1", cwd=work)
    git("merge", "-q", "--no-edit", "side", cwd=work, env={"GITDROP_GUARD": "off"})
    p = subprocess.run(["git", "push", "-q", "origin", "main"], cwd=work, env=e,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_a_lease_under_a_submodule_covers_moving_the_submodule(hub, team, tmp_path):
    """Moving a submodule (its gitlink) changes every file under it; a lease on
    vendor/lib/** did not stop it, as vendor/lib is not under vendor/lib/."""
    lib = tmp_path / "lib"
    git("init", "-q", str(lib))
    git("config", "user.name", "x", cwd=lib)
    git("config", "user.email", "x@example.org", cwd=lib)
    for text in ("1\n", "2\n"):
        with open(lib / "core.c", "w") as f:
            f.write(text)
        git("add", "-A", cwd=lib)
        git("commit", "-q", "-m", text.strip(), cwd=lib)
    work = work_repo(tmp_path, hub, "core/spartan")
    git("-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib), "vendor/lib",
        cwd=work)
    git("-C", "vendor/lib", "checkout", "-q", "HEAD~1", cwd=work)
    git("add", "vendor/lib", cwd=work)
    assert commit(work, {}).returncode == 0
    team.take_lease("core/kai", "vendor/lib/**")
    git("-C", "vendor/lib", "checkout", "-q", "master" if git(
        "-C", "vendor/lib", "rev-parse", "--verify", "--quiet", "master", cwd=work,
        check=False).returncode == 0 else "main", cwd=work)
    git("add", "vendor/lib", cwd=work)
    p = commit(work, {}, "bump lib")
    assert p.returncode != 0 and "vendor/lib" in p.stderr and "core/kai" in p.stderr, p.stderr
    # a lease elsewhere does not hold it up
    team.release_lease("core/kai", "vendor/lib/**")
    team.take_lease("core/kai", "vendor/other/**")
    assert commit(work, {}, "bump lib").returncode == 0


def test_a_submodule_removed_on_a_new_branch_is_judged_by_the_leases_under_it(hub, team,
                                                                               tmp_path):
    """Pushed as a new branch, a commit removing a submodule (or putting a file in its
    place) went out: whether a path was a submodule was asked of the pushed tip only,
    where it no longer is one."""
    upstream = tmp_path / "up.git"
    git("init", "-q", "--bare", str(upstream))
    work = work_repo(tmp_path, hub, "core/spartan")
    git("remote", "add", "origin", str(upstream), cwd=work)
    git("update-index", "--add", "--cacheinfo", "160000," + "1" * 40 + ",vendor/lib", cwd=work)
    git("commit", "-q", "--no-verify", "-m", "base with a submodule", cwd=work)
    git("push", "-q", "--no-verify", "origin", "HEAD:refs/heads/main", cwd=work)
    git("fetch", "-q", "origin", cwd=work)
    team.take_lease("core/kai", "vendor/lib/**")
    git("rm", "-q", "--cached", "vendor/lib", cwd=work)
    e = {k: v for k, v in os.environ.items() if k not in ("GITDROP_AGENT", "GITDROP_GUARD")}
    subprocess.run(["git", "commit", "-q", "--no-verify", "-m", "drop lib"], cwd=work, env=e,
                   check=True)
    for branch in ("main", "feature"):   # an existing branch, and a new one
        p = subprocess.run(["git", "push", "-q", "origin", f"HEAD:refs/heads/{branch}"],
                           cwd=work, env=e, capture_output=True, text=True)
        assert p.returncode != 0 and "vendor/lib" in p.stderr and "core/kai" in p.stderr, \
            (branch, p.stderr)
