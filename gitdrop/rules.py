"""The rules: one pure function decides every commit on a room's branch.

`check(before, commit, changes, ctx)` is called by the core before it moves a
ref and by the pre-receive hook for every pushed commit, so both paths give the
same verdict. It returns the operation the commit performs (from its
`Gitdrop-Op` trailer, or inferred from its diff for a commit made by hand) and
raises `Refusal` naming the rule, the commit and the fix otherwise.
"""

import _thread
import bisect

from . import brief, deps, fmt, keywindow, machine, model
from .errors import Refusal
from .view import Change, RoomView, first_parent_walk, parse_file, reader_memo  # noqa: F401 (Change: re-export)


class Ctx:
    """What a check may consult besides the room: history, the clock, the pusher,
    the hub's team registry."""

    def __init__(self, reader, now: int | None = None, pusher: str = "", teams=None,
                 fresh=(), past_ok: bool = False, latest: int | None = None, teams_at=None):
        self.reader = reader
        self.now = now          # None when re-validating history: no clock rule
        self.pusher = pusher    # identity the transport authenticated, if any
        # teams() -> {team: lead} from the hub branch, or None where there is none;
        # consulted (at receipt only) when room.toml names leads.
        self._teams, self._registry = teams, False
        # teams_at(time) -> the registry as it stood then, for history judged again
        # (verify): a lead handed over by the registry did so by the registry of then.
        self._teams_at = teams_at
        # Commits of the same push before this one: they arrived now, whatever
        # their dates say (the loop guard counts them in its window).
        self.fresh = fresh
        # An imported room's new commits (gitdrop room import) are judged at receipt
        # but were made before: a date in the past is not refused for itself.
        self.past_ok = past_ok
        # History judged without a clock may still not be dated ahead of this one (a
        # room new to the hub, imported).
        self.latest = latest

    def registry(self) -> dict | None:
        """The registry at receipt (None when history is judged again): what the
        rules refuse by."""
        if self._registry is False:
            self._registry = self._teams() if self._teams and self.now is not None else None
        return self._registry

    def registries_of(self, c) -> list:
        """The registry `c` was made under: the current one at receipt; when history is
        judged again, the one of its date (every one of that second: the hub's
        commits are dated to the second). What a hand-over is let through by."""
        if self.now is not None:
            return [self.registry()]
        return (self._teams_at(c.time) if self._teams_at else None) or [None]


def _refuse(rule, c, reason, fix=""):
    raise Refusal(rule, reason, fix, commit=fmt.commit_named(c.oid, c.subject))


def infer(before: RoomView, c, changes: list[Change]) -> str:
    """The operation a commit's diff performs (for commits made by hand)."""
    if not changes:
        return "send"
    if len(changes) > 1:
        kinds = sorted({ch.path for ch in changes})
        _refuse("one-operation", c, f"the commit changes {len(changes)} files "
                f"({', '.join(kinds[:5])}); one commit is one operation",
                "split it into one commit per file/operation")
    ch = changes[0]
    if not ch.kind:
        _unknown_path(c, ch)
    if ch.kind == "room":
        return "room-settings" if ch.old is not None else "room-create"
    if ch.kind == "agent":
        if ch.old is None:
            return "register"
        if ch.new is None:
            return "deregister"
        old, new = _doc(c, ch, "old")[0], _doc(c, ch, "new")[0]
        diff = {k for k in set(old) | set(new) if old.get(k) != new.get(k)}
        if diff == {"cursor"}:
            return "read"
        if diff <= {"last_seen"}:
            return "ping"
        return "status"
    if ch.kind == "task":
        if ch.old is None:
            return "task-create"
        if ch.new is None:
            _refuse("task-state-machine", c, f"task {ch.key} cannot be deleted",
                    "cancel it instead (gitdrop task cancel)")
        old, new = _doc(c, ch, "old")[0], _doc(c, ch, "new")[0]
        cands = machine.moves_between(old["state"], new["state"])
        author = c.author
        if "claim" in cands and new.get("assignee") == author and old.get("assignee") != author:
            return "task-claim"
        if old["state"] == new["state"] and old["lease_until"] != new["lease_until"] and \
                {k for k in old if old[k] != new.get(k)} <= {"lease_until", "updated", "note"}:
            return "task-renew"
        if old["state"] == new["state"] and old["signoffs"] != new["signoffs"]:
            return "task-sign"
        if "release" in cands and new["state"] == "pending" and old.get("assignee") == author:
            return "task-release"   # the holder gives it back (a reap is anyone's, later)
        for m in cands:
            if machine.target(m, old) == new["state"]:
                return "task-" + m
        _refuse("task-state-machine", c,
                f"task {ch.key}: no move goes from {old['state']} to {new['state']}",
                machine.legal_moves(old["state"], old))
    if ch.kind == "handshake":
        return "handshake-start" if ch.old is None else "handshake-ack"
    if ch.kind == "contract":
        if ch.new is None:
            _refuse("contract-owner", c, f"contract {ch.key} cannot be deleted",
                    "declare a new version instead")
        return "contract-declare"
    if ch.kind == "lease":
        return "lease-release" if ch.new is None else "lease-take"
    return "context-set"


def _doc(c, ch: Change, side: str):
    text = ch.old if side == "old" else ch.new
    try:
        doc = parse_file(ch.kind, text)
    except fmt.FormatError as e:
        _refuse("format", c, f"{ch.path}: {e}", "fix the file so it matches docs/PROTOCOL.md")
    # Only what is written now: a file already in the room is read as it is.
    bad = model.bad_time(doc[0]) if side == "new" else ""
    if bad and ch.old is not None:   # rare: was it there before this commit?
        try:
            bad = model.bad_time(doc[0], parse_file(ch.kind, ch.old)[0])
        except fmt.FormatError:
            pass
    if bad:
        _refuse("format", c, f"{ch.path}: {bad}", "write the time the act happened "
                "(date +%s gives the current one)")
    return doc


def check(before: RoomView, c, changes: list[Change], ctx: Ctx) -> str:
    """Accept (return the op) or refuse (raise Refusal) one commit."""
    s = before.settings
    if len(c.parents) > 1:
        _refuse("linear-history", c, "merge commits are not allowed on a room branch",
                "rebase onto the room's tip (git pull --rebase) and push again")
    if ctx.now is not None:
        _check_clock(c, ctx.now, s["clock_skew"], ctx.past_ok)
        if ctx.past_ok and c.parents:
            _check_after_parent(c, ctx.reader.commit(c.parents[0]).time, s["clock_skew"])
    elif ctx.latest is not None:
        _check_clock(c, ctx.latest, s["clock_skew"], past_ok=True)   # not from the future
    size = len(c.message.encode("utf-8", "surrogateescape"))
    if size > s["max_message"] + MESSAGE_EXTRA:
        _refuse("size-limit", c, f"the commit message is {size} bytes; the room allows "
                f"{s['max_message']} of text plus {MESSAGE_EXTRA} for subject and trailers",
                "shorten the message; put long text in a task's body or a context note "
                "that fits the room's max_file")
    bad_commit(c)
    bad = bad_text(c.message) or bad_encoding(c)
    if bad:
        _refuse("format", c, f"the commit message {bad}", "send plain UTF-8 text "
                "(tabs and newlines are fine; no NUL or other control characters; no "
                "encoding header: git config --unset i18n.commitEncoding)")
    for ch in changes:
        if ch.mode != FILE_MODE:   # a deletion comes as a plain file: only what is there
            _refuse("format", c, f"{ch.path} is {_MODES.get(ch.mode, oct(ch.mode))}; a room "
                    "holds plain files only", "commit it as a plain, non-executable file "
                    "(git update-index --chmod=-x, or replace the link by the file)")
        if ch.new is None:
            continue
        size = len(ch.new.encode("utf-8", "surrogateescape"))
        if size > s["max_file"]:
            _refuse("size-limit", c, f"{ch.path} is {size} bytes; the room allows "
                    f"{s['max_file']}", "shorten it or put the bulk in a repository file")
        bad = bad_text(ch.new)
        if bad:
            _refuse("format", c, f"{ch.path} {bad}", "write the file as plain UTF-8 text "
                    "(no NUL or other control characters)")
    # A declared operation is checked for its exact shape by its own check below;
    # a commit made by hand without one has its operation read from its diff.
    if c.op != "room-layout":
        _check_paths(before, c, changes)
    _check_case(before, c, changes)
    op = c.op or infer(before, c, changes)
    pushed_by(c, ctx.pusher)
    fn = CHECKS.get(op) or (_check_task_move if op.startswith("task-") else None)
    if fn is None:
        _refuse("one-operation", c, f"unknown operation {op!r}",
                "use one of the operations listed in docs/PROTOCOL.md")
    if op != "register" and not op.startswith("room-") and \
            not (op[5:] in machine.HUB_MOVES and op.startswith("task-")
                 and model.is_hub_identity(c.author)):  # room ops check their own
        _registered(before, c, op)
    _check_key(c, op, ctx, before.name)
    if op.startswith(("task-", "handshake-")):   # what a lead may: the registry's leads
        _by_leads_now(fn, before, c, changes, ctx, op)
    else:
        fn(before, c, changes, ctx, op)
    return op


def _by_leads_now(fn, before, c, changes, ctx, op):
    """A task's or handshake's check, with the room's leads as the team registry has
    them: a hand-over stopped before it reached the room left the old lead reviewing
    and signing there, and the new one refused. Judged again, as recorded first."""
    def judge(teams):
        leads = leads_now(before.room, teams)
        view = before if leads == before.room["leads"] else before.with_leads(leads)
        return fn(view, c, changes, ctx, op)
    _by_a_registry(ctx, c, judge, recorded=True)


def _by_a_registry(ctx, c, judge, recorded=False):
    """judge(teams) by the registry `c` was made under: at receipt, the one of now;
    judged again, each of the commit's time (and none, `recorded`: as room.toml says),
    passing if one does; else the first refusal."""
    regs = ctx.registries_of(c)
    if recorded and ctx.now is None:
        regs = [None] + [r for r in regs if r is not None]
    refused = None
    for teams in regs:
        try:
            return judge(teams)
        except Refusal as e:
            refused = refused or e
    raise refused


# --- idempotency keys ---------------------------------------------------------

# How far back a repeated Gitdrop-Id is looked for: the commits dated within
# KEY_SECONDS of the new one, and never fewer than KEY_MIN_COMMITS nor more than
# KEY_MAX_COMMITS. A count alone was a few seconds of a busy room, and anyone
# could push past it between a call and its retry (which was then applied twice).
KEY_SECONDS = 24 * 3600
KEY_MIN_COMMITS, KEY_MAX_COMMITS = 2000, 100_000


