"""Domain vocabulary: names, paths in a room's tree, file schemas, limits.

Pure data and tiny helpers; the rules, the verbs and the docs all read these.
"""



class _NamePattern:
    """A name of this hub: a room, team, agent, task, contract or context key.

    Letters, digits, '.', '_' and '-', starting with a letter or digit, at most
    `longest` characters; and safe as a git ref component and a file name: no
    "..", no final "." and no ".lock" ending. The whole string must match (no
    final newline slips through, as it would past a regex's `$`). Written
    without re, whose import is a large part of the pre-receive hook's start-up.
    match() gives True or None."""

    FIRST = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
    REST = FIRST | frozenset("_.-")

    def __init__(self, longest: int):
        self.longest = longest
        self.pattern = f"[A-Za-z0-9][A-Za-z0-9_.-]{{0,{longest - 1}}} (no '..', not ending " \
                       "in '.' or '.lock')"

    def match(self, s):
        return True if isinstance(s, str) and not self.problem(s) else None

    def problem(self, s: str) -> str:
        """What is wrong with `s` as a name, in words ("" if nothing)."""
        if not s:
            return "it is empty"
        if len(s) > self.longest:
            return f"it has {len(s)} characters; the most is {self.longest}"
        if s[0] not in self.FIRST:
            return f"it starts with {s[0]!r}; a name starts with a letter or digit"
        bad = [ch for ch in s if ch not in self.REST]
        if bad:
            return f"it contains {bad[0]!r}; use only letters, digits, '.', '_' and '-'"
        if ".." in s:
            return "it contains '..', which a git ref cannot"
        if s.endswith(".lock") or s.endswith("."):
            return f"it ends in {'.lock' if s.endswith('.lock') else '.'!r}, which a git ref cannot"
        return ""


NAME_RE = _NamePattern(40)
KEY_RE = _NamePattern(80)
DEFAULT_TEAM = "default"
ALL = "all"

ROOM_PREFIX = "refs/heads/rooms/"
ARCHIVE_PREFIX = "refs/archive/rooms/"
HUB_REF = "refs/heads/hub"

ROOM_FILE = "room.toml"
# Directories a tree may nest: no path gitdrop knows is deeper than 3 (agents/<team>/
# <xx>/<name>.toml), and walking thousands of levels would exhaust Python's stack.
MAX_TREE_DEPTH = 16
CONTRACT_KINDS = ("function", "dom_id", "css_class", "file_path", "api_endpoint",
                  "event", "schema", "other")

# Room settings and their defaults; room.toml may override any of them.
DEFAULT_SETTINGS = {
    "loop_cap": 60,          # messages one agent may send per window (0 = off)
    "loop_window": 60,       # seconds
    "max_message": 16384,    # bytes of message text
    "max_file": 65536,       # bytes of any file in the room's tree
    "max_title": 200,        # characters of a task title
    "max_tags": 16,
    "max_retries": 3,        # default for new tasks
    "task_lease": 1800,      # seconds a claimed task is held after its assignee's last act
    "max_task_lease": 86400, # the longest lease a claim, start or renew may set
    "clock_skew": 30,        # seconds a pushed commit may be dated off the hub clock (below loop_window)
    "max_lease_ttl": 86400,  # seconds a path lease may run (gitdrop lease take --ttl)
    "max_leases": 200,       # path leases one agent may hold live at once
}


_NAMES: dict = {}   # name -> is_name: the same few names are checked many times a write


def case_twin(name: str, names) -> str:
    """The one of `names` that differs from `name` in case alone ("" if none): on a
    case-insensitive file system (macOS, Windows) the two are one file, or one ref,
    so a checkout or a hub there would mix them up."""
    folded, n = name.casefold(), len(name)   # ASCII names: a twin has the same length
    for other in names:
        if len(other) == n and other != name and other.casefold() == folded:
            return other
    return ""


def is_name(s: str) -> bool:
    if not isinstance(s, str) or len(s) > NAME_RE.longest:
        return False   # and not remembered: a caller's megabyte of text stays theirs
    got = _NAMES.get(s)
    if got is None:
        got = bool(NAME_RE.match(s))
        if len(_NAMES) > 50000:
            _NAMES.clear()
        _NAMES[s] = got
    return got


def check_name(what: str, s, longest: int = 40) -> str:
    """`s` if it is a valid name of this kind (room, team, agent, task, ...), else
    UsageError saying what is wrong with it. Every face calls this (through the
    core) on every name it is given; the rules use is_name on what a push brings."""
    from .errors import UsageError
    pattern = NAME_RE if longest == NAME_RE.longest else KEY_RE
    problem = "it is not text" if not isinstance(s, str) else pattern.problem(s)
    if problem:
        shown = repr(s)[:60]
        raise UsageError(f"bad {what} name {shown}: {problem}",
                         f"pick {'an' if what[0] in 'aeiou' else 'a'} {what} name of 1 to "
                         f"{pattern.longest} letters, digits, "
                         "'.', '_' or '-' that starts with a letter or digit")
    return s


