"""Object access for the pre-receive hook, without pygit2.

Starting Python and importing pygit2 costs ~100 ms per push. Loose objects (what
a small push unpacks into its quarantine, and what gitdrop writes) are read
straight from their files with zlib; anything else (packed objects) through one
`git cat-file --batch` process, started on first need with os.posix_spawn (not
subprocess). Both see the push's quarantined objects because git passes their
location in the environment.
"""

import os
import re
import zlib

from .view import CommitData, diff_trees, keep


class CatFile:
    def __init__(self, git_dir: str | None = None, git: str = "git"):
        self._git, self._git_arg = git, git_dir
        self.pid = 0  # the cat-file process, once started
        self._loose = _object_dirs(git_dir)
        self._commits: dict[str, CommitData] = {}
        self._trees: dict[str, dict] = {}
        self._git_dir = git_dir or os.environ.get("GIT_DIR", ".")
        self._walks = None

    @property
    def git_dir(self) -> str:
        return self._git_dir

    @property
    def walks(self):
        """The hub's memo of walks to read cursors (gitdrop.walkmemo), read on
        first need; the hook adds to it in memory only."""
        if self._walks is None:
            from .walkmemo import WalkMemo, path_for
            self._walks = WalkMemo(path_for(self._git_dir))
            self._walks.path = ""  # never written from the hook
        return self._walks

    @walks.setter
    def walks(self, memo):
        self._walks = memo

    def _start(self):
        rin, self._w = os.pipe()
        self._r, wout = os.pipe()
        git, git_dir = self._git, self._git_arg
        argv = [git] + (["--git-dir", git_dir] if git_dir else []) + ["cat-file", "--batch"]
        path = git if "/" in git else _which(git)
        self.pid = os.posix_spawn(path, argv, os.environ,
                                  file_actions=[(os.POSIX_SPAWN_DUP2, rin, 0),
                                                (os.POSIX_SPAWN_DUP2, wout, 1),
                                                (os.POSIX_SPAWN_CLOSE, self._w),
                                                (os.POSIX_SPAWN_CLOSE, self._r)])
        os.close(rin)
        os.close(wout)
        self._out = os.fdopen(self._r, "rb")

    def close(self):
        if not self.pid:
            return
        try:
            os.close(self._w)
            self._out.close()
            os.waitpid(self.pid, 0)
        except OSError:
            pass

    def _read_loose(self, oid: str) -> tuple[str, bytes] | None:
        if len(oid) != 40 or oid.strip("0123456789abcdef"):
            return None
        for d in self._loose:
            try:
                with open(os.path.join(d, oid[:2], oid[2:]), "rb") as f:
                    raw = zlib.decompress(f.read())
            except (OSError, zlib.error):
                continue
            head, _, data = raw.partition(b"\0")
            kind, _, size = head.partition(b" ")
            if size.isdigit() and int(size) == len(data):
                return kind.decode(), data
        return None

    def raw(self, rev: str) -> tuple[str, bytes] | None:
        got = self._read_loose(rev) if self._loose else None
        if got is not None:
            return got
        if not self.pid:
            self._start()
        os.write(self._w, rev.encode() + b"\n")
        header = self._out.readline().split()
        if len(header) != 3:
            return None
        size = int(header[2])
        data = self._out.read(size)
        self._out.read(1)
        return header[1].decode(), data

    # --- the reader interface of gitdrop.view ----------------------------------
    def commit(self, oid: str) -> CommitData:
        c = self._commits.get(oid)
        if c is not None:
            return c
        kind, data = self.raw(oid) or ("missing", b"")
        if kind != "commit":
            raise KeyError(oid)
        head, _, message = data.partition(b"\n\n")
        fields, problem = _headers(head)
        tree = fields.get(b"tree", [b""])[0].decode("ascii", "replace")
        name, _, rest = fields.get(b"author", [b""])[0].decode(
            "utf-8", "surrogateescape").partition(" <")
        try:
            when = int(fields.get(b"committer", [b"x 0 +0000"])[0].rsplit(b" ", 2)[-2])
        except (ValueError, IndexError):
            when, problem = 0, problem or "has a committer line without a date"
        # surrogateescape: bytes that are not UTF-8 stay visible to the rules,
        # which refuse them (a replacement character would hide them)
        c = CommitData(oid, tree, [p.decode("ascii", "replace") for p in fields.get(b"parent", [])],
                       name, rest.partition(">")[0], when,
                       message.decode("utf-8", "surrogateescape"))
        c.encoding = fields.get(b"encoding", [b""])[0].decode("utf-8", "surrogateescape")
        c.header_problem = problem
        c.committer = fields.get(b"committer", [b""])[0].decode(
            "utf-8", "surrogateescape").partition(" <")[0]
        keep(self, oid, c)
        return c

    def tree(self, oid: str) -> dict:
        t = self._trees.get(oid)
        if t is not None:
            return t
        kind, data = self.raw(oid) or ("missing", b"")
        if kind != "tree":
            raise KeyError(oid)
        # one regex pass: a directory of thousands of entries (a room's 256 buckets, a
        # room of the old flat layout) is read by every `ready`
        t = {name.decode("utf-8", "replace"): (mode.decode(), raw.hex())
             for mode, name, raw in _TREE_ENTRY.findall(data)}
        self._trees[oid] = t
        return t

    def _entry(self, tree: str, path: str):
        parts = path.split("/")
        for n, part in enumerate(parts):
            entry = self.tree(tree).get(part)
            if entry is None:
                return None
            if n < len(parts) - 1:
                if entry[0] != "40000":
                    return None
                tree = entry[1]
        return entry

    def read_path(self, tree: str, path: str) -> bytes | None:
        entry = self._entry(tree, path)
        if entry is None or entry[0] == "40000":
            return None
        got = self.raw(entry[1])
        return got[1] if got and got[0] == "blob" else None

    def mode(self, tree: str, path: str) -> int:
        entry = self._entry(tree, path)
        return int(entry[0], 8) if entry else 0

    def blob_id(self, tree: str, path: str) -> str | None:
        entry = self._entry(tree, path)
        return None if entry is None or entry[0] == "40000" else entry[1]

    def list_dir(self, tree: str, directory: str) -> list[str]:
        if directory:
            entry = self._entry(tree, directory)
            if entry is None or entry[0] != "40000":
                return []
            tree = entry[1]
        return sorted(self.tree(tree))

    def diff(self, old, new) -> list:
        return diff_trees(self._kinds, old, new)

    def _kinds(self, tree: str) -> dict:
        # the mode too: a file turned into a link or a submodule is a change
        return {n: (mode == "40000", oid, mode) for n, (mode, oid) in self.tree(tree).items()}

    def blob_text(self, oid):
        if oid is None:
            return None
        got = self.raw(oid)
        return got[1].decode("utf-8", "surrogateescape") if got and got[0] == "blob" else None


