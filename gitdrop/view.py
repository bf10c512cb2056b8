"""Reading a room as of one commit, over any object reader.

A reader gives `commit(oid)`, `read_path(tree, path)`, `list_dir(tree, dir)` and
`diff(old_tree, new_tree)`. The core reads through pygit2; the pre-receive hook
through one `git cat-file --batch` process (it must stay light).
"""

import copy

from . import fmt, model
from .errors import Damaged, Refusal


# What a reader keeps of the commits it read: a count alone let a long-lived process
# (a server, a worker, the web board) keep 50,000 messages of up to 16 KB each, over
# 1 GB, growing with every commit it saw.
KEEP_COMMITS, KEEP_BYTES = 50000, 32 << 20


def keep(reader, oid: str, c: "CommitData") -> None:
    """Remember commit `c` in `reader._commits`, forgetting them all once they hold
    KEEP_COMMITS or about KEEP_BYTES of messages (a reader's cache of parsed commits)."""
    kept = getattr(reader, "_kept_bytes", 0) + 200 + len(c.message or "")
    if len(reader._commits) >= KEEP_COMMITS or kept > KEEP_BYTES:
        reader._commits.clear()
        kept = 200 + len(c.message or "")
    reader._kept_bytes = kept
    reader._commits[oid] = c


class CommitData:
    __slots__ = ("oid", "tree", "parents", "author", "email", "time", "message",
                 "_parsed", "_op", "rcpt", "brief", "encoding", "header_problem", "committer")

    def __init__(self, oid, tree, parents, author, email, time, message):
        self.oid, self.tree, self.parents = oid, tree, parents
        self.author, self.email, self.time, self.message = author, email, time, message
        # Kept by rules once worked out: every walk back to a read cursor asks again.
        self._parsed = self._op = self.rcpt = self.brief = None
        self.encoding = ""   # its `encoding` header, if it has one (rules.check refuses it)
        self.header_problem = ""   # what breaks git's form of the headers (rules.bad_commit)
        self.committer = author   # its committer's name, where read from git

    @property
    def parsed(self):
        if self._parsed is None:
            self._parsed = fmt.parse_message(self.message)
        return self._parsed

    @property
    def subject(self):
        return self.parsed[0]

    @property
    def body(self):
        return self.parsed[1]

    @property
    def trailers(self):
        return self.parsed[2]

    @property
    def op(self) -> str:
        if self._op is None:   # asked for every commit of every walk back
            self._op = fmt.trailer(self.trailers, "op")
        return self._op

    @property
    def parent(self) -> str:
        return self.parents[0] if self.parents else ""


def reader_memo(reader, attr: str) -> dict:
    """A dict kept on `reader` under `attr` (made on first use), for what a process
    works out from commits and trees, which never change; a reader that takes no
    attribute gets a new one each time (nothing is kept)."""
    got = getattr(reader, attr, None)
    if got is None:
        got = {}
        try:
            setattr(reader, attr, got)
        except AttributeError:
            pass
    return got


def first_parent_walk(reader, oid: str):
    """Commits from `oid` back along first parents (cheap; never a full sort)."""
    while oid:
        c = reader.commit(oid)
        yield c
        oid = c.parent