def keyed_before(reader, tip: str, author: str, key: str, at: int, room: str = ""):
    """The newest commit by `author` with idempotency key `key` on the first-parent
    history up to `tip`, within the window of a commit dated `at`, or None: back to
    the first commit dated more than KEY_SECONDS before `at` once KEY_MIN_COMMITS are
    read, never past KEY_MAX_COMMITS (gitdrop.keywindow keeps what it read for the
    next keyed write). Asked twice for a keyed write (its writer, to answer a retry
    from the first commit; then the rules): kept."""
    memo = reader_memo(reader, "_keyed")
    k = (tip, author, str(key), at)
    if k not in memo:
        if len(memo) >= 256:
            memo.clear()
        memo[k] = keywindow.keyed_before(reader, tip, author, str(key), at, KEY_MIN_COMMITS,
                                         KEY_MAX_COMMITS, KEY_SECONDS, room)
    return memo[k]


# How the refusal of a keyed operation made again says so (sync takes it as landed).
APPLIED = "for this same operation: it is applied once"


def same_keyed(earlier, op: str, digest: str) -> bool:
    """Is `earlier` the operation (op and payload digest) a key names again?"""
    return earlier.op == op and fmt.trailer(earlier.trailers, "digest") == digest


def key_reused(earlier, key: str, op: str) -> Refusal:
    return Refusal("idempotency-key", f"the key {key!r} was used by {earlier.oid[:12]} "
                   f"(\"{earlier.subject[:60]}\") for "
                   + ("another operation" if earlier.op != op else
                      "the same operation with other arguments"),
                   "use a new key for a new operation (a key names one operation with one "
                   "payload; the same call replays)",
                   commit=fmt.commit_named(earlier.oid, earlier.subject))


def _check_key(c, op: str, ctx, room: str = "") -> None:
    """A key its author used before, within the window (keyed_before), is refused: for another
    operation, as gitdrop's writers refuse it; for the same one, since an operation
    is applied once (they answer such a retry from the first commit, writing none).
    A raw push was never asked."""
    key = fmt.trailer(c.trailers, "id")
    if not key or not c.parents:
        return
    earlier = keyed_before(ctx.reader, c.parents[0], c.author, key, c.time, room)
    if earlier is None:
        return
    if same_keyed(earlier, op, fmt.trailer(c.trailers, "digest")):
        _refuse("idempotency-key", c, f"the key {key!r} was used by {earlier.oid[:12]} "
                f"{APPLIED}", "nothing to do: it is in the room (gitdrop log shows it); "
                "use a new key for a new operation")
    raise key_reused(earlier, key, op)


def _check_paths(before, c, changes):
    """Agent and task files sit where the room's layout puts them."""
    for ch in changes:
        right = model.placed(ch.kind, ch.key, before.layout) if ch.layout else \
            model.misplaced(ch.path)
        if right and right != ch.path:
            _refuse("layout", c, f"{ch.path} is not where room {before.name!r} keeps it "
                    f"(layout {before.layout}, see docs/PROTOCOL.md): it belongs at {right}",
                    f"fetch the room (git pull --rebase), move the file (git mv {ch.path} "
                    f"{right}) and push again")


def _check_case(before, c, changes):
    """A new file, or a new directory on its path, may not differ from one beside it
    in case alone (agents/core/Juno.toml beside juno.toml): a checkout on a
    case-insensitive file system (macOS, Windows) makes them one file."""
    for ch in changes:
        if ch.old is not None or ch.new is None or before.tree is None:
            continue
        parts = ch.path.split("/")
        for i, part in enumerate(parts):
            here = "/".join(parts[:i])
            names = before.names(here)
            if part in names:
                continue   # there already: nothing new at this level
            twin = model.case_twin(part, names)
            if twin:
                there = f"{here}/{twin}" if here else twin
                _refuse("format", c, f"{ch.path} differs from {there} only in case; a "
                        "checkout on a case-insensitive file system (macOS, Windows) makes "
                        "them one", f"use the existing name ({twin}), or pick one that "
                        "differs in more than case")
            break   # the rest of the path is new too: nothing beside it


MESSAGE_EXTRA = 4096   # bytes a commit message may have beyond max_message: subject, trailers
FILE_MODE = 0o100644
_MODES = {0o100755: "an executable file", 0o120000: "a symbolic link",
          0o160000: "a submodule (gitlink)"}


def bad_text(text: str) -> str:
    """What makes `text` unfit for a room ("" if nothing): bytes that are not UTF-8
    (readers decode them with surrogateescape) or control characters other than
    tab, newline and carriage return (a NUL cuts the text short for C readers)."""
    if text.isprintable() or text.replace("\n", "").replace("\t", "").isprintable():
        return ""
    for i, ch in enumerate(text):
        if "\ud800" <= ch <= "\udfff":
            return f"is not valid UTF-8 (at character {i})"
        if (ch < " " and ch not in "\n\t\r") or ch == "\x7f":
            return f"contains the control character {ch!r} (at character {i})"
    return ""


def bad_encoding(c) -> str:
    """What is wrong with a commit's `encoding` header ("" if nothing). Every reader
    of a room takes its messages as UTF-8; git log, and pygit2, transcode from the
    declared one: a message declared UTF-7 read as other text, other trailers
    included, than the rules checked."""
    enc = getattr(c, "encoding", "") or ""
    if enc and enc.strip().lower() not in ("utf-8", "utf8"):
        return f"declares the encoding {enc[:40]!r}; messages are read as UTF-8"
    return ""


def pushed_by(c, pusher: str) -> None:
    """A commit through a door that knows who pushes names the pusher as its author
    and as its committer: git log shows both, and is the audit trail."""
    if not pusher or c.author == c.committer == pusher:
        return
    which = "author" if c.author != pusher else "committer"
    _refuse("authenticated-pusher", c, f"the commit's {which} is "
            f"{c.author if which == 'author' else c.committer} but the push was "
            f"authenticated as {pusher}", f"recommit your commits as {pusher} and push again: "
            f"git config user.name {pusher} && git rebase --exec 'git commit --amend "
            "--no-edit --allow-empty --reset-author' @{u}")


def bad_commit(c) -> None:
    """Refuse a commit whose headers are not in git's form (a second author or tree
    after the committer, say): git and pygit2 read the first of each, so readers
    would see another author or another tree than the one the rules judged."""
    problem = c.header_problem
    if problem:
        _refuse("format", c, f"the commit {problem}; git and every reader would read it "
                "otherwise than it was checked", "make the commit with git commit (or git "
                "commit-tree), not by hand")


def _check_clock(c, now: int, skew: int, past_ok: bool = False) -> None:
    """Dates are the pusher's word: at receipt a commit must be dated within
    `clock_skew` of the hub's clock, either way, so that time-based rules (the loop
    guard, idle rooms) cannot be fooled by a date far in the past or future."""
    if c.time > now + skew:
        _refuse("clock", c, f"the commit is dated {c.time - now}s in the future, ahead of "
                f"this hub's clock (the room allows {skew}s of clock skew)",
                "fix the clock of the machine that made it and recommit "
                "(git commit --amend --no-edit re-dates the last commit)")
    if c.time < now - skew and not past_ok:
        _refuse("clock", c, f"the commit is dated {now - c.time}s in the past (the room "
                f"allows {skew}s of clock skew)", "re-date it to now and push again: "
                "git rebase --force-rebase @{u} re-dates every commit not yet pushed "
                "(git commit --amend --no-edit the last one)")


def _check_after_parent(c, parent_time: int, skew: int) -> None:
    """An imported commit may be dated in the past, but not before the commit it
    builds on (two skews allowed: each was within one of a clock): 2,001 commits
    dated two days back hid every idempotency key behind them (the key window ends
    at the first commit older than a day), and made the room look idle."""
    if c.time < parent_time - 2 * skew:
        _refuse("clock", c, f"the commit is dated {parent_time - c.time}s before the commit "
                "it builds on", "a commit is made after its parent: date it so (git rebase "
                "--force-rebase re-dates commits not yet in the room)")


def _registered(before, c, op):
    # Membership first: an outsider is told why it cannot act, not to register.
    team = _member(before, c) if op != "deregister" else \
        model.split_agent(c.author)[0] if model.is_agent_id(c.author) else ""
    agent = before.agent(c.author) if team else None
    if agent is None:
        _refuse("registered-author", c, f"{c.author!r} is not registered in room "
                f"{before.name!r}", "register first (gitdrop register NAME --team TEAM) and "
                "make commits as team/name (git config user.name team/name)")


def _member(before, c) -> str:
    """The author's team, refused (room-membership) if the room does not take it."""
    team = model.split_agent(c.author)[0] if model.is_agent_id(c.author) else ""
    if team and not model.member_team(before.room, team):
        _refuse("room-membership", c, *team_outside(before.room, before.name, team))
    return team


def team_outside(room: dict, name: str, team: str, also: str = "") -> tuple[str, str]:
    """(reason, fix) for team `team`'s agent in room `name` (room.toml `room`), which
    does not take that team."""
    leads = sorted(set(room["leads"].values()))
    who = f"a lead of the room ({', '.join(leads)})" if leads else "a lead of the room"
    return (f"team {team!r} is not a member of room {name!r} (members: "
            f"{', '.join(room['teams']) or 'none'})",
            f"ask {who} to add team {team} (gitdrop room join {name} --team {team})" + also)


def _unknown_path(c, ch):
    """Refuse a file at a path no kind of document has, saying why where it can."""
    name = ch.path.rpartition("/")[2]
    stem = name.rpartition(".")[0] or name
    problem = model.KEY_RE.problem(stem)
    _refuse("format", c, f"{ch.path} is not a path gitdrop knows"
            + (f": {stem!r}: {problem}" if problem else ""),
            "see docs/PROTOCOL.md for the room layout (tasks/<xx>/<id>.md, "
            "contracts/<name>.md, context/<key>.md, ...)")


def _only(c, changes, kind, rule="one-operation"):
    for ch in changes:   # a file no operation writes says so, not "one file per commit"
        if not ch.kind:
            _unknown_path(c, ch)
    if len(changes) != 1 or changes[0].kind != kind:
        _refuse(rule, c, f"this operation must change exactly one {kind} file",
                "make one commit per operation")
    return changes[0]


# --- agents ----------------------------------------------------------------

