"""The hub as a bare repository, through pygit2: reading, and writing with CAS.

Every write builds a commit on the current tip, has the rules check it, and moves
the ref only if the tip has not moved (compare-and-swap); on a lost race it
rebuilds on the new tip and checks again.
"""

import os

import pygit2

from . import durable, model, wal, walkmemo
from .basestore import EMPTY_TREE, BaseStore, identity  # noqa: F401 (EMPTY_TREE: re-export)
from .errors import NotFound, Refusal
from .view import CommitData, changes_between, diff_trees, keep  # noqa: F401 (re-export)

ZERO = "0" * 40
_FSYNC = None


def set_fsync(on: bool) -> None:
    global _FSYNC
    if _FSYNC is not on:
        pygit2.settings.enable_fsync_gitdir(on)
        _FSYNC = on


class Reader:
    """Object access for the rules and views, over pygit2."""

    keeps_memos = True   # what its walks learn is kept in the hub (gitdrop.keywindow)

    def __init__(self, repo: pygit2.Repository):
        self.repo = repo
        self._commits: dict[str, CommitData] = {}
        self._trees: dict[str, dict] = {}
        self._walks = False

    @property
    def git_dir(self) -> str:
        return self.repo.path

    @property
    def walks(self):
        """Memo of the walks back to read cursors (rules, inbox), kept in the hub
        between processes (gitdrop.walkmemo); loaded when first needed."""
        if self._walks is False:
            self._walks = walkmemo.WalkMemo(walkmemo.path_for(self.repo.path))
        return self._walks

    @walks.setter
    def walks(self, memo):
        self._walks = memo

    def commit(self, oid: str) -> CommitData:
        c = self._commits.get(oid)
        if c is None:
            obj = self.repo[oid]
            if not isinstance(obj, pygit2.Commit):   # as catfile: a tree's id names no commit
                raise KeyError(oid)
            # The bytes as the hook reads them (catfile): pygit2's .message and .name
            # decode by the commit's encoding header, so a commit declaring UTF-7
            # read one way at receipt and another here.
            c = CommitData(oid, str(obj.tree_id), [str(p) for p in obj.parent_ids],
                           obj.author.raw_name.decode("utf-8", "surrogateescape"),
                           obj.author.raw_email.decode("utf-8", "surrogateescape"),
                           obj.commit_time, obj.raw_message.decode("utf-8", "surrogateescape"))
            c.encoding = obj.message_encoding or ""
            c.committer = obj.committer.raw_name.decode("utf-8", "surrogateescape")
            keep(self, oid, c)
        return c

    def tree(self, oid: str) -> dict:
        """A tree's entries {name: (filemode, oid)}, kept for the trees last read: a
        path lookup through pygit2 parses the whole directory again every time, which
        for a directory of thousands of files costs milliseconds per file. Enough are
        kept for one listing of a room's buckets (256) and the directories above."""
        t = self._trees.get(oid)
        if t is None:
            t = {e.name: (e.filemode, str(e.id)) for e in self.repo[oid]}
            if len(self._trees) >= 320:
                self._trees.pop(next(iter(self._trees)))
            self._trees[oid] = t
        return t

    def _entry(self, tree: str, path: str):
        parts = path.split("/")
        for n, part in enumerate(parts):
            try:
                entry = self.tree(tree).get(part)
            except (KeyError, ValueError):
                return None
            if entry is None:
                return None
            if n < len(parts) - 1:
                if entry[0] != pygit2.GIT_FILEMODE_TREE:
                    return None
                tree = entry[1]
        return entry

    def read_path(self, tree: str, path: str) -> bytes | None:
        entry = self._entry(tree, path)
        if entry is None or entry[0] in (pygit2.GIT_FILEMODE_TREE, pygit2.GIT_FILEMODE_COMMIT):
            return None
        return self.repo[entry[1]].data

    def mode(self, tree: str, path: str) -> int:
        entry = self._entry(tree, path)
        return entry[0] if entry else 0

    def blob_id(self, tree: str, path: str) -> str | None:
        entry = self._entry(tree, path)
        return None if entry is None or entry[0] in (
            pygit2.GIT_FILEMODE_TREE, pygit2.GIT_FILEMODE_COMMIT) else entry[1]

    def list_dir(self, tree: str, directory: str) -> list[str]:
        if directory:
            entry = self._entry(tree, directory)
            if entry is None or entry[0] != pygit2.GIT_FILEMODE_TREE:
                return []
            tree = entry[1]
        return sorted(self.tree(tree))

    def diff(self, old_tree: str | None, new_tree: str) -> list[tuple[str, str | None, str | None]]:
        """Changed blob paths between two trees: (path, old oid, new oid)."""
        return diff_trees(self._kinds, old_tree, new_tree)

    def _kinds(self, tree: str) -> dict:
        return {n: (mode == pygit2.GIT_FILEMODE_TREE, oid, mode)
                for n, (mode, oid) in self.tree(tree).items()}

    def blob_text(self, oid: str | None) -> str | None:
        return None if oid is None else self.repo[oid].data.decode("utf-8", "surrogateescape")


