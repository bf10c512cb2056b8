"""Moving a room to the current tree layout (model.LAYOUT) when it is first used.

A room made in an older layout keeps working through the readers (a view knows
its room's layout), but every write is made in the current one: so the hub moves
each such room with one commit by hub/admin (Gitdrop-Op: room-layout) that moves
every agent and task file, unchanged, to its new path and records the layout in
room.toml. The rules accept exactly such a commit. The write is a compare-and-swap
like any other: of two processes using the room at once one moves it and
the other, rebuilding on the moved tip, finds nothing left to do.
"""

from . import fmt, model
from .errors import GitdropError, Refusal
from .view import RoomView, render_file

MOVER = "hub/admin"
OP = "room-layout"


class _Moved(GitdropError):
    """The room is in the current layout already (another process moved it)."""


def is_old(store, room: str) -> bool:
    try:
        tip = store.tip(model.ROOM_PREFIX + room)
        return bool(tip) and store.view(room).layout < model.LAYOUT
    except Exception:   # a damaged ref, a missing commit: not moved, left for repair
        return False     # (gitdrop repair names it and what to put back)


def move_room(store, room: str, now: int | None = None) -> str:
    """Move `room` to the current layout: the new commit, or "" when it was in it."""
    def build(view, tip):
        if view.tree is None or view.layout >= model.LAYOUT:
            raise _Moved("moved already")
        changes = {model.ROOM_FILE: render_file("room", dict(view.room, layout=model.LAYOUT))}
        paths = [(view.agent_path(a), model.agent_path(a)) for a in view.agent_ids()] + \
                [(view.task_path(t), model.task_path(t)) for t in view.task_ids()]
        for old, new in paths:
            changes[old] = None
            changes[new] = view.text(old)
        msg = fmt.format_message(
            f"room {view.name} moved to layout {model.LAYOUT} ({len(paths)} files)",
            "Each agent and task file moved unchanged to its bucket directory "
            "(see docs/PROTOCOL.md).", [("op", OP)])
        return changes, msg, {}
    try:
        oid, _ = store.write(store.room_ref(room), build, MOVER, now=now)
    except _Moved:
        return ""
    return oid


def upgrade(store, rooms=None, now: int | None = None) -> dict[str, str]:
    """Move every room of the hub (or those named) still in an older layout;
    {room: commit} of the moves made here."""
    out = {}
    for room in store.rooms() if rooms is None else rooms:
        if model.is_name(room) and is_old(store, room):
            oid = move_room(store, room, now)
            if oid:
                out[room] = oid
    if out:
        # A hook an older install left in place (gitdrop installed anew elsewhere) cannot
        # read the layout just written: it refused every push to the room.
        from .hookfiles import refresh_hooks
        refresh_hooks(store.path, also_other=True)
    return out


def old_rooms(reader, updates) -> list[str]:
    """The rooms a push [(old, new, ref)] updates whose tip is in an older layout,
    but for a push that brings the move itself (its first commit is a room-layout
    one: the rules judge it like any other)."""
    out = []
    for old, new, ref in updates:
        room = ref[len(model.ROOM_PREFIX):]
        if ref.startswith(model.ROOM_PREFIX) and model.is_name(room) and old.strip("0") and \
                RoomView(reader, reader.commit(old).tree, old, room).layout < model.LAYOUT \
                and not _first_is_move(reader, old, new):
            out.append(room)
    return out


def _first_is_move(reader, old: str, new: str, limit: int = 10000) -> bool:
    oid = new
    for _ in range(limit):
        if not oid.strip("0"):
            return False
        c = reader.commit(oid)
        if c.parent == old:
            return c.op == OP
        oid = c.parent
    return False


def upgrade_on_push(store, rooms) -> None:
    """For the pre-receive hook: a push to a room in an older layout moves the room
    first, and is then refused (it no longer extends the room's tip)."""
    moved = upgrade(store, rooms)
    if moved:
        room, oid = next(iter(moved.items()))
        raise Refusal("layout", f"room {room!r} was in an older layout; the hub has just "
                      f"moved its agent and task files to layout {model.LAYOUT} (commit "
                      f"{oid[:12]}), so this push no longer extends the room's tip",
                      "fetch the room (git pull --rebase), put any agents/ or tasks/ file "
                      "you add at its new path (docs/PROTOCOL.md: agents/<team>/<xx>/<name>"
                      ".toml, tasks/<xx>/<id>.md) and push again")