def _check_register(before, c, changes, ctx, op):
    ch = _only(c, changes, "agent")
    if ch.old is not None:
        _refuse("one-operation", c, f"{ch.key} is already registered", "use status/ping")
    if ch.key != c.author:
        _refuse("registered-author", c, f"{c.author} cannot register {ch.key}",
                f"commit as {ch.key} (git config user.name {ch.key})")
    team = model.split_agent(ch.key)[0]
    if model.reserved_team(team) and team != model.DEFAULT_TEAM:
        _refuse("reserved-name", c, f"team {team!r} is reserved, in any case, for the hub's "
                "own identities (hub/admin, hub/reaper) and for agents that named no team "
                "(default/name); no agent registers in it",
                "register under your own team (team/name)")
    if not model.member_team(before.room, team):
        _refuse("room-membership", c, *team_outside(
            before.room, before.name, team, ", or register in a room your team is in"))
    teams = ctx.registry()
    if not team_member(teams, before.room, ch.key):
        _refuse("room-membership", c, *non_member(teams, before.name, ch.key))
    new = _doc(c, ch, "new")[0]
    if new["id"] != ch.key:
        _refuse("format", c, f"id must be {ch.key!r}", "set id to the path's team/name")
    # Beside the file check (_check_case): names are spread over buckets by their
    # bytes, so core/Kai's file is not beside core/kai's, but readers take one for the other.
    twin = model.case_twin(ch.key, before.agent_ids(team))
    if twin:
        _refuse("format", c, f"{ch.key} differs from {twin}, registered here, only in case",
                f"register as {twin} if that is you, or pick a name that differs in more "
                "than case")
    _check_agent_caps(before, c, new)
    if new["cursor"] != c.parent:
        _refuse("format", c, "a new agent's cursor must be the room tip it registered at "
                f"({c.parent[:12]})", "set cursor to the parent commit's id")


def team_member(teams, room: dict, agent_id: str) -> bool:
    """Whether a closed room may register `agent_id`: its team's entry in the registry
    (`teams`, hubrules.Registry; None: no registry) names it. A closed room lets teams
    in, and a team's lead says who is of the team: else anyone who could name an
    agent (an open MCP registration) joined any team."""
    team = model.split_agent(agent_id)[0]
    return teams is None or room["open"] or team not in teams.members or \
        agent_id in teams.members[team]


def non_member(teams, room: str, agent_id: str, then="register again") -> tuple[str, str]:
    """(reason, fix) for a registration team_member refuses."""
    team, name = model.split_agent(agent_id)
    lead = teams.get(team) or "its lead"
    return (f"{agent_id} is not a member of team {team} (the hub's team registry), and "
            f"room {room!r} is closed to all but its teams' members",
            f"ask {lead} to add {name} (gitdrop team add {team} {name} --as {lead}), then "
            + then)


def _check_agent_caps(before, c, agent):
    caps = agent["caps"]
    bad = next((x for x in caps if model.NAME_RE.problem(x)), None)
    if bad is not None or len(set(caps)) != len(caps) or len(caps) > before.settings["max_tags"]:
        _refuse("format", c, f"capabilities {caps!r}: each a name (letters, digits, . _ -), "
                f"no repeats, at most {before.settings['max_tags']}", "fix the caps list")


def _check_deregister(before, c, changes, ctx, op):
    ch = _only(c, changes, "agent")
    if ch.new is not None:
        _refuse("one-operation", c, "deregister removes the agent's file", "delete the file")
    if ch.key != c.author and not before.leads_for(c.author, ch.key):
        _refuse("lead-only", c, f"{c.author} cannot deregister {ch.key}",
                "only the agent itself or a lead may deregister an agent (in an open room, "
                "the lead of its own team)")


def _check_agent_update(before, c, changes, ctx, op):
    ch = _only(c, changes, "agent")
    if ch.new is None or ch.old is None:
        _refuse("one-operation", c, f"{op} changes an existing agent file",
                "register first (gitdrop register), and change only your own file")
    if ch.key != c.author:
        _refuse("registered-author", c, f"{c.author} cannot change {ch.key}'s file",
                "agents change only their own file")
    old, new = _doc(c, ch, "old")[0], _doc(c, ch, "new")[0]
    allowed = {"read": {"cursor"}, "ping": {"last_seen"},
               "status": {"status", "last_seen", "roles", "description", "caps", "human"}}[op]
    bad = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k) and k not in allowed)
    if bad:
        _refuse("one-operation", c, f"{op} may change only {', '.join(sorted(allowed))}, "
                f"not {', '.join(bad)}", "make one commit per operation")
    if new["caps"] != old["caps"]:
        _check_agent_caps(before, c, new)
    if op == "read" and old["cursor"] != new["cursor"]:
        _check_cursor(before, c, old["cursor"], new["cursor"], ctx)


def _check_cursor(before, c, old_cursor, new_cursor, ctx):
    for h in first_parent_walk(ctx.reader, c.parent):
        if h.oid == new_cursor:
            return
        if h.oid == old_cursor:
            break
    _refuse("unread-before-send", c, f"the new read cursor {new_cursor[:12]} is not a "
            "commit between the old cursor and the room tip", "set cursor to a commit of "
            "the room's history after the old cursor")


# --- messages ---------------------------------------------------------------

def recipients(c) -> tuple[list[str], list[str]]:
    """(to, cc) of a commit: its trailers, or `all` for a trailer-less note."""
    to, cc = _recipients(c)
    return list(to), list(cc)


def _recipients(c) -> tuple[tuple, tuple]:
    got = getattr(c, "rcpt", None)
    if got is None:   # kept on the commit: every walk back to a cursor asks again
        to = fmt.trailer_values(c.trailers, "to")
        cc = fmt.trailer_values(c.trailers, "cc")
        if not c.op and not to:
            to = [model.ALL]
        got = (tuple(to), tuple(cc))
        try:
            c.rcpt = got
        except AttributeError:
            pass
    return got


def addressed_to(c, agent_id: str, lead: bool) -> str:
    """How a message commit reaches an agent: "to", "cc", "team", "all", "lead" or ""."""
    return reaches(c.author, *_recipients(c), agent_id, lead)


def reaches(author: str, to, cc, agent_id: str, lead) -> str:
    """How a message from `author` to `to`/`cc` reaches an agent (a lead gets a copy
    of every message in the room): "to", "cc", "team", "all", "lead" or "". `lead`
    may be a function, asked only when nothing else decides (it reads a file)."""
    if author == agent_id:
        return ""
    if agent_id in to:
        return "to"
    if agent_id in cc:
        return "cc"
    team = model.split_agent(agent_id)[0]
    if "@" + team in to:
        return "team"
    if model.ALL in to:
        return "all"
    return "lead" if (lead() if callable(lead) else lead) else ""


def is_message(reader, c) -> bool:
    """A `send` commit, or a commit made by hand that changes no file (a note)."""
    if c.op:
        return c.op == "send"
    return bool(c.parents) and reader.commit(c.parent).tree == c.tree


def _check_send(before, c, changes, ctx, op):
    s = before.settings
    if changes:
        _refuse("one-operation", c, "a message commit must not change files",
                "commit the message with the parent's tree (git commit --allow-empty)")
    text = c.body or c.subject
    if not text.strip():
        _refuse("size-limit", c, "the message is empty", "write some text")
    if len(text.encode()) > s["max_message"]:
        _refuse("size-limit", c, f"the message is {len(text.encode())} bytes; the room "
                f"allows {s['max_message']}", "split it into shorter messages, or put the long "
                "text in a task's body (gitdrop task create TITLE --body-file FILE)")
    to, cc = recipients(c)
    if not to:
        _refuse("unknown-recipient", c, "the message has no recipient",
                "add Gitdrop-To: team/name, @team or all")
    for r in to + cc:
        if r == model.ALL:
            continue
        if r.startswith("@"):
            team = r[1:]
            if not model.member_team(before.room, team) or not before.names(f"agents/{team}"):
                _refuse("unknown-recipient", c, f"no team {team!r} in room {before.name!r}",
                        "check gitdrop who for the teams present")
            continue
        if not model.is_agent_id(r) or before.agent(r) is None:
            _refuse("unknown-recipient", c, f"{r!r} is not a registered agent in room "
                    f"{before.name!r}", "use gitdrop who to see who is here (names are team/name)")
    task = fmt.trailer(c.trailers, "task")
    if task and before.task(task) is None:
        _refuse("unknown-recipient", c, f"task {task} does not exist", "check gitdrop task list")
    _check_unread_and_loop(before, c, ctx)


def _check_unread_and_loop(before, c, ctx):
    """One walk back from the parent: unread messages since the sender's cursor, and
    the sender's messages inside the loop-guard window (dated by commit time)."""
    s = before.settings
    me = before.agent(c.author)
    cursor = me["cursor"] if me else ""
    lead = model.is_lead(me, before.room)
    cap, window = s["loop_cap"], s["loop_window"]
    # At receipt the window ends at the hub's clock, and the commits of the same
    # push count as sent now, whatever their dates say.
    at = c.time if ctx.now is None else ctx.now
    since = at - window
    fresh = ctx.fresh if ctx.now is not None else ()   # re-validation: dates only
    if cursor and not fresh and _quick_ok(ctx.reader, c, cursor, lead, cap, window, since):
        return
    unread, senders, sent, oldest_sent = 0, [], 0, None
    reached = not cursor
    for h in first_parent_walk(ctx.reader, c.parent):
        t = at if h.oid in fresh else h.time
        if h.oid == cursor:
            reached = True
        if reached and (not cap or t <= since):
            break
        if is_message(ctx.reader, h):
            if not reached and addressed_to(h, c.author, lead):
                unread += 1
                if h.author not in senders:
                    senders.append(h.author)
            if cap and h.author == c.author and t > since:
                sent += 1
                oldest_sent = t
    if unread:
        _refuse("unread-before-send", c, f"{c.author} has {unread} unread message(s) "
                f"(from {', '.join(model.short(x) for x in senders[:5])})",
                "read them first (gitdrop inbox), then send again")
    if cap and sent >= cap:
        wait = max(1, oldest_sent + window - at)
        until = fmt.stamp(at + wait, "%Y-%m-%d %H:%M:%S UTC")
        _refuse("loop-guard", c, f"{c.author} sent {sent} messages in the last {window}s "
                f"(room cap {cap})", f"wait {wait}s (until {until}) before sending again, or "
                "ask a lead to raise it (gitdrop room settings loop_cap N)")


def _brief(reader, oid: str) -> tuple:
    """(parent, author, time, is a message, to, cc) of a commit, kept on it: a walk
    back over other writers' commits asks this of each, many times over."""
    shared = getattr(reader, "briefs", None)   # from the other writers (combine.Briefs)
    if shared:
        b = shared.get(oid)
        if b is not None:
            return b
    h = reader.commit(oid)
    b = getattr(h, "brief", None)
    if b is None:
        to, cc = _recipients(h)
        b = (h.parent, h.author, h.time, is_message(reader, h), frozenset(to), frozenset(cc))
        try:
            h.brief = b
        except AttributeError:
            pass
    return b


