"""The offline queue of a remote hub's mirror: writes made while the hub could not
be reached, in the order they were made, waiting for `gitdrop sync`.

One JSON file per write (gitdrop-queue/NNNNNNNN.json, written to a temporary file,
fsynced and renamed, so a killed process leaves the old file or the new one, never
half of one) and a ref refs/gitdrop/queue/NNNNNNNN holding its commit, so that no
clean-up of the mirror drops a commit still waiting. The file is the truth: a ref
without a file (a process killed between the two) is cleared by the next sync.
"""

import json
import os
import re
import sys
import time

from .. import files, model
from ..wal import fsync_path

QUEUE_DIR = "gitdrop-queue"
QUEUE_REFS = "refs/gitdrop/queue/"


class Queue:
    def __init__(self, repo):
        self.repo = repo   # the mirror (pygit2.Repository)
        self.dir = os.path.join(repo.path, QUEUE_DIR)
        # While this process holds the mirror's lock nobody else changes the queue,
        # so it is read once: each write read every file five times over (10,000
        # queued: a second a write). Set by the lock; every change here drops it.
        self.held = False
        self._memo = None

    def entries(self) -> list[dict]:
        """Every queued write, oldest first."""
        memo = self._memo if self.held else None
        if memo is None:
            memo = self._read()
            if self.held:
                self._memo = memo
        return [dict(e) for e in memo]

    def forget(self) -> None:
        self._memo = None

    def _read(self) -> list[dict]:
        try:
            names = sorted(n for n in os.listdir(self.dir) if n.endswith(".json"))
        except FileNotFoundError:
            return []
        out = []
        for n in names:
            path = os.path.join(self.dir, n)
            try:
                entry = _valid(n, json.loads(_read(path)))
            except FileNotFoundError:   # synced or dropped by another process just now
                continue
            except ValueError as e:     # cut, garbage or a lie: set aside, never sent
                try:
                    os.replace(path, path + ".bad")
                except FileNotFoundError:
                    continue
                sys.stderr.write(f"gitdrop: the queued write {path} is not a whole queue "
                                 f"entry ({e}); it was set aside as {path}.bad and will "
                                 "not be sent: read it, and make the write again if it "
                                 "should be\n")
                continue
            out.append(entry)
        return out

    def pending(self) -> list[dict]:
        """Those still in line (not refused at a sync): later writes wait behind them."""
        return [e for e in self.entries() if not e.get("refused")]

    def add(self, ref: str, commit: str, parent: str, author: str, subject: str) -> dict:
        import pygit2
        os.makedirs(self.dir, exist_ok=True)
        # ids only grow, the queue emptied or not: numbered again from 1, a drop of
        # the #1 someone read in status dropped another agent's newer write
        seq = max([e["id"] for e in self.entries()] + [self._last_ref(), self._last()]) + 1
        self._set_last(seq)
        self._memo = None
        entry = {"id": seq, "ref": ref, "commit": commit, "parent": parent, "author": author,
                 "subject": subject, "queued": int(time.time()), "pushing": "", "refused": None}
        # the ref first: a file must never name a commit nothing keeps
        self.repo.references.create(QUEUE_REFS + f"{seq:08d}", pygit2.Oid(hex=commit),
                                    force=True)
        self.save(entry)
        return entry

    def save(self, entry: dict) -> None:
        # through a new file of an unguessable name: a link planted at NNN.json.tmp
        # had the write land on its target
        self._memo = None
        files.write_whole(os.path.join(self.dir, f"{entry['id']:08d}.json"),
                          json.dumps(entry).encode(), 0o600, sync=True)
        _fsync_dir(self.dir)

    def remove(self, entry_id: int) -> None:
        self._memo = None
        try:
            os.unlink(os.path.join(self.dir, f"{entry_id:08d}.json"))
        except FileNotFoundError:
            pass
        _fsync_dir(self.dir)
        self._drop_ref(entry_id)

    def tidy(self) -> None:
        """Clear refs whose file is gone (a process killed between the two)."""
        ids = {e["id"] for e in self.entries()}
        for name in list(self.repo.references):
            if name.startswith(QUEUE_REFS) and name[len(QUEUE_REFS):].isdigit() and \
                    int(name[len(QUEUE_REFS):]) not in ids:
                self._drop_ref(int(name[len(QUEUE_REFS):]))

    def _drop_ref(self, entry_id: int) -> None:
        try:
            self.repo.references.delete(QUEUE_REFS + f"{entry_id:08d}")
        except KeyError:
            pass

    def _last(self) -> int:
        text = (files.read_plain(os.path.join(self.dir, LAST), 32) or b"").strip()
        return int(text) if text.isdigit() else 0

    def _set_last(self, seq: int) -> None:
        try:   # as save(): through a new file, not a predictable .tmp a link may hold
            files.write_whole(os.path.join(self.dir, LAST), f"{seq}\n".encode(), 0o600)
        except OSError:
            pass   # numbered from the entries and refs, as before

    def _last_ref(self) -> int:
        nums = [int(n[len(QUEUE_REFS):]) for n in self.repo.references
                if n.startswith(QUEUE_REFS) and n[len(QUEUE_REFS):].isdigit()]
        return max(nums, default=0)


_OID = re.compile(r"[0-9a-f]{40}")
LAST = "last-id"   # the last id given, in the queue's folder
MOST = 1 << 20     # bytes of a queue file read (a write's entry is a few hundred)


def _valid(name: str, entry) -> dict:
    """A queue file's entry, checked: its id is its file's name (so remove() finds
    it), its ref a room's or the hub branch, its commits ids. ValueError if not."""
    if not isinstance(entry, dict):
        raise ValueError("not a JSON object")
    stem = name[:-len(".json")]
    if not stem.isdigit() or entry.get("id") != int(stem):
        raise ValueError(f"its id {entry.get('id')!r} is not its file's number")
    ref = entry.get("ref")
    if not isinstance(ref, str) or not (ref == model.HUB_REF or (
            ref.startswith(model.ROOM_PREFIX) and model.is_name(ref[len(model.ROOM_PREFIX):]))):
        raise ValueError(f"ref {ref!r} is not a room's or the hub's")
    if not isinstance(entry.get("commit"), str) or not _OID.fullmatch(entry["commit"]) or \
            not isinstance(entry.get("parent"), str) or \
            not (entry["parent"] == "" or _OID.fullmatch(entry["parent"])):
        raise ValueError("commit or parent is not a commit id")
    pushing = entry.get("pushing", "")
    if not isinstance(pushing, str) or not (pushing == "" or _OID.fullmatch(pushing)):
        raise ValueError("pushing is not a commit id")
    refused = entry.get("refused")
    if refused is not None and not (isinstance(refused, dict) and all(
            isinstance(refused.get(k), str) for k in ("rule", "reason", "fix"))):
        raise ValueError("refused is not a rule's refusal")
    if not all(isinstance(entry.get(k), str) for k in ("author", "subject")) or \
            type(entry.get("queued")) is not int:
        raise ValueError("author, subject or queued is not what a write records")
    return entry


def _read(path: str) -> bytes:
    """A queue file's bytes: a plain file, a link not followed, a FIFO not waited on."""
    data = files.read_plain(path, MOST)
    if data is None:
        if not os.path.lexists(path):
            raise FileNotFoundError(path)
        raise ValueError("not a plain file")
    if len(data) >= MOST:
        raise ValueError(f"larger than {MOST} bytes")
    return data


def _fsync_dir(path: str) -> None:
    if os.path.isdir(path):
        fsync_path(path)