class RoomView:
    """A room's files at one tree, parsed on demand and cached."""

    def __init__(self, reader, tree: str | None, commit: str = "", room_name: str = ""):
        self.reader = reader
        self.tree = tree
        self.commit = commit
        self._cache: dict = {}
        self._room_name = room_name

    # raw files
    def text(self, path: str) -> str | None:
        if self.tree is None:
            return None
        key = ("t", path)
        if key not in self._cache:
            data = self.reader.read_path(self.tree, path)
            self._cache[key] = None if data is None else data.decode("utf-8", "replace")
        return self._cache[key]

    def names(self, directory: str) -> list[str]:
        if self.tree is None:
            return []
        key = ("d", directory)
        if key not in self._cache:
            self._cache[key] = self.reader.list_dir(self.tree, directory)
        return self._cache[key]

    # parsed documents
    def _doc(self, kind: str, path: str):
        key = ("p", path)
        if key not in self._cache:
            # A file's parse depends only on its blob: each version is parsed once
            # per process (callers get their own copy to change as they like).
            bid = self.reader.blob_id(self.tree, path) \
                if self.tree is not None and hasattr(self.reader, "blob_id") else None
            hit = _PARSED.get((kind, bid)) if bid else None
            if hit is not None:
                self._cache[key] = _copy(hit)
            else:
                text = self.text(path)
                try:
                    doc = None if text is None else parse_file(kind, text)
                except fmt.FormatError as e:   # the rules refuse such a file: a hub given
                    raise self._damaged(path, str(e)) from None   # as a URL may lack the hook
                if bid and doc is not None:
                    if len(_PARSED) > 20000:
                        _PARSED.clear()
                    _PARSED[(kind, bid)] = _copy(doc)
                self._cache[key] = doc
        return self._cache[key]

    def _damaged(self, path: str, problem: str) -> Damaged:
        return Damaged(f"{path} in room {self._room_name!r} is not as the protocol has it: "
                       f"{fmt.shown(problem)}", "ask the hub's owner to run gitdrop verify "
                       "there (a hub given as a URL may not run gitdrop's hook)")

    def check(self, path: str) -> None:
        """Damaged if the file at `path` is a document the protocol refuses (a file
        of a kind that is no document, or none at all, passes)."""
        kind = model.parse_path(path)[0]
        if kind in model.FIELDS:
            self._doc(kind, path)

    def with_leads(self, leads: dict) -> "RoomView":
        """This view with room.toml's leads read as `leads` (what the rules judge a
        task by after a hand-over the room has not caught up with); the rest shared."""
        got = copy.copy(self)
        got._cache = dict(self._cache)
        doc = self._doc("room", model.ROOM_FILE)
        got._cache[("p", model.ROOM_FILE)] = (dict(self.room, leads=leads),
                                              doc[1] if doc else "")
        return got

    @property
    def room(self) -> dict:
        doc = self._doc("room", model.ROOM_FILE)
        return doc[0] if doc else model.with_defaults("room", {"name": self._room_name})

    @property
    def name(self) -> str:
        return self.room.get("name") or self._room_name

    @property
    def settings(self) -> dict:
        got = self._cache.get("settings")
        if got is None:   # asked several times by every check: read, never changed
            got = model.settings(self.room)
            for k, v in got.items():   # the rules take no other (a hub may lack the hook)
                if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                    raise self._damaged(model.ROOM_FILE, f"setting {k} = {v!r} is not a "
                                        "whole number >= 0")
            self._cache["settings"] = got
        return got

    @property
    def layout(self) -> int:
        """The room's tree layout (model.LAYOUT for a room not yet created)."""
        return self.room.get("layout", 1) if self.tree is not None else model.LAYOUT

    def agent_path(self, agent_id: str) -> str:
        return model.agent_path(agent_id, self.layout)

    def task_path(self, task_id) -> str:
        return model.task_path(task_id, self.layout)

    def agent(self, agent_id: str) -> dict | None:
        key = ("a", agent_id)
        if key in self._cache:   # a check asks for the sender and recipients more than once
            return self._cache[key]
        team, name = model.split_agent(str(agent_id))
        if not (model.is_name(team) and model.is_name(name)):   # no file has that name
            return None
        doc = self._doc("agent", self.agent_path(agent_id))
        got = self._cache[key] = doc[0] if doc else None
        return got

    def teams_here(self) -> list[str]:
        """The teams with a directory of agents in the room."""
        return self.names("agents")

    def agent_ids(self, team: str = "") -> list[str]:
        """Every registered agent's id (of one team, if given), sorted, without
        reading their files."""
        out = []
        for t in [team] if team else self.teams_here():
            for n in self._files(f"agents/{t}", ".toml"):
                out.append(f"{t}/{n}")
        return out

    def agents(self, ids=None) -> list[dict]:
        out = []
        for agent_id in self.agent_ids() if ids is None else ids:
            a = self.agent(agent_id)
            if a:
                out.append(a)
        return out

    def task(self, task_id) -> tuple[dict, str] | None:
        task_id = str(task_id)
        if not model.KEY_RE.match(task_id):   # no file can have that name (model.kind_of)
            return None
        return self._doc("task", self.task_path(task_id))

    def task_ids(self) -> list[str]:
        return self._files("tasks", ".md")

    def task_blobs(self) -> dict[str, str]:
        """{task id: blob id} of every task file, from the directory listings alone
        (a reader with tree() and _entry())."""
        out = {}
        for listing in self._dirs("tasks"):
            for n, (_mode, oid) in listing.items():
                if n.endswith(".md"):
                    out[n[:-3]] = oid
        return out

    def _files(self, directory: str, ext: str) -> list[str]:
        """The names (without `ext`) of the files of an agents/<team> or tasks
        directory, whatever the layout: flat, or one level of buckets."""
        if self.layout == 1:
            return sorted(n[:-len(ext)] for n in self.names(directory) if n.endswith(ext))
        out = []
        for b in self.names(directory):
            out.extend(n[:-len(ext)] for n in self.names(f"{directory}/{b}") if n.endswith(ext))
        return sorted(out)

    def _dirs(self, directory: str) -> list[dict]:
        """The listing {name: (mode, oid)} of each directory holding the files of
        `directory`: itself (layout 1) or each of its buckets."""
        entry = self.reader._entry(self.tree, directory) if self.tree is not None else None
        if entry is None:
            return []
        if self.layout == 1:
            return [self.reader.tree(entry[1])]
        return [self.reader.tree(sub) for _n, (is_tree, sub, _mode) in
                sorted(self.reader._kinds(entry[1]).items()) if is_tree]

    def handshake(self, hid) -> tuple[dict, str] | None:
        return self._doc("handshake", model.handshake_path(hid))

    def handshake_ids(self) -> list[int]:
        return sorted(int(n[:-3]) for n in self.names("handshakes")
                      if n.endswith(".md") and n[:-3].isdigit())

    def contract(self, name) -> tuple[dict, str] | None:
        return self._doc("contract", model.contract_path(name))

    def contract_names(self) -> list[str]:
        return [n[:-3] for n in self.names("contracts") if n.endswith(".md")]

    def context(self, key) -> str | None:
        return self.text(model.context_path(key))

    def context_keys(self) -> list[str]:
        return [n[:-3] for n in self.names("context") if n.endswith(".md")]

    def lease(self, lid) -> dict | None:
        doc = self._doc("lease", model.lease_path(lid))
        return doc[0] if doc else None

    def leases(self) -> list[dict]:
        out = []
        for n in self.names("leases"):
            if n.endswith(".toml") and model.KEY_RE.match(n[:-5]):
                lease = self.lease(n[:-5])
                if lease:
                    out.append(lease)
        return out

    def is_lead(self, agent_id: str) -> bool:
        return model.is_lead(self.agent(agent_id), self.room)

    def leads_for(self, agent_id: str, *of: str) -> bool:
        """Whether `agent_id` is a lead acting for what belongs to `of` (model.leads_for)."""
        return model.leads_for(self.agent(agent_id), self.room, *of)

    def leads(self) -> list[str]:
        """The room's recorded leads that are registered here."""
        return sorted(x for x in set(self.room["leads"].values()) if self.agent(x))


