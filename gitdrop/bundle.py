"""A room in one file: `export` writes a git bundle of the room's branch and the
team registry entries its teams need; `import_room` brings it into another hub.

The bundle holds two refs: refs/heads/rooms/<room> (the room's history, commit for
commit, so ids, replies and read cursors stay valid) and refs/gitdrop/export/teams
(one commit whose tree holds teams/<team>.toml of each team the room names).

An import is judged as a push would be, before anything is written: the bundle is
unpacked into a scratch repository (in the hub's own gitdrop/tmp, beside nothing
the hub reads) that borrows the hub's objects. There the room is renamed if asked
(every commit rewritten: see _Renamer), moved to the current layout if it is older
(layout.move_room, the hub's own move), the missing teams are committed on a copy
of the hub branch and checked by the hub's rules, then the room's new commits by
the room rules (the same checks as the hook and gitdrop verify: a new room's history
as verify judges it, no commit dated ahead of the clock; commits that extend a room of
this hub at receipt, as a push, but for their dates, made before: see _judge). Then the room's ref moves (compare-and-swap)
and only after it the teams are registered: an import that is refused or loses a
race writes nothing, and one killed between the two writes is finished by running
it again (the room is up to date, its missing teams are registered).
"""

import contextlib
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time

from . import fmt, hubrules, layout, model, rules, writequeue
from .errors import Conflict, GitdropError, NotFound, Refusal, UsageError
from .view import RoomView

try:
    import fcntl
except ImportError:   # not POSIX: no flock, a scratch left by a killed import stays
    fcntl = None

TEAMS_REF = "refs/gitdrop/export/teams"
SCRATCH = os.path.join("gitdrop", "tmp")   # under the hub's git directory
OWNER = "owner.lock"   # flocked by the process using a scratch for its whole life
NEW = ".new-"          # a scratch not yet locked by its owner
YOUNG = 60.0           # seconds such a one is left alone
STDOUT = "-"           # export's FILE for standard output


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