# The walk entry the last _quick_ok of this thread made ((key, value) or None):
# the writer shares it with the room's other writers beside the commit's brief
# (combine.Briefs), so whichever holds the next turn starts from it.
WALKED = _thread._local()   # (threading imports too much for the hook)


def _quick_ok(reader, c, cursor, lead, cap, window, since) -> bool:
    """True when the walk above would accept, using a per-process memo on the
    reader (`reader.walks`, keyed by commit ids, so never stale): for (author,
    cursor, lead) it keeps, as of a tip T, the unread count from the cursor to T
    and the author's own message times there. A sender whose cursor lags far
    behind then walks only what is new since its last check, not back to its
    cursor. False means "decide the slow way" (a refusal is always worded by
    the full walk)."""
    memo = getattr(reader, "walks", None)
    if memo is None:
        return False
    key = (c.author, cursor, lead)
    got = memo.get(key)
    unread, own, found, floor, oid = 0, [], False, None, c.parent
    me, team = c.author, "@" + model.split_agent(c.author)[0]
    while oid:
        if oid == cursor:
            found = True
            break
        if got is not None and oid == got[0]:
            found, unread, floor, own = got[1], unread + got[2], got[3], got[4] + own
            break
        parent, author, when, message, to, cc = _brief(reader, oid)
        if message:   # as addressed_to decides, for an agent that is not `lead`'s callable
            if author == me:
                own.append(when)
            elif lead or me in to or me in cc or team in to or model.ALL in to:
                unread += 1
        oid = parent
    own.sort()
    # Own times at or below `floor` are dropped to bound the memo (each process
    # loads the whole memo: an hour of a busy writer's sends made it megabytes); a
    # window that reaches below it is decided by the full walk. Without a loop
    # guard none are kept, and a cap set later walks its first window afresh.
    if not cap:
        own, floor = [], max(floor or 0, since + window)
    elif own:
        keep_from = own[-1] - max(300, 2 * window)
        if floor is None or keep_from > floor:
            floor = keep_from
            own = own[bisect.bisect_right(own, floor):]
    if len(memo) > 10000:
        memo.clear()
    memo[key] = (c.parent, found, unread, floor, own)
    WALKED.entry = (key, memo[key])
    if unread:
        return False
    if not cap:
        return True
    if floor is not None and since < floor:
        return False
    sent = len(own) - bisect.bisect_right(own, since)
    oid = cursor if found else ""
    while oid:  # past the cursor, the walk goes on through the window
        h = reader.commit(oid)
        if h.time <= since:
            break
        if is_message(reader, h) and h.author == c.author:
            sent += 1
        oid = h.parent
    return sent < cap


# --- tasks ------------------------------------------------------------------

# Bytes of max_file a task's file leaves free when it is made or edited: a claim, a
# start, a lease renewal each add a field. A task made just under max_file could take
# no claim, yet ready offered it first: fifty of them stopped every claimer.
TASK_ROOM = 256


def _check_task_room(before, c, ch, old_size: int = 0):
    size = len(ch.new.encode("utf-8", "surrogateescape"))
    most = before.settings["max_file"] - TASK_ROOM
    if size > most and size > old_size:
        _refuse("size-limit", c, f"{ch.path} is {size} bytes; a task's file may take "
                f"{most} of the room's max_file ({before.settings['max_file']}), leaving "
                f"{TASK_ROOM} for the fields its moves add (claim, lease)",
                "shorten it, or put the bulk in a repository file and name its path")


def _check_task_trailer(c, tid: str) -> None:
    """A task operation names the task whose file it changes: the trailer files the
    commit under that task (history, a lease's last act). Another task's id there
    renewed a silent assignee's lease for ever, by anyone's commits."""
    named = fmt.trailer(c.trailers, "task")
    if named and named.lstrip("#") != tid:
        _refuse("format", c, f"the commit's Gitdrop-Task trailer names task {named}, but "
                f"it changes task {tid}", f"set Gitdrop-Task: {tid}")


def _check_task_create(before, c, changes, ctx, op):
    s = before.settings
    ch = _only(c, changes, "task")
    if ch.old is not None:
        _refuse("one-operation", c, f"task {ch.key} already exists", "pick a new id")
    # In another bucket, a twin is not seen by path; numbers (the ids gitdrop picks)
    # have no case, and listing a big room's tasks costs.
    twin = model.case_twin(ch.key, before.task_ids()) if ch.key.lower() != ch.key.upper() \
        else ""
    if twin:
        _refuse("format", c, f"task {ch.key} differs from task {twin}, already here, only in "
                "case", "pick an id that differs in more than case (gitdrop picks numbers)")
    _check_task_room(before, c, ch)
    t, body = _doc(c, ch, "new")
    if str(t["id"]) != ch.key:
        _refuse("format", c, f"the task's id field is {t['id']!r} but its file is {ch.path}",
                f"set id = \"{ch.key}\"")
    if t["creator"] != c.author:
        _refuse("registered-author", c, f"creator is {t['creator']!r} but the author is "
                f"{c.author}", f"set creator = \"{c.author}\"")
    _check_task_trailer(c, ch.key)
    if t["lease_until"]:   # a lease starts with a claim or a start, bounded there
        _refuse("task-lease", c, f"a new task holds no lease (lease_until is "
                f"{t['lease_until']})", "set lease_until = 0; the assignee's start sets one")
    _check_title(c, t["title"], s)
    if len(t["tags"]) > s["max_tags"]:
        _refuse("size-limit", c, f"{len(t['tags'])} tags; the room allows {s['max_tags']}",
                f"keep at most {s['max_tags']} tags")
    if t["state"] not in ("pending", "assigned"):
        _refuse("task-state-machine", c, f"a new task is pending or assigned, not {t['state']}",
                "create it as pending (or assigned with an assignee)")
    if (t["state"] == "assigned") != bool(t["assignee"]):
        _refuse("task-state-machine", c, "a new task is assigned exactly when it has an assignee",
                "set state = \"assigned\" with an assignee, or \"pending\" without")
    if t["assignee"]:
        _known_agent(before, c, t["assignee"])
    if t["reviewer"]:
        _known_agent(before, c, t["reviewer"])
    if t["retries"] or t["signoffs"] or t["resume"] or t["question"] or t["answer"] \
            or t["not_before"]:
        _refuse("task-state-machine", c, "a new task starts with no retries, signoffs, "
                "question, answer or not_before", "remove those fields")
    if t["handshake"] and before.handshake(t["handshake"]) is None:
        _refuse("handshake-go", c, f"handshake {t['handshake']} does not exist",
                "start the handshake first, or leave handshake = 0")
    _check_deps(before, c, None, t, ch.key)
    _check_brief(c, t, body, ch.key)
    if t["assignee"]:
        _check_caps(before, c, t, t["assignee"])


def _check_brief(c, t, body, tid):
    why = brief.problem(body) if t["brief"] else ""
    if why:
        _refuse("task-brief", c, f"task {tid} is a brief, but {why}", "give it the sections "
                "of a brief: start from templates/briefs/task.md (gitdrop task create TITLE "
                "--template task)")


def _check_deps(before, c, old, new, tid):
    """`after`, `requires` and `parent` of a new or edited task."""
    s = before.settings
    if old is not None and all(old[k] == new[k] for k in ("after", "requires", "parent")):
        return
    if len(new["requires"]) > s["max_tags"]:
        _refuse("size-limit", c, f"{len(new['requires'])} required capabilities; the room "
                f"allows {s['max_tags']}", f"require at most {s['max_tags']} capabilities")
    why = deps.problem(deps.lookup(before), tid, new["after"], new["requires"],
                       new=old is None)
    if why:
        _refuse("task-dependency", c, why, "list only existing tasks in after, with no "
                "cycle (gitdrop task graph shows the graph)")
    if new["parent"] and (new["parent"] == tid or before.task(new["parent"]) is None):
        _refuse("task-dependency", c, f"parent task {new['parent']} does not exist",
                "give an existing task as parent, or leave parent empty")


def _check_waiting(before, c, task, tid, move):
    tasks = deps.lookup(before)
    waiting = deps.waiting_on(tasks, task)
    if waiting:
        blocked = deps.blocked_by(tasks, task)
        _refuse("task-dependency", c, f"task {tid} waits on task{'s' * (len(waiting) > 1)} "
                f"{', '.join(waiting)}, not completed yet" + (f" ({blocked})" if blocked else "")
                + f"; it cannot {move} before",
                "retry or replace the failed dependency, or edit after" if blocked else
                "start it once they are: it is yours meanwhile, and the notice of their "
                "completion tells you (take a ready task in between: gitdrop ready)"
                if task["assignee"] == c.author else "take a ready task instead (gitdrop ready)")


def _check_caps(before, c, task, agent_id):
    need = task["requires"]
    if not need:
        return
    agent = before.agent(agent_id)
    missing = deps.missing_caps(agent["caps"] if agent else [], task)
    if missing:
        _refuse("task-capability", c, f"task {task['id']} requires {', '.join(need)}; "
                f"{agent_id} lacks {', '.join(missing)}", "give it to an agent that declared "
                "those capabilities (gitdrop who shows them; an agent declares them with "
                "gitdrop register --cap)")


def _known_agent(before, c, agent_id):
    if not model.is_agent_id(agent_id) or before.agent(agent_id) is None:
        _refuse("unknown-recipient", c, f"{agent_id!r} is not a registered agent in room "
                f"{before.name!r}", "use gitdrop who to see who is here (names are team/name)")


def task_roles(view: RoomView, task: dict, agent_id: str) -> set:
    """The roles an agent holds towards a task (for the machine's `who` column)."""
    roles = set()
    agent = view.agent(agent_id)
    if agent is not None:
        roles.add("member")
    if task["assignee"] == agent_id:
        roles.add("assignee")
    if task["creator"] == agent_id:
        roles.add("creator")
    lead = model.leads_for(agent, view.room, task["creator"], task["assignee"])
    if lead:
        roles.add("lead")
    if reviewer_ok(view, task, agent_id, lead):
        roles.add("reviewer")
    return roles


def team_lead(view, team: str) -> str:
    """Who leads a team in this room: the lead recorded in room.toml (from the hub's
    team registry); "" if none."""
    return model.lead_of_team(view.room, team) if team else ""


def reviewer_of(view, task) -> str:
    """Each lead reviews their own agents: the task's reviewer when it is of the
    assignee's team (or the team has no lead), else the lead of the assignee's team;
    "" means any lead, or the hub's operator. A lead's own work is any other lead's
    (else it was its own to approve, which nobody may: nobody could)."""
    team = model.split_agent(task["assignee"])[0] if task["assignee"] else ""
    lead = team_lead(view, team)
    if task["reviewer"] and task["reviewer"] != task["assignee"] and \
            (not lead or model.split_agent(task["reviewer"])[0] == team):
        return task["reviewer"]
    return "" if lead == task["assignee"] else lead


