"""A room in one file: `export` writes a git bundle of the room's branch and the
team registry entries its teams need; `import_room` brings it into another hub.

The bundle holds two refs: refs/heads/rooms/<room> (the room's history, commit for
commit, so ids, replies and read cursors stay valid) and refs/gitdrop/export/teams
(one commit whose tree holds teams/<team>.toml of each team the room names).

An import is judged as a push would be, before anything is written: the bundle is
unpacked into a scratch repository that borrows the hub's objects; there the
missing teams are committed on a copy of the hub branch and checked by the hub's
rules, then the room's new commits by the room rules (the same checks as the hook
and gitdrop verify; dates are not held to the clock, the history is old). Only then
are the teams registered in the hub and the room's ref moved (compare-and-swap).
"""

import os
import shutil
import subprocess
import tempfile

from . import fmt, hubrules, model
from .errors import Conflict, NotFound, Refusal, UsageError

TEAMS_REF = "refs/gitdrop/export/teams"


def _git(git_dir: str, *args, check=True) -> subprocess.CompletedProcess:
    env = dict(os.environ, GIT_DIR=git_dir, GIT_TERMINAL_PROMPT="0")
    for k in ("GIT_OBJECT_DIRECTORY", "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_QUARANTINE_PATH"):
        env.pop(k, None)
    p = subprocess.run(["git", *args], env=env, capture_output=True, text=True,
                       stdin=subprocess.DEVNULL)
    if check and p.returncode != 0:
        raise UsageError(f"git {args[0]} failed: {p.stderr.strip()[-300:]}",
                         "check the file and the hub")
    return p


def _scratch(hub_path: str) -> str:
    """A bare repository that sees the hub's objects (alternates) and writes its own."""
    tmp = tempfile.mkdtemp(prefix="gitdrop-bundle-")
    subprocess.run(["git", "init", "-q", "--bare", tmp], check=True, capture_output=True)
    with open(os.path.join(tmp, "objects", "info", "alternates"), "w") as f:
        f.write(os.path.join(os.path.abspath(hub_path), "objects") + "\n")
    return tmp


def teams_needed(view) -> list[str]:
    """The teams a room names: member teams, teams with a lead there, agents' teams."""
    names = set(view.room["teams"]) | set(view.room["leads"])
    names |= {model.split_agent(a["id"])[0] for a in view.agents() if "/" in a["id"]}
    return sorted(n for n in names if n not in model.RESERVED_TEAMS)


def export(store, room: str, path: str) -> dict:
    """Write room `room` of `store` (a hub or a remote hub's mirror) to a bundle."""
    import pygit2
    ref = store.room_ref(room)
    tip = store.room_tip(room)
    view = store.view(room)
    hub_tip = store.tip(model.HUB_REF)
    hub_tree = store.reader.commit(hub_tip).tree if hub_tip else None
    tmp = _scratch(store.path)
    try:
        repo = pygit2.Repository(tmp)
        tb, sub = repo.TreeBuilder(), repo.TreeBuilder()
        teams = []
        for team in teams_needed(view):
            blob = store.reader.blob_id(hub_tree, hubrules.team_path(team)) if hub_tree else None
            if blob:
                sub.insert(team + ".toml", pygit2.Oid(hex=blob), pygit2.GIT_FILEMODE_BLOB)
                teams.append(team)
        tb.insert("teams", sub.write(), pygit2.GIT_FILEMODE_TREE)
        sig = pygit2.Signature("hub/admin", "admin@hub.gitdrop")
        teams_commit = repo.create_commit(TEAMS_REF, sig, sig, f"teams of room {room}\n",
                                          tb.write(), [])
        repo.references.create(ref, pygit2.Oid(hex=tip))
        out = os.path.abspath(path)
        part = out + ".part"
        _git(tmp, "bundle", "create", "--quiet", part, ref, TEAMS_REF)
        os.replace(part, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"room": room, "file": out, "tip": tip, "teams": teams,
            "teams_commit": str(teams_commit)}


