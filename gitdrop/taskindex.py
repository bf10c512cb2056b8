"""The headers of a room's tasks, kept between processes.

`ready`, `task list` and `who` read every task of a room. A command is a fresh
process, and parsing 10,000 task files costs about a second; but a task file's
header depends only on its blob, so the parsed headers are kept by blob id in
`<hub>/gitdrop/tasks/<room>.idx` (one JSON line per blob) and a process parses
only the files that changed since.

It is derived data, like gitdrop.walkmemo: losing the file, a line cut short by a
crash, or a racing writer's lines only mean parsing again. The rules never read
it: what they judge is parsed from the commit itself.
"""

import json
import os

from . import model
from .files import NOFOLLOW, write_whole
from .view import reader_memo

COMPACT_SLACK = 1000   # stale lines tolerated beyond the live ones before a rewrite


def _git_dir(reader) -> str:
    repo = getattr(reader, "repo", None)
    return repo.path if repo is not None else getattr(reader, "_git_dir", "")


def path_for(git_dir: str, room: str, ext: str = ".idx") -> str:
    """The file of `room`'s index; "" for a name that is not a room name (room.toml's
    name is the room's word: it never becomes a path unless it is a plain name)."""
    if not room or model.NAME_RE.problem(room):
        return ""
    return os.path.join(git_dir, "gitdrop", "tasks", room + ext)


def headers(view) -> list[dict]:
    """Every task header of the room at `view`, in file-name order. The dicts are
    shared and may be slim (see Header): index them with [], and pass what leaves
    the core through full()."""
    reader = view.reader
    if view.tree is None or not hasattr(reader, "tree"):
        return [view.task(t)[0] for t in view.task_ids()]
    listing = view.task_blobs()
    if not listing:
        return []
    index = _index(reader, view.name)
    out, new, live = [], {}, set()
    for tid in sorted(listing):
        oid = listing[tid]
        live.add(oid)
        h = index.known.get(oid)
        if h is None or str(h.get("id")) != tid:
            doc = view.task(tid)
            if doc is None:
                continue
            h = doc[0]
            new[oid] = h
        out.append(h)
    if new:
        index.add(new, live)
    return out


POOL_STATES = ("pending", "assigned", "in_progress")


def ready_pool(view) -> tuple[list[dict], dict[str, str]]:
    """What `ready` looks at: the tasks it may offer (pending, assigned, in progress) and the
    states of the tasks they wait on. Kept by the id of the room's tasks/ tree in
    `<hub>/gitdrop/tasks/<room>.ready`: while no task changes, a command answers
    from it without listing or reading the others (most of a worked-in room's
    tasks are done); after a change it is made again from the index."""
    reader = view.reader
    entry = reader._entry(view.tree, "tasks") if view.tree and hasattr(reader, "tree") else None
    if entry is None:
        return _pool(headers(view))
    tree = entry[1]
    mem = reader_memo(reader, "_ready_pools")
    got = mem.get(view.name)
    if got is not None and got[0] == tree:
        return got[1], got[2]
    git_dir = _git_dir(reader)
    path = path_for(git_dir, view.name, ".ready") if git_dir else ""
    loaded = _load_pool(path, tree) if path else None
    if loaded is None:
        loaded = _pool(headers(view))
        if path:
            _save_pool(path, tree, *loaded)
    mem[view.name] = (tree, *loaded)
    return loaded


def _pool(hs) -> tuple[list[dict], dict[str, str]]:
    pool = [h for h in hs if h["state"] in POOL_STATES]
    need = {d for h in pool for d in h["after"]}
    return pool, {str(h["id"]): h["state"] for h in hs if str(h["id"]) in need}


def _load_pool(path: str, tree: str):
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if data.get("tree") != tree:
            return None
        pool = [Header(h) for h in data["pool"] if isinstance(h, dict)]
        states = {str(k): str(v) for k, v in data["states"].items()}
        return pool, states
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _save_pool(path: str, tree: str, pool, states) -> None:
    slim = [{k: v for k, v in h.items() if v != model.TASK_FIELDS.get(k)} for h in pool]
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        write_whole(path, json.dumps({"tree": tree, "pool": slim, "states": states},
                                     separators=(",", ":")).encode(), 0o600)
    except OSError:
        pass   # a cache


class _Index:
    def __init__(self, path: str):
        self.path, self.known, self.lines = path, {}, 0
        if path:
            self._load()

    def _load(self) -> None:
        try:
            with open(self.path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError):
            return
        lines = text.splitlines()
        self.lines = len(lines)
        try:   # one parse in C for the whole file; line by line if any line is bad
            pairs = json.loads("[" + ",".join(lines) + "]")
        except ValueError:
            pairs = []
            for line in lines:
                try:
                    pairs.append(json.loads(line))
                except ValueError:
                    continue   # cut short by a crash, or run into the next line
        for p in pairs:
            if isinstance(p, list) and len(p) == 2 and isinstance(p[1], dict):
                self.known[p[0]] = Header(p[1])

    def add(self, new: dict, live: set) -> None:
        self.known.update(new)
        if not self.path:
            return
        text = "".join(_line(oid, h) for oid, h in new.items())
        try:
            os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
            if self.lines + len(new) > 2 * len(live) + COMPACT_SLACK:
                self._rewrite(live)
                return
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | NOFOLLOW, 0o600)
            try:
                os.write(fd, text.encode())
            finally:
                os.close(fd)
            self.lines += len(new)
        except OSError:
            pass   # a cache: never worth failing a read for

    def _rewrite(self, live: set) -> None:
        """Keep the entries of the room's tasks as they are now."""
        keep = [(oid, h) for oid, h in self.known.items() if oid in live]
        self.known = dict(keep)
        # lines appended meanwhile are lost: a cache
        write_whole(self.path, "".join(_line(oid, h) for oid, h in keep).encode(), 0o600)
        self.lines = len(keep)


class Header(dict):
    """A task header kept slim: a field not stored has its default. Reading it
    costs nothing for 10,000 tasks, where filling in the defaults would cost more
    than the rest of `ready`. Use full() for a complete, independent copy."""

    def __missing__(self, key):
        if key not in model.TASK_FIELDS:
            raise KeyError(key)
        v = model.TASK_FIELDS[key]
        return list(v) if isinstance(v, list) else v


def full(header: dict) -> dict:
    """A complete copy of a header (every field, lists copied)."""
    return model.with_defaults("task", header)


def _line(oid: str, header: dict) -> str:
    """One entry: the fields that differ from their defaults (most do not)."""
    slim = {k: v for k, v in header.items() if v != model.TASK_FIELDS.get(k)}
    return json.dumps([oid, slim], separators=(",", ":")) + "\n"


def _index(reader, room: str) -> _Index:
    got = reader_memo(reader, "_task_index")
    if room not in got:
        git_dir = _git_dir(reader)
        got[room] = _Index(path_for(git_dir, room) if git_dir else "")
    return got[room]