def check_agent_id(s) -> str:
    """A full agent id team/name (each part a name), else UsageError."""
    from .errors import UsageError
    if not isinstance(s, str) or s.count("/") != 1:
        raise UsageError(f"bad agent name {repr(s)[:60]}: agents are team/name",
                         "give the agent as team/name, e.g. core/juno")
    team, name = s.split("/")
    check_name("team", team)
    check_name("agent", name)
    return s


def split_agent(agent_id: str) -> tuple[str, str]:
    team, sep, name = agent_id.partition("/")
    if not sep:
        return DEFAULT_TEAM, team
    return team, name


def is_agent_id(s: str) -> bool:
    if not isinstance(s, str):   # a TOML list of numbers read as members, say
        return False
    team, sep, name = s.partition("/")
    return bool(sep) and is_name(team) and is_name(name)


# Layouts of a room's tree (room.toml `layout`). 1: agents/<team>/<name>.toml and
# tasks/<id>.md, one directory of every agent of a team and one of every task, so
# each registration, inbox read (cursor) and task move rewrote a tree of all of them.
# 2: a fan-out by bucket(name), agents/<team>/<xx>/<name>.toml and tasks/<xx>/<id>.md,
# so a write rewrites at most 256 bucket entries and one bucket's few files. A hub
# moves old rooms to the new layout when it opens (gitdrop.layout).
LAYOUT = 2


def bucket(key) -> str:
    """The fan-out directory of a name: the first two hex digits of the SHA-1 of
    the name's bytes (by hand: printf %s NAME | sha1sum | cut -c1-2)."""
    key = str(key)
    got = _BUCKETS.get(key)
    if got is None:
        import hashlib   # here: the hook's start-up does not pay for it when unused
        got = hashlib.sha1(key.encode()).hexdigest()[:2]
        if len(key) <= KEY_RE.longest:   # a name or key, not whatever a caller sent
            if len(_BUCKETS) > 50000:
                _BUCKETS.clear()
            _BUCKETS[key] = got
    return got


_BUCKETS: dict = {}


def agent_path(agent_id: str, layout: int = LAYOUT) -> str:
    team, name = split_agent(agent_id)
    if layout == 1:
        return f"agents/{team}/{name}.toml"
    return f"agents/{team}/{bucket(name)}/{name}.toml"


def task_path(task_id, layout: int = LAYOUT) -> str:
    if layout == 1:
        return f"tasks/{task_id}.md"
    return f"tasks/{bucket(task_id)}/{task_id}.md"


def handshake_path(hid) -> str:
    return f"handshakes/{hid}.md"


def contract_path(name: str) -> str:
    return f"contracts/{name}.md"


def context_path(key: str) -> str:
    return f"context/{key}.md"


def lease_path(lid: str) -> str:
    return f"leases/{lid}.toml"


def kind_of(path: str) -> tuple[str, str]:
    """Which entity a path in a room's tree holds: (kind, key) or ("", "")."""
    return parse_path(path)[:2]


def parse_path(path: str) -> tuple[str, str, int]:
    """(kind, key, layout) of a path in a room's tree: layout is 1 or 2 for an agent
    or task file (the layout its path belongs to), else 0; ("", "", 0) for a path
    gitdrop does not know (an agent or task file in the wrong bucket included)."""
    parts = path.split("/")
    flat = {"agents": 3, "tasks": 2}.get(parts[0])
    if flat is None or len(parts) not in (flat, flat + 1):
        return _entity(parts) + (0,)
    layout = 1 if len(parts) == flat else 2
    kind, key = _entity(parts[:flat - 1] + parts[-1:])
    if kind and (layout == 1 or parts[-2] == bucket(key.rpartition("/")[2])):
        return kind, key, layout
    return "", "", 0


def placed(kind: str, key: str, layout: int = LAYOUT) -> str:
    """Where an agent or task file belongs in a room of `layout` ("" for other kinds)."""
    return agent_path(key, layout) if kind == "agent" else \
        task_path(key, layout) if kind == "task" else ""


def misplaced(path: str) -> str:
    """For an agent or task file in a wrong bucket, the path it belongs at ("" else)."""
    parts = path.split("/")
    flat = {"agents": 3, "tasks": 2}.get(parts[0])
    if flat is None or len(parts) != flat + 1:
        return ""
    kind, key = _entity(parts[:flat - 1] + parts[-1:])
    return placed(kind, key, 2) if kind else ""