@contextlib.contextmanager
def _scratch(hub_path: str):
    """A bare repository that sees the hub's objects (alternates) and writes its own,
    in the hub's gitdrop/tmp, removed when done. A process killed while it holds one
    leaves it behind; the next export or import on the hub removes it (its owner's
    flock went with the owner). A hub this user may only read (an export of it) gets
    one in the system's temporary directory instead."""
    base = os.path.join(os.path.abspath(hub_path), SCRATCH)
    try:
        os.makedirs(base, exist_ok=True)
        _sweep(base)
        tmp = tempfile.mkdtemp(prefix=NEW, dir=base)
    except OSError:
        base, tmp = "", tempfile.mkdtemp(prefix="gitdrop-bundle-")
    fd = os.open(os.path.join(tmp, OWNER), os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        if base:   # locked, it gets the name a sweep looks at (and leaves alone)
            name = os.path.join(base, "bundle-" + os.path.basename(tmp)[len(NEW):])
            os.rename(tmp, name)
            tmp = name
        subprocess.run(["git", "init", "-q", "--bare", tmp], check=True, capture_output=True)
        with open(os.path.join(tmp, "objects", "info", "alternates"), "w") as f:
            f.write(os.path.join(os.path.abspath(hub_path), "objects") + "\n")
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        os.close(fd)


def _sweep(base: str) -> None:
    """Remove the scratch repositories of dead processes: their owner's flock is
    free (or, not yet locked, they are older than a minute)."""
    for name in os.listdir(base):
        d = os.path.join(base, name)
        if name.startswith(NEW):
            with contextlib.suppress(OSError):
                if time.time() - os.stat(d).st_mtime > YOUNG:
                    shutil.rmtree(d, ignore_errors=True)
            continue
        try:
            fd = os.open(os.path.join(d, OWNER), os.O_RDONLY)
        except FileNotFoundError:   # named only once locked: its owner is removing it
            continue
        except OSError:
            continue
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                shutil.rmtree(d, ignore_errors=True)
        except OSError:   # held: a live export or import
            pass
        finally:
            os.close(fd)


def teams_needed(view) -> list[str]:
    """The teams a room names: member teams, teams with a lead there, agents' teams."""
    names = set(view.room["teams"]) | set(view.room["leads"])
    names |= {model.split_agent(a["id"])[0] for a in view.agents() if "/" in a["id"]}
    return sorted(n for n in names if n not in model.RESERVED_TEAMS)


def export(store, room: str, path: str) -> dict:
    """Write room `room` of `store` (a hub or a remote hub's mirror) to a bundle at
    `path` (a directory: ROOM.bundle in it; "-": standard output)."""
    import pygit2
    ref = store.room_ref(room)
    tip = store.room_tip(room)
    out = STDOUT if path == STDOUT else os.path.abspath(path)
    if out != STDOUT and os.path.isdir(out):
        out = os.path.join(out, f"{room}.bundle")
    if out != STDOUT and not os.path.isdir(os.path.dirname(out)):
        raise UsageError(f"no directory {os.path.dirname(out)} to write {os.path.basename(out)} in",
                         "give a file in a directory that exists")
    view = store.view(room)
    hub_tip = store.tip(model.HUB_REF)
    hub_tree = store.reader.commit(hub_tip).tree if hub_tip else None
    with _scratch(store.path) as tmp:
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
        _write_bundle(tmp, out, ref)
    return {"room": room, "file": out, "tip": tip, "teams": teams,
            "teams_commit": str(teams_commit)}


def _write_bundle(tmp: str, out: str, ref: str) -> None:
    """The bundle of `ref` and the teams (in scratch `tmp`) at `out`. A new or
    regular file is replaced whole (a part file renamed over it: a reader never
    sees half a bundle); anything else there (a link, a FIFO, a terminal, "-" for
    stdout) is written into as a shell redirection would, not replaced."""
    if out != STDOUT and _replaceable(out):
        part = out + ".part"
        try:
            _git(tmp, "bundle", "create", "--quiet", part, ref, TEAMS_REF)
            os.replace(part, out)
        except OSError as e:
            raise UsageError(f"cannot write {out}: {e.strerror}", "give a file you may write") \
                from None
        finally:
            with contextlib.suppress(OSError):
                os.unlink(part)
        return
    made = os.path.join(tmp, "room.bundle")
    _git(tmp, "bundle", "create", "--quiet", made, ref, TEAMS_REF)
    try:
        with open(made, "rb") as src:
            if out == STDOUT:
                sys.stdout.flush()
                shutil.copyfileobj(src, sys.stdout.buffer)
                sys.stdout.buffer.flush()
            else:
                with open(out, "wb") as dst:
                    shutil.copyfileobj(src, dst)
    except OSError as e:
        raise UsageError(f"cannot write {out}: {e.strerror}", "give a file you may write") \
            from None


def _replaceable(path: str) -> bool:
    """Nothing at `path`, or a regular file (not a link to one)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return True


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


def import_room(hub, path: str, name: str = "") -> dict:
    """Bring a bundle's room into `hub` (a hub on this machine), as room `name` if
    given (else under its own name), judged by the rules first; nothing is written
    unless all of it is accepted."""
    import pygit2
    from .catfile import CatFile
    from .verify import check_commits
    if getattr(hub, "url", ""):
        raise UsageError("a room is imported on the hub's machine: it moves a room's ref, "
                         "which a push may not do", f"copy {path} there and run gitdrop "
                         f"--hub /path/to/hub.git room import {path}")
    source, tip, teams_commit = _heads(path)
    room = model.check_name("room", name) if name else source
    store = hub.store
    ref = store.room_ref(room)
    if store.tip(model.ARCHIVE_PREFIX + room):
        raise Refusal("format", f"room {room!r} is archived in this hub; an import cannot "
                      "re-create it", f"restore it first (gitdrop room restore {room}) to "
                      "import a history that extends it, or import under another name "
                      "(--name)", commit=ref)
    if not store.tip(ref):   # the rules read the scratch copy, which has no other rooms
        hubrules.check_room_case(store.path, room)
    with _scratch(store.path) as tmp:
        specs = [f"{model.ROOM_PREFIX}{source}:refs/import/room"] + (
            [f"{TEAMS_REF}:refs/import/teams"] if teams_commit else [])
        p = _git(tmp, "-c", "fetch.fsckObjects=true", "-c", "transfer.fsckObjects=true",
                 "fetch", "--quiet", "--no-tags", "--no-write-fetch-head", path, *specs,
                 check=False)
        if p.returncode != 0:
            raise Refusal("format", f"{path} is damaged or incomplete: "
                          f"{p.stderr.strip()[-300:]}", "export the room again")
        repo = pygit2.Repository(tmp)
        for what, oid in (("room", tip), ("teams", teams_commit)):
            if oid and not isinstance(repo.get(oid), pygit2.Commit):
                raise Refusal("format", f"the bundle's {what} ref names {oid[:12]}, which is "
                              "not a commit", "export the room again (gitdrop room export)")
        new = tip if room == source else _Renamer(repo, source, room).run(tip)
        hub_tip = store.tip(model.HUB_REF)
        if hub_tip:
            repo.references.create(model.HUB_REF, pygit2.Oid(hex=hub_tip))
        missing = _plan_teams(hub, repo, teams_commit, _room_teams(repo, new))
        new_hub = _commit_teams(repo, hub_tip, missing)
        old = store.tip(ref)
        done = bool(old) and (old == new or _contains(tmp, old, new))
        moved = ""
        if not done:   # the room as this hub keeps rooms: in the current layout
            repo.references.create(ref, pygit2.Oid(hex=new), force=True)
            moved = _move_layout(tmp, room, new)
            new = moved or new
        reader = CatFile(tmp)
        try:
            if missing:   # the team registry's own rules, as for a push of the hub branch
                check_commits(reader, model.HUB_REF, hub_tip, new_hub, None)
            ops = [] if done else _judge(reader, ref, old, new)
            if not done:
                _check_leads_here(reader, room, new, new_hub)
            if not done and not old:
                _check_members_here(reader, room, new)
        finally:
            reader.close()
        if not done:
            _git(store.path, "-c", "fetch.fsckObjects=true", "fetch", "--quiet", "--no-tags",
                 "--no-write-fetch-head", tmp, ref)
            # the store's own compare-and-swap: logged and synced like any write, and a
            # lock a killed writer left is cleared
            with writequeue.Turn(store.path, writequeue.NEW_ROOMS) if not old else \
                    contextlib.nullcontext():
                if not old:   # again, now that no other room is being made here
                    hubrules.check_room_case(store.path, room)
                if missing:   # a team claimed here meanwhile by another lead: the room
                    # would land naming a lead the registry does not have
                    _plan_again(hub, repo, teams_commit, new, missing)
                for _ in range(3):
                    moved_ref = store._cas(ref, old, new, f"import of room {room}",
                                           store._writer())
                    # False with the ref where it was: a killed writer's lock, cleared
                    # now (the first import after a kill said "moved" and did nothing)
                    if moved_ref or store.tip(ref) != old:
                        break
            if not moved_ref:
                raise Conflict(f"room {room} moved in this hub while it was imported; "
                               "nothing was written", "run the import again: it is judged "
                               "against the room's new tip")
    registered = _register(hub, room, missing)
    return {"room": room, "from": source, "tip": new,
            "commits": len(ops), "extended": bool(old) and not done,
            "layout_moved": moved, "teams": registered, "up_to_date": done}


def _plan_again(hub, repo, teams_commit: str, tip: str, missing: list[dict]) -> None:
    """The teams to register, planned again just before the room's ref moves: a team
    registered here while the room was judged, led by another, is refused now
    (_plan_teams), not found after the room has landed naming the bundle's lead."""
    now = _plan_teams(hub, repo, teams_commit, _room_teams(repo, tip))
    if [t["name"] for t in now] != [t["name"] for t in missing]:
        raise Conflict("the hub's teams changed while the room was judged; nothing was "
                       "written", "run the import again: it is judged against the teams "
                       "as they are now")


def _register(hub, room: str, missing: list[dict]) -> list[str]:
    """After the room's ref moved: the teams it needs that this hub lacks. A run
    killed before this point is finished by the next (the room is up to date then)."""
    out = []
    for t in missing:
        try:
            hub.register_team(t["name"], t["lead"], t["members"], by=t["lead"])
        except GitdropError as e:
            raise Refusal(e.rule, f"room {room} is imported, but team {t['name']} (lead "
                          f"{t['lead']}) could not be registered: {e.reason}",
                          "run the import again: it registers the teams still missing, "
                          "or says why it cannot", commit=e.commit) from None
        out.append(t["name"])
    return out


def _move_layout(tmp: str, room: str, tip: str) -> str:
    """Move the scratch's room (at `tip`) to the current layout as a hub moves its
    own rooms (layout.move_room, judged by the rules as it is written): the new
    commit, or "" when it is in it. Dated as its parent, so that every hub importing
    one bundle gets the same commit."""
    from .store import Reader, Store
    import pygit2
    scratch = Store.__new__(Store)   # not Store(): no write-ahead log, no fsync setting
    scratch.path, scratch.repo = tmp, pygit2.Repository(tmp)
    scratch.reader, scratch.method = Reader(scratch.repo), "fsync"   # objects via pygit2
    tree = scratch.repo[tip].tree
    if model.ROOM_FILE not in tree or tree[model.ROOM_FILE].type_str != "blob":
        return ""   # no layout to move from: the rules refuse such a history
    if not layout.is_old(scratch, room):
        return ""
    return layout.move_room(scratch, room, now=scratch.reader.commit(tip).time)


class _Renamer:
    """A room's history rewritten under another name, commit for commit: the same
    authors, committers, dates, messages and files, but for what names the room or a
    commit of it. room.toml's `name` (the rules hold it to the branch and never let
    it change, so it is rewritten in every commit), the read cursors in agents/
    (commit ids, checked by the rules) and `Gitdrop-Reply-To` trailers are mapped to
    the new commits. Deterministic: the same history renamed twice is the same."""

    NAME = re.compile(r'^name = "([^"\\\n]*)"$', re.M)
    CURSOR = re.compile(r'^cursor = "([0-9a-f]{40})"$', re.M)
    REPLY = re.compile(r"^(Gitdrop-(?i:reply-to): *)([0-9a-f]{4,40}) *$", re.M)

    def __init__(self, repo, old: str, new: str):
        self.repo, self.old, self.new = repo, old, new
        self.ids: dict[str, str] = {}        # old commit -> new commit
        self.by4: dict[str, list] = {}       # first 4 hex digits -> old commits
        self.trees: dict = {}
        self.blobs: dict = {}

    def run(self, tip: str) -> str:
        from .store import Reader
        from .verify import chain
        import pygit2
        for c in chain(Reader(self.repo), "", tip, model.ROOM_PREFIX + self.old):
            raw = self.repo[c.oid]
            parents = [pygit2.Oid(hex=self.ids[c.parent])] if c.parent else []
            oid = str(self.repo.create_commit(None, raw.author, raw.committer,
                                              self._message(raw.raw_message),
                                              self._root(raw.tree_id), parents))
            self.ids[c.oid] = oid
            self.by4.setdefault(c.oid[:4], []).append(c.oid)
        return self.ids[tip]

    def _root(self, tree):
        import pygit2
        if tree in self.trees:
            return self.trees[tree]
        t = self.repo[tree]
        tb = self.repo.TreeBuilder(t)
        if model.ROOM_FILE in t and t[model.ROOM_FILE].type_str == "blob":
            e = t[model.ROOM_FILE]   # (anything else there is left for the rules to refuse)
            tb.insert(e.name, self._blob(e.id, self._room_toml), e.filemode)
        if "agents" in t and t["agents"].type_str == "tree":
            tb.insert("agents", self._agents(t["agents"].id), pygit2.GIT_FILEMODE_TREE)
        self.trees[tree] = out = tb.write()
        return out

    AGENT_DEPTH = 2   # agents/<team>/<xx>/: no agent file lies deeper

    def _agents(self, tree, depth: int = 0):
        """agents/ (and, below it, a team's and a bucket's directory) with every
        agent file's cursor mapped; deeper directories are left as they are (the
        rules refuse their paths), so no tree however deep is walked."""
        key = (tree, depth)
        if key in self.trees:
            return self.trees[key]
        t = self.repo[tree]
        tb = self.repo.TreeBuilder(t)
        for e in t:
            if e.type_str == "tree" and depth < self.AGENT_DEPTH:
                tb.insert(e.name, self._agents(e.id, depth + 1), e.filemode)
            elif e.type_str == "blob" and e.name.endswith(".toml"):
                tb.insert(e.name, self._blob(e.id, self._cursor), e.filemode)
        self.trees[key] = out = tb.write()
        return out

    def _blob(self, blob, change):
        if blob not in self.blobs:
            data = self.repo[blob].data
            try:
                text = change(data.decode("utf-8"))
            except UnicodeDecodeError:
                text = None   # left as it is, for the rules to judge
            self.blobs[blob] = blob if text is None else self.repo.create_blob(text.encode())
        return self.blobs[blob]

    def _room_toml(self, text: str):
        m = self.NAME.search(text)
        if not m or m.group(1) != self.old:
            return None
        out = text[:m.start(1)] + self.new + text[m.end(1):]
        try:   # the name and nothing else: else left for the rules to refuse
            same = fmt.loads_toml(out) == dict(fmt.loads_toml(text), name=self.new)
        except fmt.FormatError:
            same = False
        return out if same else None

    def _cursor(self, text: str):
        m = self.CURSOR.search(text)
        if not m or m.group(1) not in self.ids:
            return None
        return text[:m.start(1)] + self.ids[m.group(1)] + text[m.end(1):]

    def _message(self, raw: bytes) -> bytes:
        if b"Gitdrop-" not in raw:
            return raw
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw
        if not any(k == "reply-to" for k, _ in fmt.parse_message(text)[2]):
            return raw
        cut = text.rstrip("\n").rfind("\n\n") + 1   # the trailers: the last paragraph
        return (text[:cut] + self.REPLY.sub(self._reply, text[cut:])).encode("utf-8")

    def _reply(self, m) -> str:
        v = m.group(2)
        hits = [o for o in self.by4.get(v[:4], []) if o.startswith(v)]
        return m.group(1) + self.ids[hits[0]][:len(v)] if len(hits) == 1 else m.group(0)


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


def _room_teams(repo, tip: str) -> set:
    """The teams the room names, as export takes them: its member teams, its leads'
    and its agents' (room.toml's teams and leads, agents/<team>/)."""
    import pygit2
    tree = repo[tip].tree
    try:
        entry = tree["room.toml"]
        doc = fmt.loads_toml(repo[entry.id].data.decode("utf-8")) \
            if entry.type == pygit2.GIT_OBJECT_BLOB else {}
    except (KeyError, fmt.FormatError, UnicodeDecodeError):
        doc = {}
    teams, leads = doc.get("teams", []), doc.get("leads", {})
    agents = [e.name for e in repo[tree["agents"].id] if e.type == pygit2.GIT_OBJECT_TREE] \
        if "agents" in tree and tree["agents"].type == pygit2.GIT_OBJECT_TREE else []
    return {t for t in (teams if isinstance(teams, list) else []) + agents +
            (list(leads) if isinstance(leads, dict) else []) if isinstance(t, str)}


def _plan_teams(hub, repo, teams_commit: str, needed: set) -> list[dict]:
    """The bundle's teams the room names (`needed`) and this hub lacks (a bundle's
    other team files are not the room's to register); a team led by someone else
    here is refused."""
    import pygit2
    if not teams_commit:
        return []
    tree = repo[teams_commit].tree
    out = []
    if "teams" not in tree:
        return out
    if tree["teams"].type != pygit2.GIT_OBJECT_TREE:
        raise Refusal("format", "teams in the bundle is not a directory",
                      "export the room again (gitdrop room export)")
    for e in repo[tree["teams"].id]:
        if not e.name.endswith(".toml") or e.name[:-5] not in needed:
            continue
        if e.type != pygit2.GIT_OBJECT_BLOB:
            raise Refusal("format", f"teams/{e.name} in the bundle is not a file",
                          "export the room again (gitdrop room export)")
        name = e.name[:-5]
        try:
            doc = dict(hubrules.TEAM_FIELDS, **fmt.loads_toml(repo[e.id].data.decode("utf-8")))
        except (fmt.FormatError, UnicodeDecodeError) as err:
            raise Refusal("format", f"teams/{e.name} in the bundle is not a team file: {err}",
                          "export the room again") from None
        if doc.get("name") != name or not isinstance(doc.get("lead"), str):
            raise Refusal("format", f"teams/{e.name} in the bundle does not describe team "
                          f"{name}", "export the room again")
        _check_team_file(e.name, name, doc)
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


def _check_team_file(file: str, team: str, data: dict) -> None:   # data: every field
    """A bundle's team file, by the registry's own field rules (hubrules), asked here
    first: its lead signs the team's commit before those rules judge it (a signature
    takes no "<" and no empty name), and its members are read as a list."""
    problem = hubrules.fields_problem(data) or hubrules.team_problem(team, data)
    if problem:
        raise Refusal("format", f"teams/{file} in the bundle: {problem[0]}",
                      f"{problem[1]}; or export the room again (gitdrop room export)")


def _judge(reader, ref: str, old: str, new: str) -> list:
    """The room's new commits, by the rules. A room new to this hub is history, judged
    as gitdrop verify judges it, but no commit of it may be dated ahead of this hub's
    clock. Commits that extend a room of this hub arrive now, into its state as it is
    here: judged as a push is (a lease live here, the loop guard, the team registry)
    but for their dates, made before. Without the clock a bundle reaped a task whose
    lease was live, took a lease another held, and brought a flood of messages."""
    from .verify import check_commits
    now = int(time.time())
    if old:
        return check_commits(reader, ref, old, new, now, past_ok=True)
    return check_commits(reader, ref, old, new, None, latest=now)


def _check_members_here(reader, room: str, new: str) -> None:
    """A room new to this hub has its history judged without this hub's registry, as
    verify does; who it brings into a closed room is judged by it: the members its
    teams have here (else a bundle made elsewhere seated agents no lead here named)."""
    teams = hubrules.registry(reader, model.HUB_REF)
    view = RoomView(reader, reader.commit(new).tree, new, room)
    for agent in view.agent_ids():
        if not rules.team_member(teams, view.room, agent):
            raise Refusal("room-membership", *rules.non_member(teams, room, agent,
                                                               "import it again"),
                          commit=fmt.commit_named(new, reader.commit(new).subject))


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