def _heads(path: str) -> tuple[str, str, str]:
    """(room, room tip, teams commit) named by the bundle's refs, or a refusal."""
    if not os.path.isfile(path):
        raise NotFound(f"no file {path}", "give the file gitdrop room export wrote")
    p = subprocess.run(["git", "bundle", "list-heads", path], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        raise Refusal("format", f"{path} is not a git bundle: {p.stderr.strip()[-200:]}",
                      "give the file gitdrop room export wrote")
    rooms, teams, other = [], "", []
    for line in p.stdout.splitlines():
        oid, _, name = line.partition(" ")
        if name.startswith(model.ROOM_PREFIX) and model.is_name(name[len(model.ROOM_PREFIX):]):
            rooms.append((name[len(model.ROOM_PREFIX):], oid))
        elif name == TEAMS_REF:
            teams = oid
        else:
            other.append(name)
    if len(rooms) != 1 or other:
        raise Refusal("format", f"{path} must hold one room branch (and its teams), not "
                      f"{', '.join([model.ROOM_PREFIX + r for r, _ in rooms] + other) or 'nothing'}",
                      "export one room with gitdrop room export ROOM FILE")
    return rooms[0][0], rooms[0][1], teams


def import_room(hub, path: str) -> dict:
    """Bring a bundle's room into `hub` (a hub on this machine), judged by the rules
    first; nothing is written unless all of it is accepted."""
    import pygit2
    from .catfile import CatFile
    from .verify import check_commits
    if getattr(hub, "url", ""):
        raise UsageError("a room is imported on the hub's machine: it moves a room's ref, "
                         "which a push may not do", f"copy {path} there and run gitdrop "
                         f"--hub /path/to/hub.git room import {path}")
    room, new, teams_commit = _heads(path)
    store = hub.store
    ref = store.room_ref(room)
    if store.tip(model.ARCHIVE_PREFIX + room):
        raise Refusal("format", f"room {room!r} is archived in this hub; an import cannot "
                      "re-create it", f"restore it first (gitdrop room restore {room}) to "
                      "import a history that extends it", commit=ref)
    old = store.tip(ref)
    if old == new or (old and _contains(store.path, old, new)):
        return {"room": room, "tip": new, "commits": 0, "teams": [], "up_to_date": True}
    tmp = _scratch(store.path)
    reader = None
    try:
        specs = [f"{ref}:refs/import/room"] + ([f"{TEAMS_REF}:refs/import/teams"]
                                               if teams_commit else [])
        p = _git(tmp, "-c", "fetch.fsckObjects=true", "-c", "transfer.fsckObjects=true",
                 "fetch", "--quiet", "--no-tags", "--no-write-fetch-head", path, *specs,
                 check=False)
        if p.returncode != 0:
            raise Refusal("format", f"{path} is damaged or incomplete: "
                          f"{p.stderr.strip()[-300:]}", "export the room again")
        repo = pygit2.Repository(tmp)
        hub_tip = store.tip(model.HUB_REF)
        if hub_tip:
            repo.references.create(model.HUB_REF, pygit2.Oid(hex=hub_tip))
        missing = _plan_teams(hub, repo, teams_commit)
        new_hub = _commit_teams(repo, hub_tip, missing)
        reader = CatFile(tmp)
        if missing:   # the team registry's own rules, as for a push of the hub branch
            check_commits(reader, model.HUB_REF, hub_tip, new_hub, None)
        ops = check_commits(reader, ref, old, new, None)
        _check_leads_here(reader, room, new, new_hub)
        for t in missing:
            hub.register_team(t["name"], t["lead"], t["members"], by=t["lead"])
        _git(store.path, "-c", "fetch.fsckObjects=true", "fetch", "--quiet", "--no-tags",
             "--no-write-fetch-head", path, ref)
        # the store's own compare-and-swap: logged and synced like any write, and a
        # lock a killed writer left is cleared
        if not store._cas(ref, old, new, f"import of room {room}", store._writer()):
            raise Conflict(f"room {room} moved in this hub while it was imported",
                           "run the import again: it is judged against the room's new tip")
    finally:
        if reader is not None:
            reader.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return {"room": room, "tip": new, "commits": len(ops), "extended": bool(old),
            "teams": [t["name"] for t in missing], "up_to_date": False}


def _check_leads_here(reader, room: str, tip: str, hub_tip: str) -> None:
    """The history is judged as recorded (its leads were the source hub's); the room
    that arrives must name as leads only this hub's team leads, or an import would
    hand lead rights that this hub's registry does not give."""
    from .view import RoomView
    teams = hubrules.registry(reader, hub_tip) if hub_tip else None
    leads = RoomView(reader, reader.commit(tip).tree, tip, room).room["leads"]
    for team, lead in leads.items():
        if teams is None or teams.get(team) != lead:
            raise Refusal("lead-only", f"room {room!r} names {lead} as lead of team {team}, "
                          f"but this hub's team registry says "
                          f"{(teams or {}).get(team) or 'nobody'}",
                          f"import it into a hub where {team}'s lead is {lead} (gitdrop "
                          "team list shows this hub's), or have the room's lead re-synced "
                          "on its hub (gitdrop room join) and export it again",
                          commit=tip[:12])


def _contains(git_dir: str, tip: str, oid: str) -> bool:
    return _git(git_dir, "merge-base", "--is-ancestor", oid, tip, check=False).returncode == 0


def _plan_teams(hub, repo, teams_commit: str) -> list[dict]:
    """The bundle's teams this hub lacks; a team led by someone else here is refused."""
    if not teams_commit:
        return []
    tree = repo[teams_commit].tree
    out = []
    if "teams" not in tree:
        return out
    for e in repo[tree["teams"].id]:
        if not e.name.endswith(".toml"):
            continue
        name = e.name[:-5]
        try:
            doc = dict(hubrules.TEAM_FIELDS, **fmt.loads_toml(repo[e.id].data.decode("utf-8")))
        except (fmt.FormatError, UnicodeDecodeError) as err:
            raise Refusal("format", f"teams/{e.name} in the bundle is not a team file: {err}",
                          "export the room again") from None
        if doc.get("name") != name or not isinstance(doc.get("lead"), str):
            raise Refusal("format", f"teams/{e.name} in the bundle does not describe team "
                          f"{name}", "export the room again")
        here = hub.team(name, missing_ok=True)
        if here is None:
            out.append({"name": name, "lead": doc["lead"], "members": list(doc["members"]),
                        "text": repo[e.id].data.decode("utf-8")})
        elif here["lead"] != doc["lead"]:
            raise Refusal("lead-only", f"team {name} in this hub is led by {here['lead']}, "
                          f"but the room was exported with {doc['lead']} as its lead",
                          f"ask {here['lead']} to hand the team over (gitdrop team create "
                          f"{name} --lead {doc['lead']} --as {here['lead']}), then import again")
    return out


def _commit_teams(repo, hub_tip: str, missing: list[dict]) -> str:
    """On the scratch copy of the hub branch: one team-create commit per missing team,
    by its lead, as the hub's rules want them."""
    import pygit2
    tip = hub_tip
    for t in missing:
        base = repo[tip].tree if tip else None
        tb = repo.TreeBuilder(base) if base is not None else repo.TreeBuilder()
        sub = repo.TreeBuilder(repo[base["teams"].id]) if base is not None and \
            "teams" in base else repo.TreeBuilder()
        sub.insert(t["name"] + ".toml", repo.create_blob(t["text"].encode()),
                   pygit2.GIT_FILEMODE_BLOB)
        tb.insert("teams", sub.write(), pygit2.GIT_FILEMODE_TREE)
        name, email = t["lead"], f"{t['lead'].partition('/')[2]}@{t['name']}.gitdrop"
        sig = pygit2.Signature(name, email)
        msg = fmt.format_message(f"team {t['name']} created (lead {model.short(t['lead'])})",
                                 "", [("op", "team-create")])
        tip = str(repo.create_commit(None, sig, sig, msg, tb.write(),
                                     [pygit2.Oid(hex=tip)] if tip else []))
    if tip:
        repo.references.create(model.HUB_REF, pygit2.Oid(hex=tip), force=True)
    return tip
