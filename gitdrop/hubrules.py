"""Rules for the hub branch: the team registry (teams/<team>.toml), and the
records the hub itself keeps (archive/<room>.toml, destroy/<room>.toml), which a
push may not touch.

A push may create a team (as its lead, or as a hub admin `hub/<name>`) or change
one (as its current lead), one team per commit."""

from . import fmt, model, wal
from .errors import Refusal

TEAM_FIELDS = {"name": "", "lead": "", "members": [], "created": 0}


def team_path(team: str) -> str:
    return f"teams/{team}.toml"


def check_chain(reader, commits, pusher="") -> list:
    out = []
    for c in commits:
        parent_tree = reader.commit(c.parent).tree if c.parent else None
        changes = reader.diff(parent_tree, c.tree)
        out.append((c.oid, check(reader, c, changes, pusher)))
    return out


def _refuse(rule, c, reason, fix=""):
    raise Refusal(rule, reason, fix, commit=fmt.commit_named(c.oid, c.subject))


HUB_MESSAGE_MAX = 4096    # bytes of a hub branch commit message
HUB_FILE_MAX = 65536      # bytes of a team file
ADMIN_TEAM = model.ADMIN_TEAM   # hub/<name>: the hub's own identities (admin, reaper)


def check(reader, c, changes, pusher="") -> str:
    """A commit on the hub branch: create or update one team."""
    op = c.op or "team-update"
    from .rules import bad_commit, bad_encoding, bad_text, pushed_by
    if len(c.message.encode("utf-8", "surrogateescape")) > HUB_MESSAGE_MAX or \
            bad_text(c.message) or bad_encoding(c):
        _refuse("format", c, f"the commit message is over {HUB_MESSAGE_MAX} bytes, not UTF-8, "
                "holds control characters or declares another encoding",
                "write a short plain-text message (no encoding header: git config --unset "
                "i18n.commitEncoding)")
    bad_commit(c)
    pushed_by(c, pusher)
    if not c.parents:
        return op
    if op not in ("team-create", "team-update"):
        _refuse("lead-only", c, f"{op} is recorded by the hub itself, not pushed",
                "run gitdrop room archive/restore/destroy/reap on the hub")
    if len(changes) != 1:
        _refuse("one-operation", c, "one team per commit", "make one commit per team")
    path, old, new = changes[0]
    if not path.startswith("teams/") or not path.endswith(".toml"):
        _refuse("format", c, f"{path} is not a team file", "teams live in teams/<team>.toml")
    team = path[6:-5]
    if new is None:
        _refuse("one-operation", c, "teams are not deleted", "put the team's file back: "
                "a team stays in the registry once registered")
    mode = getattr(reader, "mode", None)
    if mode is not None and c.tree and mode(c.tree, path) != 0o100644:
        _refuse("format", c, f"{path} is not a plain file", "commit a plain, non-executable file")
    text = reader.blob_text(new) or ""
    if len(text.encode("utf-8", "surrogateescape")) > HUB_FILE_MAX or bad_text(text):
        _refuse("format", c, f"{path} is over {HUB_FILE_MAX} bytes, not UTF-8, or holds "
                "control characters", "a team file is a few lines of TOML")
    doc = _team(c, text)
    prev = _team(c, reader.blob_text(old)) if old is not None else None
    if prev is not None and c.author != prev["lead"]:   # first: what else is wrong is the lead's
        _refuse("lead-only", c, f"only {prev['lead']} (the lead of team {team}) changes it",
                f"ask {prev['lead']}")
    bad = model.bad_time(doc, prev)
    if bad:   # a time the file held already is not judged again
        _refuse("format", c, f"{path}: {bad}", "write the time the team was created "
                "(date +%s gives the current one)")
    if doc["name"] != team or not model.is_name(team):
        _refuse("format", c, f"name must be {team!r}", f"set name = \"{team}\" in "
                f"teams/{team}.toml (the file's name is the team's)")
    if model.reserved_team(team):
        _refuse("reserved-name", c, f"team {team!r} is reserved ({ADMIN_TEAM}: the hub's own "
                f"identities; {model.DEFAULT_TEAM}: agents that named no team, who have no "
                "lead)", "pick another team name")
    problem = team_problem(team, doc)
    if problem:
        _refuse("format", c, *problem)
    if old is None:
        twin = model.case_twin(f"{team}.toml", _team_files(reader, c))
        if twin:
            _refuse("format", c, f"team {team!r} differs from team {twin[:-5]!r} only in case; "
                    "on a case-insensitive file system (macOS, Windows) they are one "
                    "directory of every room", f"join team {twin[:-5]!r}, or pick a name that "
                    "differs in more than case")
        if c.author != doc["lead"] and not model.is_hub_identity(c.author):
            _refuse("lead-only", c, f"team {team} is created by its lead {doc['lead']} "
                    f"(or the hub's operator), not {c.author}",
                    f"create it as its lead (--as {doc['lead']}), or ask the hub's operator")
        return "team-create"
    return "team-update"


def _team_files(reader, c) -> list[str]:
    """The names in teams/ before `c` (a reader of proposed text gives them)."""
    got = getattr(reader, "team_files", None)
    if got is not None:
        return got
    return reader.list_dir(reader.commit(c.parent).tree, "teams") if c.parents else []


