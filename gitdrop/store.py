"""The hub as a bare repository, through pygit2: reading, and writing with CAS.

Every write builds a commit on the current tip, has the rules check it, and moves
the ref only if the tip has not moved (compare-and-swap); on a lost race it
rebuilds on the new tip and checks again.
"""

import os
import random
import time

import pygit2

from . import durable, model, rules, walkmemo
from .errors import Conflict, GitdropError, NotFound, Refusal
from .view import CommitData, RoomView

ZERO = "0" * 40
EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
_FSYNC = None


def set_fsync(on: bool) -> None:
    global _FSYNC
    if _FSYNC is not on:
        pygit2.settings.enable_fsync_gitdir(on)
        _FSYNC = on


class Reader:
    """Object access for the rules and views, over pygit2."""

    def __init__(self, repo: pygit2.Repository):
        self.repo = repo
        self._commits: dict[str, CommitData] = {}
        self._walks = False

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
            c = CommitData(oid, str(obj.tree_id), [str(p) for p in obj.parent_ids],
                           obj.author.name, obj.author.email, obj.commit_time, obj.message)
            if len(self._commits) > 50000:
                self._commits.clear()
            self._commits[oid] = c
        return c

    def read_path(self, tree: str, path: str) -> bytes | None:
        try:
            entry = self.repo[tree][path]
        except KeyError:
            return None
        if entry.type_str != "blob":
            return None
        return self.repo[entry.id].data

    def blob_id(self, tree: str, path: str) -> str | None:
        try:
            entry = self.repo[tree][path]
        except KeyError:
            return None
        return str(entry.id) if entry.type_str == "blob" else None

    def list_dir(self, tree: str, directory: str) -> list[str]:
        try:
            t = self.repo[tree][directory] if directory else self.repo[tree]
        except KeyError:
            return []
        if t.type_str != "tree":
            return []
        return sorted(e.name for e in self.repo[t.id])

    def diff(self, old_tree: str | None, new_tree: str) -> list[tuple[str, str | None, str | None]]:
        """Changed blob paths between two trees: (path, old oid, new oid)."""
        out: list = []
        self._diff(old_tree, new_tree, "", out)
        return out

    def _diff(self, old, new, prefix, out):
        a = {e.name: e for e in self.repo[old]} if old else {}
        b = {e.name: e for e in self.repo[new]} if new else {}
        for name in sorted(set(a) | set(b)):
            ea, eb = a.get(name), b.get(name)
            if ea is not None and eb is not None and ea.id == eb.id:
                continue
            path = prefix + name
            ta = ea is not None and ea.type_str == "tree"
            tb = eb is not None and eb.type_str == "tree"
            if ta or tb:
                self._diff(str(ea.id) if ta else None, str(eb.id) if tb else None, path + "/", out)
                if ea is not None and not ta:
                    out.append((path, str(ea.id), None))
                if eb is not None and not tb:
                    out.append((path, None, str(eb.id)))
            else:
                out.append((path, str(ea.id) if ea else None, str(eb.id) if eb else None))

    def blob_text(self, oid: str | None) -> str | None:
        return None if oid is None else self.repo[oid].data.decode("utf-8", "replace")


def changes_between(reader, old_tree, new_tree) -> list[rules.Change]:
    return [rules.Change(p, reader.blob_text(a), reader.blob_text(b))
            for p, a, b in reader.diff(old_tree, new_tree)]