def reviewer_ok(view, task, agent_id, lead) -> bool:
    """Nobody reviews their own work; see reviewer_of for who does."""
    if agent_id == task["assignee"]:
        return False
    who = reviewer_of(view, task)
    return agent_id == who if who else lead or model.is_hub_identity(agent_id)


def _check_task_move(before, c, changes, ctx, op):
    ch = _only(c, changes, "task")
    if ch.old is None or ch.new is None:
        _refuse("task-state-machine", c, f"{op} changes an existing task",
                "name a task that exists (gitdrop task list); tasks are cancelled, not deleted")
    (old, old_body), (new, new_body) = _doc(c, ch, "old"), _doc(c, ch, "new")
    _check_task_trailer(c, ch.key)
    move = op[5:]
    if move not in machine.MOVES:
        _refuse("task-state-machine", c, f"unknown move {move!r}",
                "moves: " + ", ".join(machine.MOVES))
    frm, _to, who, fields = machine.MOVES[move]
    tid = ch.key
    if old["state"] not in frm:
        if move == "claim" and old["assignee"] and old["assignee"] != c.author:
            # a lost race: say who won (its own assignee is told its next moves, below)
            _refuse("task-state-machine", c, f"task {tid} was already claimed by "
                    f"{old['assignee']} (it is {old['state']})",
                    "pick another task (gitdrop task list --state pending)")
        roles = task_roles(before, old, c.author)
        moves = machine.legal_moves(old["state"], old, roles)
        if _to == old["state"] and set(who) & set(roles) and \
                ("assignee" not in who or old["assignee"] == c.author):
            # where the move leads, made by one who may: often a call made again, its
            # answer lost
            mine = ", and yours" if old["assignee"] == c.author else ""
            article = "an" if move[0] in "aeiou" else "a"
            _refuse("task-state-machine", c, f"task {tid} is {old['state']} already{mine} "
                    f"({move} needs {' or '.join(frm)}): {article} {move} asked for before "
                    "may have landed, its answer lost", f"nothing to do if so; else {moves}")
        _refuse("task-state-machine", c, f"task {tid} is {old['state']}; {move} needs "
                f"{' or '.join(frm)}", moves)
    want = machine.target(move, old)
    if new["state"] != want:
        _refuse("task-state-machine", c, f"{move} takes task {tid} from {old['state']} to "
                f"{want}, not {new['state']}", f"set state = \"{want}\"")
    free = set(fields) | {"state", "updated", "note"}
    bad = sorted(k for k in old if old[k] != new.get(k) and k not in free)
    if old_body != new_body and "body" not in free:
        bad.append("body")
    if bad:
        _refuse("one-operation", c, f"{move} may not change {', '.join(bad)} of task {tid}",
                "make one commit per change (edit the task separately)")
    roles = task_roles(before, old, c.author)
    if move == "claim" or (move == "reap" and model.is_hub_identity(c.author)):
        roles.add("member")
    if not roles & set(who):
        _refuse("task-state-machine", c, f"{c.author} may not {move} task {tid} (needs "
                f"{' or '.join(who)}; task creator {old['creator']}, assignee "
                f"{old['assignee'] or 'none'})", _who_fix(before, move, who, old, tid))
    if move in machine.NEEDS_NOTE and not (new["note"] or "").strip() and not c.body.strip():
        _refuse("task-state-machine", c, f"{move} needs a reason", "give a reason (--reason)")
    _MOVE_CHECKS.get(move, _none)(before, c, old, new, tid)
    if move == "edit":   # a file at the edge from before may still shrink
        _check_task_room(before, c, ch, len(ch.old.encode("utf-8", "surrogateescape")))
    if move == "edit" and (new["brief"] != old["brief"] or new_body != old_body):
        _check_brief(c, new, new_body, tid)
    if "lease_until" in fields:
        _check_task_lease(before, c, old, new, tid, ctx, move)


def _none(*_a):
    pass


def _who_fix(before, move, who, task, tid):
    if "assignee" in who and task["assignee"]:
        return f"only {task['assignee']} (the assignee) can do this"
    if "reviewer" in who:
        rev = reviewer_of(before, task)
        return f"ask {rev} (the reviewer) to do it" if rev else \
            "ask another lead of the room to do it, or the hub's operator (on the hub's " \
            "machine: the same command with --as hub/admin)"
    if move == "sign":
        return _sign_fix(before, task, tid)
    named = {task["creator"]: ["its creator"]} if "creator" in who and task["creator"] else {}
    if "lead" in who:
        for x in sorted({team_lead(before, model.split_agent(a)[0])
                         for a in (task["creator"], task["assignee"]) if a} - {""}):
            named.setdefault(x, []).append("a lead")
    if not named:
        return f"ask a {' or '.join(who)} to do it"
    return "ask " + " or ".join(f"{x} ({', '.join(r)})" for x, r in named.items()) + " to do it"


def _sign_fix(before, task, tid) -> str:
    need = signers_needed(before, task)
    return f"ask {' and '.join(need)} to sign it (gitdrop task sign {tid})" if need else \
        f"nothing to sign: it starts without (gitdrop task show {tid})"


def _move_assign(before, c, old, new, tid):
    _known_agent(before, c, new["assignee"])
    _check_caps(before, c, old, new["assignee"])
    _clears_signoffs(c, new, "assigning")


def _clears_signoffs(c, new, doing: str) -> None:
    """A task handed anew starts with no sign-offs: else whoever hands it (its
    creator, on a retry) wrote the leads' names in."""
    if new["signoffs"]:
        _refuse("dual-sign", c, f"{doing} clears the sign-offs", "set signoffs = []")


def _move_claim(before, c, old, new, tid):
    if new["assignee"] != c.author:
        _refuse("task-state-machine", c, f"a claim assigns the task to its author ({c.author})",
                f"set assignee = \"{c.author}\"")
    _check_caps(before, c, old, c.author)
    _check_waiting(before, c, old, tid, "be claimed")


def _move_start(before, c, old, new, tid):
    _check_waiting(before, c, old, tid, "start")
    hid = old["handshake"]
    if hid:
        hs = before.handshake(hid)
        if hs is None or hs[0]["status"] != "go":
            pending = [a for a in hs[0]["targets"] if a not in hs[0]["acks"]] if hs else []
            _refuse("handshake-go", c, f"task {tid} is bound to handshake {hid}, which is not "
                    f"at GO (waiting for {', '.join(pending) or 'nothing'})",
                    (f"ack it yourself first (gitdrop handshake ack {hid}), then start again"
                     if c.author in pending else
                     f"each target still to ack runs gitdrop handshake ack {hid}; start "
                     "again at GO (gitdrop handshake status " + str(hid) + ")"))
    missing = signers_owed(before, old)
    if missing:
        _refuse("dual-sign", c, f"task {tid} crosses teams and needs sign-off from "
                f"{', '.join(missing)} before it starts", f"ask {', '.join(missing)} to sign "
                f"it (gitdrop task sign {tid})")


def signers_needed(view, task) -> list[str]:
    """Leads who must sign a cross-team task before it starts (dual-sign)."""
    if not task["assignee"] or not task["creator"]:
        return []
    teams = {model.split_agent(task["creator"])[0], model.split_agent(task["assignee"])[0]}
    if len(teams) < 2:
        return []
    return sorted(x for x in (team_lead(view, t) for t in teams) if x)


def signers_owed(view, task) -> list[str]:
    """Of those, the leads who have not signed yet (what start waits for)."""
    return [x for x in signers_needed(view, task) if x not in task["signoffs"]]


def _move_retry(before, c, old, new, tid):
    if new["retries"] != old["retries"] + 1:
        _refuse("task-state-machine", c, "a retry adds one to retries",
                f"set retries = {old['retries'] + 1}")
    if old["retries"] >= old["max_retries"]:
        _refuse("task-state-machine", c, f"task {tid} has used its {old['max_retries']} "
                "retries", "cancel it or create a new task")
    _known_agent(before, c, new["assignee"])
    _check_caps(before, c, old, new["assignee"])
    _clears_signoffs(c, new, "retrying")


def _records_resume(c, old, new, move: str) -> None:
    """block and ask record the state their way back (unblock, answer) returns to:
    an answer into in_progress skipped what a start waits for (the task's
    dependencies, its handshake, the leads' sign-offs) when asked before the start."""
    if new["resume"] != old["state"]:
        _refuse("task-state-machine", c, f"{move} records the state to resume",
                f"set resume = \"{old['state']}\"")


def _clears_resume(c, new, move: str) -> None:
    if new["resume"]:
        _refuse("task-state-machine", c, f"{move} clears resume", "set resume = \"\"")


def _move_block(before, c, old, new, tid):
    _records_resume(c, old, new, "block")


def _move_unblock(before, c, old, new, tid):
    _clears_resume(c, new, "unblock")


def _move_ask(before, c, old, new, tid):
    if not new["question"].strip() or new["answer"]:
        _refuse("task-state-machine", c, "ask sets a question and clears the answer",
                "give the question (--question)")
    _records_resume(c, old, new, "ask")


def _move_answer(before, c, old, new, tid):
    if not new["answer"].strip():
        _refuse("task-state-machine", c, "answer sets the answer", "give the answer text")
    _clears_resume(c, new, "answer")


def _move_sign(before, c, old, new, tid):
    need = signers_needed(before, old)
    if c.author not in need:
        _refuse("dual-sign", c, f"{c.author} is not one of the leads who sign task {tid} "
                f"({', '.join(need) or 'it needs no sign-off'})", _sign_fix(before, old, tid))
    if c.author in old["signoffs"] or new["signoffs"] != old["signoffs"] + [c.author]:
        _refuse("dual-sign", c, f"{c.author} signs once, by appending itself to signoffs",
                "sign only once")


def _check_title(c, title: str, s: dict) -> None:
    if not title.strip() or len(title) > s["max_title"]:
        _refuse("size-limit", c, f"a task title must have 1 to {s['max_title']} characters",
                "give the task a short title; details go in the body")
    if fmt.line_break(title):   # listed one per line: a break would draw a line of its own
        _refuse("format", c, "a task title is one line; this one breaks the line",
                "put the rest in the task's body")