class Store(BaseStore):
    """One hub: a bare repository with a room branch per room, through pygit2."""

    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        try:
            self.repo = pygit2.Repository(self.path)
        except pygit2.GitError:
            raise NotFound(f"no gitdrop hub at {self.path}",
                           "create one with gitdrop init (or set GITDROP_HUB)") from None
        self.reader = Reader(self.repo)
        wal.ensure(self.path)   # after a crash: replay the log before reading
        self.method = durable.method_for(self.repo.config, self.path)
        set_fsync(self.method != "none")

    # --- refs ---------------------------------------------------------------
    def tip(self, ref: str) -> str:
        try:
            return str(self.repo.references[ref].target)
        except KeyError:
            return ""
        except pygit2.GitError:   # a damaged file: the error says what and how to mend it
            return durable.read_ref(self.path, ref)

    def rooms(self, prefix: str = model.ROOM_PREFIX) -> list[str]:
        """Every room under `prefix`, damaged ones included (libgit2 skips a ref
        whose file it cannot read; its tip() raises Damaged)."""
        return [n for n in wal.ref_names(self.path, prefix) if model.is_name(n)]

    def resolve(self, rev: str) -> str:
        try:
            return str(self.repo.revparse_single(rev).peel(pygit2.Commit).id)
        except (KeyError, ValueError, pygit2.GitError):
            raise NotFound(f"no commit {rev!r}", "give a commit id from gitdrop log") from None

    # --- what the write loop needs (basestore.BaseStore) -------------------------
    def _writer(self):
        # gitdrop's own writer, but for libgit2's fsync of every file (method fsync)
        return None if self.method == "fsync" else durable.Writer(self.path, self.method)

    def _entries(self, tree: str) -> dict:
        return {e.name: (e.name, e.filemode, str(e.id)) for e in self.repo[tree]}

    def _native_tree(self, base: str | None, groups: dict) -> str:
        tb = self.repo.TreeBuilder(self.repo[base]) if base else self.repo.TreeBuilder()
        for head, sub in groups.items():
            if None in sub:  # a file directly here
                text = sub[None]
                if text is None:
                    if tb.get(head) is not None:
                        tb.remove(head)
                else:
                    tb.insert(head, self.repo.create_blob(text.encode()), pygit2.GIT_FILEMODE_BLOB)
                continue
            existing = tb.get(head)
            sub_base = str(existing.id) if existing is not None and existing.type_str == "tree" else None
            new_sub = self._tree_with(sub_base, sub)
            if len(self.repo[new_sub]) == 0:
                if existing is not None:
                    tb.remove(head)
            else:
                tb.insert(head, new_sub, pygit2.GIT_FILEMODE_TREE)
        return str(tb.write())

    def _native_commit(self, tree, parents, name, email, when, message) -> str:
        sig = pygit2.Signature(name, email, when, 0)
        return str(self.repo.create_commit(None, sig, sig, message, pygit2.Oid(hex=tree),
                                           [pygit2.Oid(hex=p) for p in parents]))

    def _cas(self, ref: str, expected: str, new, why: str, w=None) -> bool:
        if w is not None:  # gitdrop's own lock-file CAS
            return w.move_ref(ref, expected, str(new))
        try:
            if not expected:
                self.repo.references.create(ref, new, force=False)
                return True
            r = self.repo.lookup_reference(ref)
            if str(r.target) != expected:
                return False
            r.set_target(new, f"gitdrop: {why}")
            return True
        except (pygit2.AlreadyExistsError, pygit2.GitError, OSError):
            # Locked, most likely: by a live writer (a lost race), or by a dead one,
            # whose lock is cleared once it is old enough (gitdrop.locks).
            if os.path.exists(os.path.join(self.path, ref + ".lock")):
                wal.clear_lock(self.path, ref)
            return False

    def move_ref(self, old_ref: str, new_ref: str) -> str:
        """Rename a ref (archive/restore); refuses to overwrite."""
        tip = self.tip(old_ref)
        if not tip:
            raise NotFound(f"no ref {old_ref}", "gitdrop room list --all names the rooms")
        if self.tip(new_ref):
            raise Refusal("format", f"{new_ref} already exists", "pick another name")
        self.repo.references.create(new_ref, pygit2.Oid(hex=tip), force=False)
        self.repo.references.delete(old_ref)
        return tip

    def delete_ref(self, ref: str) -> None:
        self.repo.references.delete(ref)


def signature(author: str, when: int) -> pygit2.Signature:
    return pygit2.Signature(*identity(author), when, 0)