class Store:
    """One hub: a bare repository with a room branch per room."""

    # publish(ref, old, new), if set, is called after each local CAS: it hands the
    # commit on (remote.py pushes it to a remote hub). False: it lost a race and
    # refreshed the ref, so rebuild; raising refuses the write (it puts the ref back).
    publish = None

    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        try:
            self.repo = pygit2.Repository(self.path)
        except pygit2.GitError:
            raise NotFound(f"no gitdrop hub at {self.path}",
                           "create one with gitdrop init (or set GITDROP_HUB)") from None
        self.reader = Reader(self.repo)
        cfg = self.repo.config
        fsync = cfg["gitdrop.fsync"] if "gitdrop.fsync" in cfg else "true"
        set_fsync(fsync != "false")
        self.batch = fsync != "false" and _batch_ok(cfg, self.path)

    # --- refs ---------------------------------------------------------------
    def room_ref(self, room: str) -> str:
        return model.ROOM_PREFIX + room

    def tip(self, ref: str) -> str:
        try:
            return str(self.repo.references[ref].target)
        except KeyError:
            return ""

    def room_tip(self, room: str) -> str:
        tip = self.tip(self.room_ref(room))
        if not tip:
            raise NotFound(f"no room {room!r} in this hub",
                           "list rooms with gitdrop room list, or create it (gitdrop room create)")
        return tip

    def rooms(self, prefix: str = model.ROOM_PREFIX) -> list[str]:
        return sorted(r[len(prefix):] for r in self.repo.references if r.startswith(prefix))

    def view(self, room: str, at: str = "") -> RoomView:
        c = self.reader.commit(self.resolve(at) if at else self.room_tip(room))
        return RoomView(self.reader, c.tree, c.oid, room)

    def resolve(self, rev: str) -> str:
        try:
            return str(self.repo.revparse_single(rev).peel(pygit2.Commit).id)
        except (KeyError, ValueError, pygit2.GitError):
            raise NotFound(f"no commit {rev!r}", "give a commit id from gitdrop log") from None

    # --- writing ----------------------------------------------------------------
    def _tree_with(self, base: str | None, changes: dict[str, str | None], w=None) -> str:
        """A new tree: `base` with each path set to its text, or removed when None.
        With a durable.Writer `w`, the objects are written by it (batch durability)."""
        groups: dict[str, dict] = {}
        for path, text in changes.items():
            head, sep, rest = path.partition("/")
            groups.setdefault(head, {})[rest if sep else None] = text
        if w is not None:
            return self._tree_by(w, base, groups)
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

    def _tree_by(self, w, base: str | None, groups: dict) -> str:
        entries = {e.name: (e.name, e.filemode, str(e.id)) for e in self.repo[base]} \
            if base else {}
        for head, sub in groups.items():
            if None in sub:
                text = sub[None]
                if text is None:
                    entries.pop(head, None)
                else:
                    entries[head] = (head, pygit2.GIT_FILEMODE_BLOB, w.blob(text.encode()))
                continue
            existing = entries.get(head)
            sub_base = existing[2] if existing and existing[1] == pygit2.GIT_FILEMODE_TREE else None
            new_sub = self._tree_with(sub_base, sub, w)
            if new_sub == EMPTY_TREE:
                entries.pop(head, None)
            else:
                entries[head] = (head, pygit2.GIT_FILEMODE_TREE, new_sub)
        return w.tree(entries.values())

    def write(self, ref: str, build, author: str, now: int | None = None,
              check: bool = True, tries: int = 20):
        """Append one commit to `ref` with CAS.

        `build(view, tip)` returns (changes {path: text|None}, message, result) or
        raises a Refusal. It is called again on a rebuilt view after a lost race,
        so a check against the state (a claim of a claimed task) sees the winner.
        """
        out = self._write_all(ref, [(build, author)], now, check, tries, raise_first=True)
        return out[0]

    def write_many(self, ref: str, ops, now: int | None = None, check: bool = True,
                   tries: int = 20) -> list:
        """Group commit: `ops` is [(build, author)]. Each operation becomes its own
        commit, built on and checked against the one before it; the ref moves once
        (CAS), so the durable cost is paid once. Returns, per operation, (commit,
        result) or the GitdropError that refused it (a refused operation leaves no
        commit; the others still go in). After a lost race all are rebuilt."""
        return self._write_all(ref, list(ops), now, check, tries, raise_first=False)

    def _write_all(self, ref, ops, now, check, tries, raise_first):
        room = ref.rpartition("/")[2]
        for attempt in range(tries):
            if attempt:  # lost a race: let the winner finish (its lock, its fsync)
                time.sleep(random.uniform(0, min(0.05, 0.0005 * 2 ** attempt)))
            start = tip = self.tip(ref)
            # One commit: its objects are named at the ref, all waited for at once.
            w = durable.Writer(self.path, "batch", defer=len(ops) == 1) if self.batch else None
            try:
                out, why = [], ""
                for build, author in ops:
                    try:
                        oid, result, op = self._one(room, tip, build, author, now, check, w)
                    except GitdropError as e:
                        if raise_first:
                            raise
                        out.append(e)
                        continue
                    if oid != tip:
                        tip, why = oid, why or op
                    out.append((oid, result))
                moved = tip == start or self._cas(ref, start, tip, why or "write", w)
            finally:
                if w is not None:
                    w.close()
            if moved:
                if tip == start or self.publish is None or self.publish(ref, start, tip):
                    if self.reader._walks:
                        self.reader._walks.flush()
                    return out
        raise Conflict(f"{ref} kept moving; gave up after {tries} tries",
                       "try again in a moment")

    def _one(self, room, tip, build, author, now, check, w):
        """Build and check one operation on `tip`; write its objects (not the ref).
        Returns (new commit, or `tip` for an accepted no-op; result; op)."""
        if tip:
            tc = self.reader.commit(tip)
            view = RoomView(self.reader, tc.tree, tip, room)
        else:
            view = RoomView(self.reader, None, "", room)
        changes, message, result = build(view, tip)
        when = int(time.time()) if now is None else now
        proposed = CommitData("", None, [tip] if tip else [], author, "", when, message)
        if changes and all(view.text(p) == t for p, t in changes.items()):
            # Nothing would change (a repeated assign, say): the rules still judge
            # the operation, but an accepted no-op writes no commit.
            if check:
                rules.check(view, proposed, [rules.Change(p, t, t) for p, t in changes.items()],
                            rules.Ctx(self.reader, when))
            return tip, result, ""
        if check:
            chs = [rules.Change(p, view.text(p), t) for p, t in changes.items()
                   if view.text(p) != t]
            op = rules.check(view, proposed, chs, rules.Ctx(self.reader, when))
        else:
            op = ""
        tree = self._tree_with(view.tree, changes, w) if changes else \
            (view.tree or self._tree_with(None, {}, w))
        sig = signature(author, when)
        if w is not None:
            oid = w.commit(tree, [tip] if tip else [], sig.name, sig.email, when, message)
        else:
            oid = str(self.repo.create_commit(None, sig, sig, message, pygit2.Oid(hex=tree),
                                              [pygit2.Oid(hex=tip)] if tip else []))
        return oid, result, op or "write"

    def _cas(self, ref: str, expected: str, new, why: str, w=None) -> bool:
        if w is not None:  # batch durability: gitdrop's own lock-file CAS
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
            return False

    def move_ref(self, old_ref: str, new_ref: str) -> str:
        """Rename a ref (archive/restore); refuses to overwrite."""
        tip = self.tip(old_ref)
        if not tip:
            raise NotFound(f"no ref {old_ref}", "")
        if self.tip(new_ref):
            raise Refusal("format", f"{new_ref} already exists", "pick another name")
        self.repo.references.create(new_ref, pygit2.Oid(hex=tip), force=False)
        self.repo.references.delete(old_ref)
        return tip

    def delete_ref(self, ref: str) -> None:
        self.repo.references.delete(ref)


def _batch_ok(cfg, path: str) -> bool:
    """Batch durability (gitdrop.durable) where it is as durable as fsync per file
    and nothing else is asked of a ref write: gitdrop.fsyncMethod = auto (the
    default: ext4 with a journal), batch (trust the filesystem) or fsync (libgit2's
    fsync of every file). Reflogs, shared permissions and SHA-256 stay with libgit2."""
    def get(key, default=""):
        return str(cfg[key]).lower() if key in cfg else default
    method = get("gitdrop.fsyncmethod", "auto")
    if method == "fsync" or get("core.logallrefupdates") in ("true", "always") or \
            get("core.sharedrepository") not in ("", "false", "umask", "0") or \
            get("extensions.objectformat", "sha1") != "sha1":
        return False
    return method == "batch" or (method == "auto" and durable.supports_batch(path))


def signature(author: str, when: int) -> pygit2.Signature:
    team, name = model.split_agent(author) if "/" in author else ("", author)
    email = f"{name}@{team}.gitdrop" if team else f"{name}@gitdrop"
    return pygit2.Signature(author, email, when, 0)