def _entity(parts: list) -> tuple[str, str]:
    if parts == [ROOM_FILE]:
        return "room", ""
    if len(parts) == 3 and parts[0] == "agents" and parts[2].endswith(".toml"):
        team, name = parts[1], parts[2][:-5]
        if is_name(team) and is_name(name):
            return "agent", f"{team}/{name}"
    if len(parts) == 2 and parts[0] == "leases" and parts[1].endswith(".toml") \
            and KEY_RE.match(parts[1][:-5]):
        return "lease", parts[1][:-5]
    if len(parts) == 2 and parts[1].endswith(".md"):
        key = parts[1][:-3]
        if parts[0] == "tasks" and KEY_RE.match(key):
            return "task", key
        if parts[0] == "handshakes" and key.isdigit():
            return "handshake", key
        if parts[0] == "contracts" and KEY_RE.match(key):
            return "contract", key
        if parts[0] == "context" and KEY_RE.match(key):
            return "context", key
    return "", ""


def short(agent_id: str) -> str:
    return agent_id.rpartition("/")[2]


def namer(ids):
    """A function showing team/name as its name alone where no other of `ids` has
    that name, else whole (core/spartan beside web/spartan); "all", @team as given."""
    counts: dict = {}
    for i in set(ids):
        counts[short(i)] = counts.get(short(i), 0) + 1
    return lambda x: short(x) if "/" in x and counts.get(short(x), 0) <= 1 else x


def is_lead(agent: dict | None, room: dict) -> bool:
    """A lead: a registered agent recorded in room.toml as the lead of one of the
    room's teams (copied from the hub's team registry when the team joined). A
    role string an agent gives itself grants nothing."""
    if not agent:
        return False
    return agent.get("id") in room.get("leads", {}).values()


# Teams no agent can lead or register in: the hub's own identities (hub/admin,
# hub/reaper: the operator and the hub's upkeep), and the team of agents that
# named none.
ADMIN_TEAM = "hub"
RESERVED_TEAMS = (ADMIN_TEAM, DEFAULT_TEAM)


def reserved_team(team: str) -> bool:
    """A reserved team's name, in any case: Hub/admin looked like the operator."""
    return team.lower() in RESERVED_TEAMS


def is_hub_identity(agent_id: str) -> bool:
    return split_agent(agent_id)[0] == ADMIN_TEAM and "/" in (agent_id or "")


def leads_for(agent: dict | None, room: dict, *agent_ids: str) -> bool:
    """Whether a lead of the room acts for what belongs to `agent_ids` (their tasks,
    leases, contracts, their registrations). In a closed room every lead does: the
    room's leads let each team in. In an open room, where the lead of any team may
    join, a lead acts for its own team only: else a stranger who made a team and
    joined the lobby deregistered another team's agents and cancelled its tasks (and,
    while it acted for teams with no lead recorded there, those of nearly every team
    of a lobby, whose leads had registered there without the lead role)."""
    if not is_lead(agent, room):
        return False
    if not room.get("open"):
        return True
    return split_agent(agent["id"])[0] in {split_agent(a)[0] for a in agent_ids if a}


def lead_of_team(room: dict, team: str) -> str:
    return room.get("leads", {}).get(team, "")


def settings(room: dict) -> dict:
    s = dict(DEFAULT_SETTINGS)
    s.update({k: v for k, v in room.get("settings", {}).items() if k in DEFAULT_SETTINGS})
    return s


def member_team(room: dict, team: str) -> bool:
    return bool(room.get("open")) or team in room.get("teams", [])


# Fields each document kind carries, with their types and defaults.
TASK_FIELDS = {
    "id": "", "title": "", "state": "pending", "creator": "", "assignee": "",
    "reviewer": "", "priority": 0, "tags": [], "project": "", "retries": 0,
    "max_retries": 3, "handshake": 0, "signoffs": [], "resume": "",
    "question": "", "answer": "", "note": "", "created": 0, "updated": 0,
    "lease_until": 0, "after": [], "parent": "", "requires": [], "review": True,
    "not_before": 0, "brief": False,
}
AGENT_FIELDS = {
    "id": "", "roles": [], "description": "", "status": "", "registered": 0,
    "last_seen": 0, "cursor": "", "caps": [], "human": False,
}
HANDSHAKE_FIELDS = {
    "id": 0, "initiator": "", "targets": [], "acks": [], "status": "pending", "created": 0,
}
CONTRACT_FIELDS = {
    "name": "", "owner": "", "kind": "other", "version": 1, "project": "", "updated": 0,
}
ROOM_FIELDS = {
    "name": "", "created": 0, "open": False, "teams": [], "pinned": False,
    "leads": {}, "settings": {}, "layout": 1,
}
# A path lease on the work repository: `glob` reserved by `holder` until `until`
# (unix seconds, judged by the hub's clock); mode "exclusive" or "shared".
LEASE_FIELDS = {"id": "", "holder": "", "glob": "", "mode": "exclusive", "until": 0, "taken": 0}
LEASE_MODES = ("exclusive", "shared")
FIELDS = {"task": TASK_FIELDS, "agent": AGENT_FIELDS, "handshake": HANDSHAKE_FIELDS,
          "contract": CONTRACT_FIELDS, "room": ROOM_FIELDS, "lease": LEASE_FIELDS}