# The headers git writes, in its order: one tree, the parents, one author, one
# committer; then others (encoding, gpgsig, mergetag, ...), each once. git and
# libgit2 read the first of each where they expect it; a reader that took another
# (a second author after the committer) would judge a commit others read otherwise.
_ONCE = (b"tree", b"author", b"committer", b"encoding")


def _headers(head: bytes) -> tuple[dict, str]:
    """A commit's headers {key: [values]} (continuation lines dropped), and what
    breaks git's form ("" if nothing)."""
    fields: dict = {}
    order = []
    for line in head.split(b"\n"):
        if line.startswith(b" "):   # a continued gpgsig or mergetag
            continue
        key, _, val = line.partition(b" ")
        fields.setdefault(key, []).append(val)
        order.append(key)
    problem = ""
    start = [k for k in order if k != b"parent"][:3]
    parents_at = [i for i, k in enumerate(order) if k == b"parent"]
    if start != [b"tree", b"author", b"committer"] or order[0] != b"tree":
        problem = "does not start with one tree, its parents, one author and one committer"
    elif parents_at and parents_at != list(range(1, len(parents_at) + 1)):
        problem = "has a parent line after its author"
    else:
        twice = [k.decode("ascii", "replace") for k in _ONCE if len(fields.get(k, ())) > 1]
        if twice:
            problem = f"has more than one {twice[0]} line"
    return fields, problem


_TREE_ENTRY = re.compile(rb"([0-7]+) ([^\0]*)\0(.{20})", re.S)


def _object_dirs(git_dir: str | None) -> list[str]:
    """Where loose objects live, in git's order: the object directory (in a push,
    the quarantine) and its alternates from the environment. Empty (cat-file for
    everything) when it cannot be told for sure."""
    env = os.environ
    objects = env.get("GIT_OBJECT_DIRECTORY") or (
        os.path.join(git_dir or env.get("GIT_DIR", ""), "objects")
        if git_dir or env.get("GIT_DIR") else "")
    if not objects:
        return []
    alternates = env.get("GIT_ALTERNATE_OBJECT_DIRECTORIES", "")
    if alternates.startswith('"'):
        return []  # quoted (unusual paths): leave it to git
    return [objects] + [a for a in alternates.split(os.pathsep) if a]


def _which(name: str) -> str:
    for d in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep):
        p = os.path.join(d, name)
        if os.access(p, os.X_OK):
            return p
    return "/usr/bin/" + name