def _move_edit(before, c, old, new, tid):
    s = before.settings
    if new["title"] != old["title"]:   # a title already there is read as it is
        _check_title(c, new["title"], s)
    if new["reviewer"] and new["reviewer"] != old["reviewer"]:
        _known_agent(before, c, new["reviewer"])
    lead = before.leads_for(c.author, old["creator"], old["assignee"])
    decides = c.author == old["creator"] or lead
    if new["review"] != old["review"] and not decides:
        _refuse("task-state-machine", c, f"only the creator ({old['creator']}) or a lead "
                "decides whether a task goes through review", "ask them to change it")
    # Who reviews the work, and the work under review, are not its doer's to change:
    # an assignee named a teammate reviewer after submitting, and the lead never saw it.
    if new["reviewer"] != old["reviewer"] and not decides:
        _refuse("task-state-machine", c, f"only the creator ({old['creator']}) or a lead "
                "picks a task's reviewer", "ask them to change it")
    if new["max_retries"] != old["max_retries"] and not decides:   # its failures never
        _refuse("task-state-machine", c, f"only the creator ({old['creator']}) or a lead "
                "sets how often a task may be retried", "ask them to change it")   # counted
    # What a task waits on is not its doer's to change either: an assignee dropped a
    # dependency to start early, or pointed a task in progress at one that would
    # never be done, and held it past every reap.
    if new["after"] != old["after"] and not decides:
        _refuse("task-state-machine", c, f"only the creator ({old['creator']}) or a lead "
                f"changes what task {tid} waits on", "ask them to change it")
    if new["handshake"] != old["handshake"]:
        _check_rebind(before, c, old, new, tid, lead or (
            c.author == old["creator"] and c.author != old["assignee"]))
    if old["state"] == "review" and not decides:
        _refuse("task-state-machine", c, f"task {tid} is in review: only its creator "
                f"({old['creator']}) or a lead may edit it now", "wait for the review "
                "(an approval or a request for changes), or ask them")
    _check_deps(before, c, old, new, tid)


def _check_rebind(before, c, old, new, tid, decides):
    """A task bound to a handshake that cannot reach GO (a target deregistered, or
    gone for good) waited for ever: its creator or a lead binds it to another
    handshake, or to none, before work starts. Not its doer (the creator who is
    also its assignee included): that would skip the agreement it waits for."""
    if not decides:
        _refuse("handshake-go", c, f"only a lead, or the task's creator ({old['creator']}) "
                f"when someone else is to do it, binds task {tid} to another handshake",
                "ask a lead to change it")
    if old["state"] not in ("pending", "assigned"):
        _refuse("handshake-go", c, f"task {tid} is {old['state']}: its handshake changes only "
                "before work starts (pending or assigned)", "leave it as it is")
    if new["handshake"] and before.handshake(new["handshake"]) is None:
        _refuse("handshake-go", c, f"handshake {new['handshake']} does not exist",
                "start the handshake first (gitdrop handshake start), or bind to 0 for none")


def _move_complete(before, c, old, new, tid):
    if old["review"]:
        _refuse("task-state-machine", c, f"task {tid} goes through review (review = true); "
                "its assignee submits it and the reviewer approves",
                f"submit it for review (gitdrop task submit {tid})")


def _move_release(before, c, old, new, tid):
    s = before.settings
    if new["assignee"] or new["lease_until"] or new["signoffs"] or \
            new["retries"] not in (old["retries"], old["retries"] + 1):
        _refuse("task-state-machine", c, "a release returns the task unassigned, clears lease "
                "and signoffs, and counts a retry or not", f"set assignee = \"\", lease_until "
                f"= 0, signoffs = [], retries = {old['retries']} (or + 1 for a failure)")
    if new["retries"] > old["max_retries"]:
        _refuse("task-state-machine", c, f"task {tid} has used its {old['max_retries']} "
                "retries", f"fail it instead (gitdrop task fail {tid} --reason ...)")
    if new["not_before"] and new["not_before"] - c.time > s["max_task_lease"] + s["clock_skew"]:
        _refuse("task-lease", c, f"not_before is {new['not_before'] - c.time}s ahead; the room "
                f"allows {s['max_task_lease']}s", "retry sooner")


def _move_reap(before, c, old, new, tid):
    failing = new["state"] == "failed"
    retries = old["retries"] + (0 if failing else 1)
    assignee = old["assignee"] if failing else ""
    if new["retries"] != retries or new["assignee"] != assignee or new["lease_until"] \
            or new["signoffs"]:
        _refuse("task-state-machine", c, "a reap " + (
            "that fails the task keeps its assignee and retries" if failing else
            "counts a retry and returns the task unassigned") + " and clears lease and signoffs",
                f"set retries = {retries}, assignee = \"{assignee}\", lease_until = 0, "
                "signoffs = []")


def lease_expiry(reader, settings: dict, task: dict, tip: str, now: int) -> tuple[int, int]:
    """(when the task's lease ends, the last act that renewed it or 0). The lease
    runs to the later of its `lease_until` and the room's task_lease after the
    last act in the room of the assignee, or of any task move of this task; an
    act's date counts no later than `now` (the hub's clock). The walk reads back
    only as far as such an act could still matter. The completion of a dependency
    renews it too: a task that waited was not abandoned."""
    lease, skew = settings["task_lease"], settings["clock_skew"]
    who, tid, last, after = task["assignee"], str(task["id"]), 0, task["after"]
    for h in first_parent_walk(reader, tip):
        if h.time < now - lease - skew:
            break
        if (who and h.author == who) or \
                (h.op.startswith("task-") and fmt.trailer(h.trailers, "task") == tid) or \
                (after and h.op in ("task-approve", "task-complete") and
                 fmt.trailer(h.trailers, "task") in after):
            last = min(h.time, now)
            break
    return max(task["lease_until"], last + lease if last else 0), last


def _check_task_lease(before, c, old, new, tid, ctx, move):
    s = before.settings
    if move == "reap":
        if ctx.now is None:
            return   # re-validating history: whether it had expired was the hub's call
        if old["assignee"] and before.agent(old["assignee"]) is None:
            return   # its holder left the room: nobody will finish it, or renew it
        waiting = deps.lease_waits_on(deps.lookup(before), old)
        if waiting:
            _refuse("task-lease", c, f"task {tid} waits on {', '.join(waiting)}; its lease "
                    "runs from when they complete", "leave it: it is waiting, not abandoned")
        ends, last = lease_expiry(ctx.reader, s, old, c.parent, ctx.now)
        if ctx.now < ends:
            seen = f", last act {ctx.now - last}s ago" if last else ""
            _refuse("task-lease", c, f"task {tid} is held by {old['assignee'] or 'nobody'} "
                    f"until {fmt.stamp(ends)} ({ends - ctx.now}s from the hub's clock{seen}); a "
                    "reap needs an expired lease", "wait until it expires (any act of the "
                    "assignee in the room renews it)")
        return
    if new["lease_until"] and new["lease_until"] != old["lease_until"]:
        base = _lease_base(c, ctx)
        if new["lease_until"] - base > s["max_task_lease"] + s["clock_skew"]:
            _refuse("task-lease", c, f"the lease runs {new['lease_until'] - base}s; the room "
                    f"allows {s['max_task_lease']}s", f"set lease_until at most "
                    f"{s['max_task_lease']}s ahead (gitdrop task renew ID --for SECONDS)")


def _lease_base(c, ctx) -> int:
    """From when a lease's length is measured. Re-validating history (verify, an
    import) only the commit's date is known; at receipt the earlier of it and the
    hub's clock, so that what the hub took re-validates: a commit dated within
    clock_skew before the hub's clock, its lease measured from the clock, was taken
    and then refused by verify for good, the room's export with it."""
    return c.time if ctx.now is None else min(ctx.now, c.time)


_MOVE_CHECKS = {"assign": _move_assign, "claim": _move_claim, "start": _move_start,
                "retry": _move_retry, "reap": _move_reap, "complete": _move_complete,
                "release": _move_release, "block": _move_block, "unblock": _move_unblock,
                "ask": _move_ask, "answer": _move_answer, "sign": _move_sign,
                "edit": _move_edit}


# --- handshakes, contracts, context -----------------------------------------

def _check_handshake_start(before, c, changes, ctx, op):
    ch = _only(c, changes, "handshake")
    if ch.old is not None:
        _refuse("one-operation", c, f"handshake {ch.key} already exists", "pick the next id")
    if not before.is_lead(c.author):
        _refuse("lead-only", c, f"{c.author} is not a lead; only leads start handshakes",
                "ask your lead to start it")
    h, plan = _doc(c, ch, "new")
    if str(h["id"]) != ch.key or h["initiator"] != c.author:
        _refuse("format", c, "id must match the file name and initiator the author",
                f"set id = {ch.key} and initiator = \"{c.author}\"")
    if not plan.strip():
        _refuse("size-limit", c, "a handshake needs a plan (the body)", "write the plan")
    if not h["targets"] or len(set(h["targets"])) != len(h["targets"]):
        _refuse("format", c, "targets must be a non-empty list without repeats",
                "name each agent that must ack once (team/name)")
    if c.author in h["targets"]:   # it agreed by starting it: acking it alone was a GO
        _refuse("handshake-ack-once", c, "the initiator is not a target of its own handshake",
                "name the agents that must agree, not yourself")
    for t in h["targets"]:
        _known_agent(before, c, t)
    if h["acks"] or h["status"] != "pending":
        _refuse("handshake-ack-once", c, "a new handshake has no acks and status pending",
                "set acks = [] and status = \"pending\"; the targets ack it themselves")


def _check_handshake_ack(before, c, changes, ctx, op):
    ch = _only(c, changes, "handshake")
    if ch.old is None or ch.new is None:   # a deletion was an AttributeError: no rule said
        _refuse("one-operation", c, f"an ack changes handshake {ch.key}'s file; it neither "
                "makes nor removes it", "ack with gitdrop handshake ack ID")
    (old, old_plan), (new, new_plan) = _doc(c, ch, "old"), _doc(c, ch, "new")
    hid = ch.key
    if c.author not in old["targets"]:
        _refuse("handshake-ack-once", c, f"{c.author} is not a target of handshake {hid} "
                f"(targets: {', '.join(old['targets'])})", "only targeted agents ack")
    if c.author in old["acks"]:
        _refuse("handshake-ack-once", c, f"{c.author} already acked handshake {hid}",
                "nothing to do: each agent acks once")
    acks = old["acks"] + [c.author]
    status = "go" if set(acks) >= set(old["targets"]) else "pending"
    want = dict(old, acks=acks, status=status)
    if new != want or new_plan != old_plan:
        _refuse("handshake-ack-once", c, f"an ack appends its author to acks and sets status "
                f"to {status}; nothing else changes", f"set acks = {acks}, status = \"{status}\"")