GLOB_WILD = "*?["


def glob_problem(glob) -> str:
    """What is wrong with a lease's glob ("" if nothing): a relative path of the
    work repository, '/'-separated, where '**' spans directories and '*', '?'
    match within one name."""
    if not isinstance(glob, str) or not glob.strip():
        return "it is empty"
    if len(glob) > 300:
        return "it is longer than 300 characters"
    if glob.startswith("/") or glob != glob.strip():
        return "it must be a relative path without surrounding blanks"
    if any(part in ("", ".", "..") for part in glob.split("/")):
        return "it has an empty, '.' or '..' part"
    if any(ch < " " or ch == "\x7f" for ch in glob):
        return "it contains a control character"
    return ""


def glob_prefix(glob: str) -> str:
    """The literal start of a glob: every path it covers starts with it."""
    for i, ch in enumerate(glob):
        if ch in GLOB_WILD:
            return glob[:i]
    return glob


def path_fold(s: str) -> str:
    """A path as a case-insensitive, normalizing file system sees it (macOS, Windows):
    src/API and src/api, or café in its two Unicode forms, are one file there, so
    leases and the guard compare these forms (two agents held each its twin alone)."""
    import unicodedata
    return unicodedata.normalize("NFC", s).casefold()


def globs_overlap(a: str, b: str) -> bool:
    """Could some path be covered by both globs? Conservative: never says no when
    the answer is yes. A glob without wildcards covers that path and everything
    under it, so two such overlap when one is the other or an ancestor directory
    of it. Otherwise they overlap when the literal start (up to the first '*',
    '?' or '[') of one is a prefix of the other's: a path matching both starts
    with both. ('src/*.py' and 'src/x.js' are thus said to overlap.)"""
    a, b = path_fold(a), path_fold(b)
    pa, pb = glob_prefix(a), glob_prefix(b)
    if pa == a and pb == b:
        return a == b or b.startswith(a + "/") or a.startswith(b + "/")
    return pa.startswith(pb) or pb.startswith(pa)


# Fields that hold a time (seconds since 1970), in any document kind.
TIME_FIELDS = ("created", "updated", "lease_until", "not_before", "registered", "last_seen",
               "until", "taken")
MAX_TIME = 253402300799   # 9999-12-31 23:59:59 UTC, the last second a date library writes


def bad_time(data: dict, before: dict | None = None) -> str:
    """What is wrong with the times a document holds ("" if nothing): a time before
    1970 or past the year 9999 is no date (2**63-1 broke the board's task page). A
    time kept as `before` had it is not judged again (the file is changed for
    something else, and was accepted so)."""
    for k in TIME_FIELDS:
        v = data.get(k)
        if before is not None and before.get(k) == v:
            continue
        if isinstance(v, int) and not isinstance(v, bool) and not 0 <= v <= MAX_TIME:
            return f"field {k!r} is {v}: a time is seconds since 1970, from 0 to {MAX_TIME}"
    return ""


def check_fields(kind: str, data: dict) -> str:
    """Return what is wrong with a document's header, or ""."""
    schema = FIELDS[kind]
    for k, v in data.items():
        if k not in schema:
            return f"unknown field {k!r} (allowed: {', '.join(schema)})"
        want = schema[k]
        if isinstance(want, bool):
            ok = isinstance(v, bool)
        elif isinstance(want, int):
            ok = isinstance(v, int) and not isinstance(v, bool)
        elif isinstance(want, list):
            ok = isinstance(v, list) and all(isinstance(x, str) for x in v)
        elif isinstance(want, dict):
            ok = isinstance(v, dict)
        else:
            ok = isinstance(v, str) or (k == "id" and kind == "task" and isinstance(v, int))
        if not ok:
            return f"field {k!r} must be {type(want).__name__}, got {v!r}"[:200]
    return ""


def with_defaults(kind: str, data: dict) -> dict:
    out = {k: (list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v)
           for k, v in FIELDS[kind].items()}
    out.update(data)
    return out