def _team(c, text):
    try:
        data = fmt.loads_toml(text or "")
    except fmt.FormatError as e:
        _refuse("format", c, str(e), "write the team's file as TOML (docs/PROTOCOL.md, "
                "The hub branch)")
    problem = fields_problem(data)
    if problem:
        _refuse("format", c, *problem)
    return dict(TEAM_FIELDS, **data)


def fields_problem(data: dict) -> tuple[str, str] | None:
    """(reason, fix) when a team file holds a field unknown or of the wrong type."""
    for k, v in data.items():
        if k not in TEAM_FIELDS or type(v) is not type(TEAM_FIELDS[k]):
            return (f"team field {k!r} is unknown or of the wrong type",
                    "fields: name, lead, members (a list), created")
    return None


def team_problem(team: str, doc: dict) -> tuple[str, str] | None:
    """(reason, fix) when team `team`'s lead or members are not its agents (a team
    file read in, or carried by a bundle: gitdrop.bundle)."""
    if not model.is_agent_id(doc["lead"]) or model.split_agent(doc["lead"])[0] != team:
        return (f"the lead of team {team} must be {team}/<name>, not {doc['lead']!r}",
                f"name an agent of team {team} as its lead, e.g. {team}/lead")
    bad = [m for m in doc["members"] if not model.is_agent_id(m) or
           model.split_agent(m)[0] != team]
    if bad:
        return (f"members of team {team} are {team}/<name>, not "
                f"{', '.join(map(repr, bad[:3]))}", f"list only agents of team {team} "
                "(team/name)")
    return None


def check_new_room(reader, room: str) -> None:
    """A push may not bring back an archived room under its old name (the hook's
    reader resolves ref names; a reader that cannot, finds nothing), nor make a
    room whose name differs from another's in case alone."""
    try:
        reader.commit(model.ARCHIVE_PREFIX + room)
    except (KeyError, ValueError, TypeError):
        check_room_case(getattr(reader, "git_dir", ""), room)
        return
    raise Refusal("format", f"room {room!r} is archived; a push cannot re-create it",
                  f"ask a lead to restore it on the hub (gitdrop room restore {room})",
                  commit=f"refs/heads/rooms/{room}")


def check_room_case(git_dir: str, room: str) -> None:
    """Refuse a new room named as an active or archived one but for case: a hub on
    macOS or Windows keeps both refs in one file, and the second room's writes
    would land on the first's branch."""
    if not git_dir:
        return
    twin = model.case_twin(room, wal.ref_names(git_dir, model.ROOM_PREFIX)
                           + wal.ref_names(git_dir, model.ARCHIVE_PREFIX))
    if twin:
        raise Refusal("format", f"room {room!r} differs from room {twin!r} only in case; on "
                      "a case-insensitive file system (macOS, Windows) they are one branch",
                      f"use room {twin!r}, or pick a name that differs in more than case",
                      commit=f"refs/heads/rooms/{room}")


class Registry(dict):
    """{team: lead}, and `members` {team: frozenset of its lead and members}."""

    def __init__(self):
        super().__init__()
        self.members: dict = {}


class RegistryAt:
    """The registry as it stood at a time, for history judged again: `at(time)` is
    the registries of the hub branch's commits of that second and of the newest one
    before it (the hub dates a room's hand-over no earlier than the registry's, to
    the second), and the registry now (a writer's clock ahead of the hub's, or a room
    brought from another hub, dates a commit otherwise than this hub's branch). The
    branch is walked once, when first asked."""

    def __init__(self, reader, hub: str = model.HUB_REF):
        self.reader, self.hub, self._commits, self._got = reader, hub, None, {}

    def __call__(self, when: int) -> list:
        if self._commits is None:
            self._commits = []   # (time, oid), newest first
            try:
                c = self.reader.commit(self.hub)
                while True:
                    self._commits.append((c.time, c.oid))
                    if not c.parents:
                        break
                    c = self.reader.commit(c.parents[0])
            except (KeyError, ValueError, TypeError):
                pass
        then = [o for t, o in self._commits if t == when]
        then += [o for t, o in self._commits if t < when][:1]
        then += [o for _t, o in self._commits[:1] if o not in then]
        for oid in then:
            if oid not in self._got:
                self._got[oid] = registry(self.reader, oid)
        return [self._got[o] for o in then]


def registry(reader, hub: str = model.HUB_REF) -> Registry | None:
    """The hub branch's team files as a Registry, or None if there is no hub
    branch (a bare repository used as a hub by hand). `hub` is the branch's tip or
    its ref name (for a reader that resolves names)."""
    try:
        tree = reader.commit(hub).tree
    except (KeyError, ValueError, TypeError):
        return None
    out = Registry()
    for name in reader.list_dir(tree, "teams"):
        if not name.endswith(".toml"):
            continue
        try:
            data = fmt.loads_toml((reader.read_path(tree, "teams/" + name) or b"").decode(
                "utf-8", "replace"))
        except fmt.FormatError:
            continue
        lead = data.get("lead")
        out[name[:-5]] = lead if isinstance(lead, str) else ""
        members = data.get("members")
        out.members[name[:-5]] = frozenset(
            [m for m in members if isinstance(m, str)] if isinstance(members, list) else ()) \
            | {out[name[:-5]]}
    return out
