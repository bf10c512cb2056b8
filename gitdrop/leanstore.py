"""A hub on this machine without pygit2: objects read through catfile.CatFile
(loose files directly, packed ones through `git cat-file --batch`) and written by
durable.Writer, refs moved with git's own lock-file compare-and-swap.

Importing pygit2 costs more than a whole short command (measured: ~80 ms, ~150 ms on
a slow machine), so the command line runs a room's verbs on this store. The write
loop, the rules and the durability are the same as through store.Store: the two
exclude each other through the same ref locks and write the same bytes.
"""

import os

from . import durable, model, wal, walkmemo
from .basestore import BaseStore
from .catfile import CatFile
from .errors import NotFound
from .wal import is_hub, read_config  # noqa: F401 (is_hub: imported from here)


class LeanStore(BaseStore):
    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        if not is_hub(self.path):
            raise NotFound(f"no gitdrop hub at {self.path}",
                           "create one with gitdrop init (or set GITDROP_HUB)")
        self.reader = CatFile(git_dir=self.path)
        self.reader.walks = walkmemo.WalkMemo(walkmemo.path_for(self.path))
        wal.ensure(self.path)   # after a crash: replay the log before reading
        self.method = durable.method_for(read_config(self.path), self.path)

    def tip(self, ref: str) -> str:
        return durable.read_ref(self.path, ref)

    def rooms(self, prefix: str = model.ROOM_PREFIX) -> list[str]:
        names = set()
        top = os.path.join(self.path, prefix)
        for d, _dirs, files in os.walk(top):
            for f in files:
                if not f.endswith(".lock"):
                    names.add(os.path.relpath(os.path.join(d, f), top))
        try:
            with open(os.path.join(self.path, "packed-refs")) as f:
                for line in f:
                    ref = line.rstrip("\n").partition(" ")[2]
                    if ref.startswith(prefix) and not line.startswith(("#", "^")):
                        names.add(ref[len(prefix):])
        except FileNotFoundError:
            pass
        return sorted(n for n in names if self.tip(prefix + n))

    def resolve(self, rev: str) -> str:
        if len(rev) == 40:
            got = self.reader.raw(rev)
            if got is not None and got[0] == "commit":
                return rev
        import subprocess  # rare: a revision that is not a full commit id
        p = subprocess.run(["git", "--git-dir", self.path, "rev-parse", "--verify", "-q",
                            rev + "^{commit}"], capture_output=True, text=True)
        if p.returncode or not rev:
            raise NotFound(f"no commit {rev!r}", "give a commit id from gitdrop log")
        return p.stdout.strip()

    # --- what the write loop needs --------------------------------------------
    def _writer(self):
        return durable.Writer(self.path, self.method)

    def _entries(self, tree: str) -> dict:
        return {name: (name, int(mode, 8), oid) for name, (mode, oid) in
                self.reader.tree(tree).items()}

    def _cas(self, ref: str, expected: str, new, why: str, w=None) -> bool:
        return w.move_ref(ref, expected, str(new))