_PARSED: dict = {}  # (kind, blob id) -> (header, body)


def _copy(doc):
    header, body = doc
    return ({k: list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v
             for k, v in header.items()}, body)


def parse_file(kind: str, text: str) -> tuple[dict, str]:
    """Parse one file of a room's tree into (header with defaults, body)."""
    if kind in ("agent", "room", "lease"):
        header, body = fmt.loads_toml(text), ""
    else:
        header, body = fmt.loads_doc(text)
    problem = model.check_fields(kind, header)
    if problem:
        raise fmt.FormatError(problem)
    return model.with_defaults(kind, header), body


def render_file(kind: str, header: dict, body: str = "") -> str:
    if kind in ("agent", "room", "lease"):
        return fmt.dumps_toml(header)
    return fmt.dumps_doc(header, body)


class Change:
    """One changed file of a commit, as the rules take it."""
    __slots__ = ("path", "old", "new", "kind", "key", "mode", "layout")

    def __init__(self, path, old, new, mode=0o100644):
        self.path, self.old, self.new = path, old, new
        self.mode = mode   # of the new file (a push may bring a link or an executable)
        self.kind, self.key, self.layout = model.parse_path(path)


def changes_between(reader, old_tree, new_tree) -> list:
    """The changed files between two trees, as the rules take them."""
    return [Change(p, reader.blob_text(a), reader.blob_text(b))
            for p, a, b in reader.diff(old_tree, new_tree)]


def diff_trees(entries, old: str | None, new: str | None, prefix: str = "", out=None,
               depth: int = 0) -> list:
    """Changed blob paths between two trees, as (path, old oid, new oid); `entries(tree)`
    gives {name: (is_tree, oid, mode)}: a path whose mode alone changed is listed (with
    the same oid twice). Subtrees with equal ids are not opened; a changed one nested
    deeper than model.MAX_TREE_DEPTH is refused (rule format)."""
    out = [] if out is None else out
    if depth > model.MAX_TREE_DEPTH:
        shown = prefix if len(prefix) <= 120 else prefix[:120] + "..."
        raise Refusal("format", f"{shown} nests directories deeper than "
                      f"{model.MAX_TREE_DEPTH}; no path gitdrop knows does",
                      "keep to the paths docs/PROTOCOL.md describes")
    a = entries(old) if old else {}
    b = entries(new) if new else {}
    for name in sorted(set(a) | set(b)):
        ea, eb = a.get(name), b.get(name)
        if ea == eb:
            continue
        path = prefix + name
        ta, tb = bool(ea and ea[0]), bool(eb and eb[0])
        if ta or tb:
            diff_trees(entries, ea[1] if ta else None, eb[1] if tb else None, path + "/", out,
                       depth + 1)
            if ea is not None and not ta:
                out.append((path, ea[1], None))
            if eb is not None and not tb:
                out.append((path, None, eb[1]))
        else:
            out.append((path, ea[1] if ea else None, eb[1] if eb else None))
    return out
