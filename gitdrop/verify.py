"""Checking a run of commits on a ref: what the hook does on push and what
`gitdrop verify` does over a whole room's history. Reader-agnostic."""

from . import fmt, hubrules, model, rules
from .errors import Refusal
from .view import RoomView

ZERO = "0" * 40


def chain(reader, old: str, new: str, ref: str, most: int | None = None) -> list:
    """Commits from just after `old` up to `new`, oldest first; refuses merges,
    anything that does not extend `old` (linear history), and more than `most`."""
    out, oid, seen = [], new, set()
    while oid and oid != old:
        if oid in seen:   # a git object graph has no cycle: a graft (info/grafts) made one
            raise Refusal("linear-history", f"the history of {ref} comes back to "
                          f"{oid[:12]}: a loop, which git's commits cannot make (a graft, "
                          "info/grafts in the hub?)", "remove the hub's info/grafts file, then "
                          "check again", commit=oid[:12])
        seen.add(oid)
        if most is not None and len(out) >= most:
            raise Refusal("size-limit", f"the push brings more than {most} commits to {ref}; "
                          f"this hub takes at most {most} in one push (each is checked "
                          "while the push waits)", "push in parts, oldest first (git push "
                          "origin <commit>:<ref>, then the next), or bring a whole room with "
                          "gitdrop room export and gitdrop room import; the hub's owner sets "
                          "the limit (git config gitdrop.maxPushCommits N)", commit=new[:12])
        c = reader.commit(oid)
        if len(c.parents) > 1:
            raise Refusal("linear-history", f"{ref} must stay linear; {oid[:12]} is a merge",
                          "rebase onto the tip (git pull --rebase) and push again",
                          commit=fmt.commit_named(oid, c.subject))
        out.append(c)
        oid = c.parent
    if old and old != ZERO and oid != old:
        raise Refusal("linear-history", f"the push rewrites {ref} (not a fast-forward)",
                      "fetch, rebase your commits onto the room's tip, push again",
                      commit=new[:12])
    out.reverse()
    return out


def check_commits(reader, ref: str, old: str, new: str, now=None, pusher: str = "",
                  progress=None, hub: str = model.HUB_REF, most: int | None = None,
                  past_ok: bool = False, latest: int | None = None) -> list:
    """Check every commit between old and new; returns [(oid, op)] or raises Refusal.
    `progress(done, total)`, if given, hears of each room commit checked. `hub` is
    where the team registry is read: the hub branch, or a tip of it. More than
    `most` commits are refused before any is checked. `past_ok`: judged at `now`,
    but a date in the past is not refused for itself; `latest`, with no `now`: no
    commit dated ahead of it (both for an import)."""
    if old == ZERO:
        old = ""
    if ref.startswith(model.ROOM_PREFIX):
        room = ref[len(model.ROOM_PREFIX):]
        if not model.is_name(room):
            raise Refusal("format", f"{ref} is not a room branch: "
                          f"{model.NAME_RE.problem(room)}",
                          f"push rooms to refs/heads/rooms/<room>, a room name of "
                          f"{model.NAME_RE.pattern}", commit=ref)
        if new == ZERO:
            raise Refusal("linear-history", f"room {room!r} cannot be deleted by a push",
                          "archive or destroy it on the hub (gitdrop room archive/destroy)",
                          commit=ref)
        if not old:
            hubrules.check_new_room(reader, room)
        return _check_room(reader, room, chain(reader, old, new, ref, most), now, pusher, progress,
                           hub, past_ok, latest)
    if ref == model.HUB_REF:
        if new == ZERO:
            raise Refusal("linear-history", "the hub branch cannot be deleted",
                      "leave refs/heads/hub in place: it holds the team registry", commit=ref)
        return hubrules.check_chain(reader, chain(reader, old, new, ref, most), pusher)
    raise Refusal("format", f"{ref} is not a gitdrop ref",
                  "push rooms to refs/heads/rooms/<room> (and teams to refs/heads/hub)",
                  commit=ref)


def _text(reader, c, path: str, oid: str | None):
    """A new file's text; an entry that names no file (a submodule's commit, an
    object missing from the push) is refused, not read as a deletion."""
    text = reader.blob_text(oid)
    if oid is not None and text is None and reader.mode(c.tree, path) == rules.FILE_MODE:
        raise Refusal("format", f"{path} names {oid[:12]}, which is not a file in this push",
                      "commit the file itself (git add), not a link to another object",
                      commit=fmt.commit_named(c.oid, c.subject))
    return text


def _diff(reader, c, parent_tree) -> list:
    try:
        return reader.diff(parent_tree, c.tree)
    except Refusal as e:   # a tree nested too deep: say which commit brought it
        e.commit = e.commit or fmt.commit_named(c.oid, c.subject)
        raise


def _check_room(reader, room, commits, now, pusher, progress=None,
                hub=model.HUB_REF, past_ok=False, latest=None) -> list:
    out = []
    fresh = set()

    read = []

    def teams():   # read once for the push: each task move asks (rules._by_leads_now)
        if not read:
            read.append(hubrules.registry(reader, hub) if hub else None)   # "": none
        return read[0]
    teams_at = hubrules.RegistryAt(reader, hub) if hub and now is None else None
    for c in commits:
        parent_tree = reader.commit(c.parent).tree if c.parent else None
        before = RoomView(reader, parent_tree, c.parent, room)
        changes = [rules.Change(p, reader.blob_text(a), _text(reader, c, p, b),
                                reader.mode(c.tree, p) if b else rules.FILE_MODE)
                   for p, a, b in _diff(reader, c, parent_tree)]
        op = rules.check(before, c, changes, rules.Ctx(reader, now, pusher, teams, fresh,
                                                       past_ok, latest, teams_at))
        fresh.add(c.oid)
        if not c.parents:
            if op != "room-create":
                raise Refusal("linear-history", "a room's first commit must create it "
                              "(room.toml, Gitdrop-Op: room-create)",
                              "create rooms with gitdrop room create",
                              commit=fmt.commit_named(c.oid, c.subject))
            name = RoomView(reader, c.tree, c.oid, room).room["name"]
            if name != room:
                raise Refusal("format", f"room.toml names {name!r} but the branch is "
                              f"rooms/{room}", "make them match", commit=c.oid[:12])
        out.append((c.oid, op))
        if progress is not None:
            progress(len(out), len(commits))
    return out