def _check_contract(before, c, changes, ctx, op):
    ch = _only(c, changes, "contract")
    if ch.new is None:   # a deletion was an AttributeError: no rule said
        _refuse("one-operation", c, f"contract {ch.key} is declared or bumped, never removed",
                "declare a new version instead (gitdrop contract declare NAME)")
    new, spec = _doc(c, ch, "new")
    if new["name"] != ch.key:
        _refuse("format", c, f"name must be {ch.key!r}", f"set name = \"{ch.key}\" (the "
                "file's name is the contract's)")
    if new["kind"] not in model.CONTRACT_KINDS:
        _refuse("format", c, f"kind {new['kind']!r} is not one of "
                f"{', '.join(model.CONTRACT_KINDS)}", "pick a listed kind")
    if not spec.strip():
        _refuse("size-limit", c, "a contract needs its interface text (the body)",
                "write the interface (gitdrop contract declare NAME --text ...)")
    if ch.old is None:
        if new["owner"] != c.author or new["version"] != 1:
            _refuse("contract-version", c, "a new contract has version 1 and its author as owner",
                    f"set owner = \"{c.author}\", version = 1")
        return
    old = _doc(c, ch, "old")[0]
    if c.author != old["owner"] and not before.leads_for(c.author, old["owner"]):
        _refuse("contract-owner", c, f"contract {ch.key} belongs to {old['owner']}",
                f"ask {old['owner']} (or a lead) to change it")
    if new["version"] != old["version"] + 1:
        _refuse("contract-version", c, f"contract {ch.key} is at version {old['version']}; a "
                f"change must bump it to {old['version'] + 1}", f"set version = {old['version'] + 1}")
    if new["owner"] != old["owner"]:
        _refuse("contract-owner", c, "the owner of a contract does not change",
                f"keep owner = \"{old['owner']}\"; declare a new contract for a new owner")


def _check_context(before, c, changes, ctx, op):
    _only(c, changes, "context")


# --- path leases on the work repository -------------------------------------

def lease_conflict(view: RoomView, lease: dict, now: int) -> dict | None:
    """A live lease of another agent that `lease` may not coexist with: overlapping
    globs where either is exclusive. Expired leases (until <= now) do not count."""
    for other in view.leases():
        if other["id"] == lease["id"] or other["holder"] == lease["holder"] \
                or other["until"] <= now:
            continue
        if "exclusive" not in (lease["mode"], other["mode"]):
            continue
        if model.globs_overlap(lease["glob"], other["glob"]):
            return other
    return None


def _check_lease_take(before, c, changes, ctx, op):
    ch = _only(c, changes, "lease")
    if ch.new is None:
        _refuse("one-operation", c, f"lease-take must write leases/{ch.key}.toml",
                "release a lease with lease-release")
    new = _doc(c, ch, "new")[0]
    if new["id"] != ch.key or new["holder"] != c.author:
        _refuse("format", c, "a lease's id must match its file name and its holder the author",
                f"set id = \"{ch.key}\", holder = \"{c.author}\"")
    if new["mode"] not in model.LEASE_MODES:
        _refuse("format", c, f"lease mode {new['mode']!r} is not one of "
                f"{', '.join(model.LEASE_MODES)}", "set mode = \"exclusive\" or \"shared\"")
    problem = model.glob_problem(new["glob"])
    if problem:
        _refuse("format", c, f"bad lease glob {new['glob']!r}: {problem}",
                "give a path of the work repository, e.g. 'src/api/**'")
    if ch.old is not None:
        old = _doc(c, ch, "old")[0]
        if old["holder"] != c.author or old["glob"] != new["glob"] \
                or old["mode"] != new["mode"]:
            _refuse("lease-holder", c, f"lease {ch.key} is held by {old['holder']} on "
                    f"{old['glob']} ({old['mode']}); only its holder renews it, unchanged",
                    "take a new lease instead")
    s = before.settings
    base = _lease_base(c, ctx)
    most = s["max_lease_ttl"] + s["clock_skew"]
    if new["until"] - base > most:
        _refuse("lease-ttl", c, f"the lease runs {new['until'] - base}s; the room allows "
                f"{s['max_lease_ttl']}s", f"take it for at most {s['max_lease_ttl']}s "
                "(gitdrop lease take GLOB --ttl ...) and renew it when needed")
    if ctx.now is None:
        return   # whether another lease was still live is a matter of the hub's clock
    if new["until"] <= ctx.now:
        _refuse("lease-ttl", c, f"the lease expired at {fmt.stamp(new['until'])}, before "
                f"the hub received it ({fmt.stamp(ctx.now)})", "take it with a time to live")
    if ch.old is None:
        # Each take is checked against every lease in the room, and a teammate's
        # commit guard matches each path it commits against each: one agent's
        # 3,000 leases held the hook 65 s and made each guarded commit take 10 s.
        held = sum(1 for x in before.leases() if x["holder"] == c.author and
                   x["until"] > ctx.now)
        if held >= s["max_leases"]:
            _refuse("lease-limit", c, f"{c.author} holds {held} live path leases; the room "
                    f"allows {s['max_leases']} an agent", "release those you are done with "
                    "(gitdrop lease release ID), or take a wider glob")
    other = lease_conflict(before, new, ctx.now)
    if other is not None:
        _refuse("lease-conflict", c, f"{new['glob']} ({new['mode']}) overlaps lease "
                f"{other['id']} on {other['glob']} held ({other['mode']}) by {other['holder']} "
                f"until {fmt.stamp(other['until'])}",
                f"wait for it to expire or be released, ask {other['holder']} to release it, "
                "or take a narrower glob" + (" (or --shared)" if other["mode"] == "shared"
                                             else ""))


def _check_lease_release(before, c, changes, ctx, op):
    ch = _only(c, changes, "lease")
    if ch.new is not None or ch.old is None:
        _refuse("one-operation", c, f"lease-release deletes leases/{ch.key}.toml, and "
                "nothing else", "delete the lease's file")
    old = _doc(c, ch, "old")[0]
    if old["holder"] != c.author and not before.leads_for(c.author, old["holder"]):
        _refuse("lease-holder", c, f"lease {ch.key} on {old['glob']} is held by "
                f"{old['holder']}; only its holder or a lead releases it",
                f"ask {old['holder']} (or a lead) to release it, or wait until "
                f"{fmt.stamp(old['until'])} when it expires")


# --- the room itself ---------------------------------------------------------

def _check_room_create(before, c, changes, ctx, op):
    if c.parents:
        _refuse("linear-history", c, "a room is created by its first (root) commit",
                "create rooms with gitdrop room create")
    ch = _only(c, changes, "room")
    room = _doc(c, ch, "new")[0]
    if not model.is_name(room["name"]):
        _refuse("format", c, f"bad room name {room['name']!r}",
                "name the room with letters, digits, '.', '_' or '-' (gitdrop room create)")
    _check_leads(c, room)
    _check_settings(c, room)
    teams = ctx.registry()
    if teams is not None:
        _registry_leads(c, room, {}, teams)
        unsaid = [t for t in room["teams"] if t in teams and room["leads"].get(t) != teams[t]]
        if unsaid and ctx.now is not None:   # a room made without another team's lead
            _refuse("lead-only", c, f"room.toml leaves out the lead of team {unsaid[0]} "
                    f"({teams[unsaid[0]]}): a new room records the registry's lead of each "
                    "of its teams", f"add {unsaid[0]} = \"{teams[unsaid[0]]}\" under [leads] "
                    "(gitdrop room create does)")
        mine = [t for t, lead in teams.items() if lead == c.author]
        if not (model.is_hub_identity(c.author) or set(mine) & set(room["teams"]) or
                (not room["teams"] and mine)):
            _refuse_room_creator(c, room)
    # rooms made before the current layout were made without one (re-checked history)
    if room["layout"] != model.LAYOUT and (ctx.now is not None or room["layout"] != 1):
        _refuse("layout", c, f"room.toml says layout = {room['layout']}; a new room is in "
                f"layout {model.LAYOUT}", f"write layout = {model.LAYOUT} in room.toml "
                "(see docs/PROTOCOL.md), or create rooms with gitdrop room create")


def _refuse_room_creator(c, room):
    _refuse("lead-only", c, f"{c.author} may not create room {room['name']!r}: rooms are "
            "created by the hub's operator or by the lead of a team the room is for"
            + (f" ({', '.join(room['teams'])})" if room["teams"] else ""),
            "ask the lead of one of its teams or the hub's operator to create it "
            "(gitdrop room create NAME --team TEAM)")


def _registry_leads(c, new, old, teams):
    """Every lead room.toml records anew must be that team's lead in the hub's
    team registry (refs/heads/hub, teams/<team>.toml), and every team a closed room
    takes in must be there: else anyone of that team registered in it, and made
    itself the team's lead there once it made the team."""
    if not new["open"]:
        for team in new["teams"]:
            if team not in old.get("teams", ()) and team not in teams:
                _refuse("lead-only", c, f"team {team!r} is not in the hub's team registry: "
                        "a closed room takes in teams its registry names",
                        f"create the team first (gitdrop team create {team} --lead NAME)")
    for team, lead in new["leads"].items():
        if old.get("leads", {}).get(team) == lead:
            continue
        if team not in teams:
            _refuse("lead-only", c, f"team {team!r} is not in the hub's team registry",
                    f"create the team first (gitdrop team create {team} --lead NAME)")
        if teams[team] != lead:
            _refuse("lead-only", c, f"room.toml names {lead} as lead of team {team}, but "
                    f"the hub's team registry says {teams[team] or 'nobody'}",
                    f"record the registry's lead (gitdrop room join ROOM --team {team} "
                    "re-syncs it)")


def _check_leads(c, room):
    for team, lead in room["leads"].items():
        if not isinstance(lead, str) or not model.is_agent_id(lead) or \
                model.split_agent(lead)[0] != team or team not in room["teams"]:
            _refuse("format", c, f"leads.{team} = {lead!r}: each lead is of its own team "
                    "and the team is in teams", "fix room.toml's [leads] table")


def _check_room_settings(before, c, changes, ctx, op):
    ch = _only(c, changes, "room")
    if ch.new is None:
        _refuse("one-operation", c, "room.toml cannot be deleted", "archive the room instead")
    old, new = _doc(c, ch, "old")[0], _doc(c, ch, "new")[0]
    if old["name"] != new["name"] or old["created"] != new["created"]:
        _refuse("format", c, "a room's name and creation time do not change",
                "keep name and created as they are in room.toml")
    if old["layout"] != new["layout"]:
        _refuse("layout", c, f"room.toml's layout changes from {old['layout']} to "
                f"{new['layout']}: only the hub's room-layout commit changes it",
                "leave layout as it is; a hub moves a room to the current layout when it opens")
    _check_leads(c, new)
    if ctx.registry() is not None:
        _registry_leads(c, new, old, ctx.registry())
    if bool(old["open"]) != bool(new["open"]) and not model.is_hub_identity(c.author):
        # one lead of a closed room opened it: the other teams' leads lost the room
        # (it is then the operator's), and any team could join it
        _refuse("lead-only", c, f"whether room {before.name!r} is open is the hub's "
                f"operator's call, not {c.author}'s: an open room takes any team, and is run "
                "by the operator", "ask the hub's operator (on the hub's machine: the same "
                "gitdrop command with --as hub/admin), or make a new room as you want it")
    # teams are never deleted: one an earlier registry lacks is no unknown team
    known = set().union(*(r for r in ctx.registries_of(c) if r))
    _by_a_registry(ctx, c, lambda teams: _room_change_by(before, c, old, new, teams,
                                                         ctx.now is None, known))
    _check_settings(c, new)


