"""What durability costs per operation, by write method, on each filesystem given.

    python bench/bench_durability.py
    python bench/bench_durability.py --dirs /tmp,/mnt/journaled-ext4

A "send" writes one commit object that reuses its parent's tree and moves the
ref; a "move" writes a task file (blob, tasks/ tree, root tree, commit) and
moves the ref. Methods, taking turns op by op:
  libgit2 fsync   pygit2 with enable_fsync_gitdir(True): fsync of every object
                  file and its directory, of the ref's lock file and directory
  wal             gitdrop.durable with the hub's write-ahead log: one fdatasync
                  of the log per write, files written without fsync (the default)
  fsync           gitdrop.durable, fsync per file and directory (as libgit2)
  libgit2 off /   no fsync at all (gitdrop.fsync = false)
  none
SQLite (WAL) synchronous=FULL insert on the same filesystem is the yardstick.
"""

import argparse
import os
import random
import shutil
import sqlite3
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import Timer, ms, ratio  # noqa: E402

import pygit2  # noqa: E402

from gitdrop import durable  # noqa: E402

REF = "refs/heads/rooms/bench"
METHODS = ("libgit2 fsync", "wal", "fsync", "libgit2 off", "none")


class Repo:
    def __init__(self, path: str, method: str):
        self.path, self.method = path, method
        self.repo = pygit2.init_repository(path, bare=True)
        self.sig = pygit2.Signature("bench/alice", "alice@bench.gitdrop", 1700000000, 0)
        pygit2.settings.enable_fsync_gitdir(False)
        blob = self.repo.create_blob(b"+++\nid = \"0\"\n+++\n")
        tasks = self.repo.TreeBuilder()
        for i in range(8):
            tasks.insert(f"{i}.md", blob, pygit2.GIT_FILEMODE_BLOB)
        root = self.repo.TreeBuilder()
        root.insert("tasks", tasks.write(), pygit2.GIT_FILEMODE_TREE)
        root.insert("room.toml", blob, pygit2.GIT_FILEMODE_BLOB)
        self.tree = str(root.write())
        self.tip = str(self.repo.create_commit(REF, self.sig, self.sig, "root\n",
                                               pygit2.Oid(hex=self.tree), []))
        self.n = 0

    def op(self, kind: str) -> None:
        self.n += 1
        msg = f"{kind} {self.n}\n\nGitdrop-Op: {kind}\n"
        if self.method.startswith("libgit2"):
            pygit2.settings.enable_fsync_gitdir(self.method == "libgit2 fsync")
            repo = self.repo
            tree = pygit2.Oid(hex=self.tree)
            if kind == "move":
                base = repo[tree]
                tb = repo.TreeBuilder(repo[base["tasks"].id])
                tb.insert(f"{self.n % 8}.md", repo.create_blob(f"+++\nn = {self.n}\n+++\n".encode()),
                          pygit2.GIT_FILEMODE_BLOB)
                root = repo.TreeBuilder(base)
                root.insert("tasks", tb.write(), pygit2.GIT_FILEMODE_TREE)
                tree = root.write()
            oid = repo.create_commit(None, self.sig, self.sig, msg, tree, [pygit2.Oid(hex=self.tip)])
            repo.lookup_reference(REF).set_target(oid, "bench")
            self.tip = str(oid)
            return
        w = durable.Writer(self.path, self.method)
        tree = self.tree
        if kind == "move":
            base = self.repo[self.tree]
            tasks = {e.name: (e.name, e.filemode, str(e.id)) for e in self.repo[base["tasks"].id]}
            name = f"{self.n % 8}.md"
            tasks[name] = (name, 0o100644, w.blob(f"+++\nn = {self.n}\n+++\n".encode()))
            entries = {e.name: (e.name, e.filemode, str(e.id)) for e in base}
            entries["tasks"] = ("tasks", 0o040000, w.tree(tasks.values()))
            tree = w.tree(entries.values())
        oid = w.commit(tree, [self.tip], "bench/alice", "alice@bench.gitdrop", 1700000000, msg)
        if not w.move_ref(REF, self.tip, oid):
            raise RuntimeError("lost the ref")
        self.tip = oid
        if kind == "move":
            self.tree = tree


def sqlite_insert(db) -> None:
    db.execute("BEGIN")
    db.execute("INSERT INTO m (body) VALUES (?)", ("hello bob",))
    db.execute("COMMIT")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dirs", default="", help="comma-separated directories to test in "
                    "(default: the system temp dir)")
    ap.add_argument("-n", type=int, default=200, help="operations per method and kind")
    a = ap.parse_args(argv)
    dirs = [d for d in a.dirs.split(",") if d] or [common.workdir("durability-")]
    common.header("gitdrop durability: cost per operation by write method", dirs[0])
    for base in dirs:
        work = tempfile.mkdtemp(prefix="gitdrop-bench-dur-", dir=base)
        try:
            print(f"\n## {base}: {common.fs_type(work)}")
            repos = {m: Repo(os.path.join(work, m.replace(' ', '-')), m) for m in METHODS}
            db = sqlite3.connect(os.path.join(work, "s.db"), isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute("CREATE TABLE m (id INTEGER PRIMARY KEY, body TEXT)")
            t = Timer()
            jobs = [(m, k) for m in METHODS for k in ("send", "move")] + [("sqlite", "insert")]
            for _ in range(a.n):
                random.shuffle(jobs)
                for m, k in jobs:
                    if m == "sqlite":
                        t.time((m, k), sqlite_insert, db)
                    else:
                        t.time((m, k), repos[m].op, k)
            sq = t.med(("sqlite", "insert"))
            print(f"  {'method':14} {'op':5} {'median':>9} {'p99':>9} {'vs libgit2':>11} "
                  f"{'vs sqlite':>10}   (ms)")
            for k in ("send", "move"):
                ref = t.med(("libgit2 fsync", k))
                for m in METHODS:
                    x = t.med((m, k))
                    print(f"  {m:14} {k:5} {ms(x):>9} {ms(t.p99((m, k))):>9} "
                          f"{ratio(x, ref):>11} {ratio(x, sq):>10}")
            print(f"  {'sqlite FULL':14} {'ins':5} {ms(sq):>9} {ms(t.p99(('sqlite', 'insert'))):>9}")
            for m, r in repos.items():
                fsck = os.system(f"git --git-dir {r.path} fsck --strict --no-dangling {REF} >/dev/null 2>&1")
                if fsck:
                    print(f"  FSCK FAILED for {m}")
        finally:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\ncommand: {common.command()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