def _room_change_by(before, c, old, new, teams, again: bool, known=()) -> None:
    """Whether `c.author` may change room.toml from `old` to `new`, by the team
    registry `teams` it was made under. A lead the registry replaced runs the room no
    more (a hand-over killed before it reached the room left it recorded); history
    judged `again` also takes the leads recorded then."""
    lead = c.author in room_leads(before, teams) or model.is_hub_identity(c.author) or \
        (again and c.author in room_leads(before))
    if not lead and not _self_join(old, new, c.author) and \
            not _resync(old, new, c.author, teams) and \
            not _own_leave(old, new, c.author, teams,
                           any_heir=again and model.split_agent(c.author)[0] not in known):
        if old["open"]:
            _refuse("lead-only", c, f"room {before.name!r} is open (any team's lead may join "
                    f"it), so its settings, pin and archive are the hub's operator's, not "
                    f"{c.author}'s; a team's lead there adds or takes out its own team only",
                    "ask the hub's operator (on the hub's machine: the same gitdrop room "
                    "command with --as hub/admin), or run your team's work in a closed room "
                    "of its own (gitdrop room create NAME --team TEAM)")
        _refuse("lead-only", c, f"{c.author} is not a lead in room {before.name!r} (a closed "
                "room: its leads add teams)", "ask a lead of the room to change it"
                + (f" ({', '.join(sorted(set(old['leads'].values())))})" if old["leads"] else ""))
    if again:   # at receipt _registry_leads says so, by the registry of now
        for t, lead in new["leads"].items():
            if old["leads"].get(t) != lead and t in known and (teams or {}).get(t) != lead:
                _refuse("lead-only", c, f"room.toml names {lead} as lead of team {t}, but "
                        f"the hub's team registry of then says "
                        f"{(teams or {}).get(t) or 'nobody'}",
                        "a lead is recorded as the team registry names it")
    for t, was in old["leads"].items():
        now = new["leads"].get(t)
        if t in new["teams"] and now and now != was and c.author != was and \
                not model.is_hub_identity(c.author) and (teams or {}).get(t) != now:
            _refuse("lead-only", c, f"only {was} hands over the lead of team {t} in this room",
                    f"ask {was}")
        # A team, or its lead, taken out of the room by another lead: that lead then
        # reviewed the team's work, signed its cross-team tasks alone and destroyed
        # the room without its consent.
        if (t not in new["teams"] or not now) and c.author != was and \
                not model.is_hub_identity(c.author) and (teams or {}).get(t) != c.author:
            _refuse("lead-only", c, f"only team {t}'s lead ({was}) or the hub's operator "
                    f"takes team {t}" + (" out of" if t not in new["teams"] else "'s lead out "
                                         "of") + f" room {before.name!r}", f"ask {was}")


def _check_settings(c, room):
    for k, v in room["settings"].items():
        if k not in model.DEFAULT_SETTINGS or not isinstance(v, int) or isinstance(v, bool) \
                or v < 0:
            _refuse("format", c, f"setting {k}={v!r} is unknown or not a whole number >= 0",
                    "settings: " + ", ".join(model.DEFAULT_SETTINGS))
    s = model.settings(room)
    if s["task_lease"] > s["max_task_lease"]:   # every claim would be refused
        _refuse("format", c, f"task_lease {s['task_lease']} is longer than max_task_lease "
                f"{s['max_task_lease']}: no claim could set its lease", "set task_lease "
                "at most max_task_lease")


def room_leads(view, teams=None) -> list[str]:
    """Who runs a room (its settings, pin, archive, restore), beside the hub's
    operator: the leads of its member teams recorded in room.toml (from the hub's
    team registry), each as the registry `teams` has it now where given. Nobody in
    an open room: any team's lead may join one, so a stranger who made a team and
    joined the lobby archived it, or turned its loop guard off, for everyone; there
    a lead acts for its own team only."""
    return [] if view.room["open"] else sorted(set(leads_now(view.room, teams).values()))


def leads_now(room: dict, teams=None) -> dict:
    """{team: lead} of a room: as recorded, but where the registry `teams` names
    another lead for a team, that one. A hand-over killed before it reached a room
    left the lead it replaced recorded there, and that lead destroyed the room alone."""
    return {t: (teams or {}).get(t) or lead for t, lead in room["leads"].items()}


def _own_leave(old, new, author, teams=None, any_heir=False) -> bool:
    """`author`, the lead recorded for its own team, takes that team out of the room
    (or only its lead entry), or hands its lead entry to the registry's lead of the
    team (after a hand-over there), and changes nothing else. `any_heir`: history
    judged again, where the registry of then may not be known (a room imported from
    another hub): a hand-over to any agent of the team is the lead's own to make."""
    team = model.split_agent(author)[0]
    if old["leads"].get(team) != author:
        return False
    leads = {k: v for k, v in old["leads"].items() if k != team}
    heir = (teams or {}).get(team)
    rest = {k: v for k, v in old.items() if k not in ("teams", "leads")}
    if {k: v for k, v in new.items() if k not in ("teams", "leads")} != rest:
        return False
    if any_heir and not heir:   # the registry of then does not know the team
        heir = new["leads"].get(team, "")
        heir = heir if heir != author and model.split_agent(heir)[0] == team else ""
    if heir and heir != author:   # replaced in the registry: it hands over, nothing more
        return new["teams"] == old["teams"] and new["leads"] == dict(leads, **{team: heir})
    return new["leads"] == leads and \
        new["teams"] in (old["teams"], [t for t in old["teams"] if t != team])


def _own_lead_only(old, new, author, joins: bool) -> bool:
    """room.toml changed only to record `author` as the lead of its own team, and,
    when `joins`, to add that team (not a member before); nothing else."""
    team = model.split_agent(author)[0]
    teams = set(old["teams"]) | {team}

    def rest(d):
        return {k: v for k, v in d.items() if k not in ("teams", "leads")}
    return (team not in old["teams"]) == joins and set(new["teams"]) == teams and \
        len(new["teams"]) == len(teams) and rest(new) == rest(old) and \
        new["leads"] == dict(old["leads"], **{team: author})


def _self_join(old, new, author) -> bool:
    """The lead of a team adds its own team to an open room (and changes nothing else)."""
    return bool(old["open"]) and _own_lead_only(old, new, author, joins=True)


def _resync(old, new, author, teams) -> bool:
    """The registry's lead of one of the room's teams records itself as the team's
    lead there (after a hand-over in the registry), and changes nothing else: else
    the lead it replaced kept its powers in every closed room."""
    team = model.split_agent(author)[0]
    return (teams or {}).get(team) == author and old["leads"].get(team) != author and \
        _own_lead_only(old, new, author, joins=False)


def _check_room_change(before, c, changes, ctx, op):
    """Any change of room.toml: by a lead of the room (registered or recorded in
    room.toml), or a self-join of an open room by the joining team's lead."""
    ch = _only(c, changes, "room")
    if ch.new is None:
        _refuse("one-operation", c, "room.toml cannot be deleted", "archive the room instead")
    new = _doc(c, ch, "new")[0]
    if c.author not in before.room["leads"].values() and \
            not model.is_hub_identity(c.author) and not _self_join(before.room, new, c.author) \
            and not any(_resync(before.room, new, c.author, t) for t in ctx.registries_of(c)):
        # an outsider is told so; a member (registered or not) that is no lead is told
        # that below: "register first" sent it to register, only to be refused again
        _member(before, c)
    _check_room_settings(before, c, changes, ctx, op)


def _check_room_layout(before, c, changes, ctx, op):
    """The move of a room to the current layout (gitdrop.layout): by the hub, every
    agent and task file moved unchanged to its new path, room.toml's layout set to
    the current one, and nothing else."""
    def no(reason):
        _refuse("layout", c, reason, "only a hub moves a room to the current layout "
                "(it does so when it opens); push nothing else with Gitdrop-Op: room-layout")
    if not model.is_hub_identity(c.author):
        no(f"{c.author} may not move a room's files; the hub does (as hub/admin)")
    if before.tree is None or before.layout >= model.LAYOUT:
        no(f"room {before.name!r} is already in layout {before.layout}")
    moved, came, room = {}, {}, None
    for ch in changes:
        if ch.kind == "room":
            room = ch
        elif ch.layout == before.layout and ch.new is None:
            moved[model.placed(ch.kind, ch.key)] = (ch.path, ch.old)
        elif ch.layout == model.LAYOUT and ch.old is None:
            came[ch.path] = ch.new
        else:
            no(f"{ch.path} is changed; a layout move only moves agent and task files")
    if room is None or room.new is None or \
            _doc(c, room, "new")[0] != dict(_doc(c, room, "old")[0], layout=model.LAYOUT):
        no(f"room.toml must change only its layout, to {model.LAYOUT}")
    for path, text in came.items():
        if path not in moved or moved[path][1] != text:
            no(f"{path} is not an unchanged move of a file of the old layout")
    if len(came) != len(moved):
        gone = sorted(p for p in moved if p not in came)
        no(f"{moved[gone[0]][0]} is deleted, not moved to {gone[0]}")
    files = len(before.agent_ids()) + len(before.task_ids())
    if len(moved) != files:
        no(f"{len(moved)} of the room's {files} agent and task files are moved; all must be")


CHECKS = {
    "register": _check_register, "deregister": _check_deregister,
    "status": _check_agent_update, "ping": _check_agent_update, "read": _check_agent_update,
    "send": _check_send, "task-create": _check_task_create,
    "handshake-start": _check_handshake_start, "handshake-ack": _check_handshake_ack,
    "contract-declare": _check_contract, "context-set": _check_context,
    "lease-take": _check_lease_take, "lease-release": _check_lease_release,
    "room-create": _check_room_create, "room-settings": _check_room_change,
    "room-pin": _check_room_change, "room-join": _check_room_change,
    "room-leave": _check_room_change, "room-layout": _check_room_layout,
}
