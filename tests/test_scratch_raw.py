import subprocess, time, os
from conftest import git, refused_rule

def push_tree(c, tree, msg=b"x\n"):
    c.pull()
    head = c.head()
    who = f"core/juno <j@example.org> {int(time.time())} +0000".encode()
    raw = b"tree %s\nparent %s\nauthor %s\ncommitter %s\n\n" % (tree.encode(), head.encode(), who, who) + msg
    oid = subprocess.run(["git", "hash-object", "-t", "commit", "-w", "--stdin"], input=raw,
                         cwd=c.path, capture_output=True).stdout.decode().strip()
    p = git("push", "origin", f"{oid}:refs/heads/rooms/{c.room}", cwd=c.path, check=False)
    return p.returncode, p.stderr[-400:]

def mktree(c, entries: bytes):
    return subprocess.run(["git", "mktree", "-z"], input=entries, cwd=c.path, capture_output=True).stdout.decode().strip()

def test_names(hub, team, clone):
    c = clone("core/juno")
    blob = subprocess.run(["git", "hash-object", "-w", "--stdin"], input=b"hello\n", cwd=c.path, capture_output=True).stdout.decode().strip()
    base = subprocess.run(["git", "ls-tree", "-z", "HEAD"], cwd=c.path, capture_output=True).stdout
    ctx = mktree(c, b"100644 blob %s\t\xff.md\0" % blob.encode())
    t = mktree(c, base + b"040000 tree %s\tcontext\0" % ctx.encode())
    print("nonutf8 name", push_tree(c, t, b"ctx\n\nGitdrop-Op: context-set\n"))
    ctx = mktree(c, b"100644 blob %s\tn\xef\xbf\xbd.md\0" % blob.encode())
    t = mktree(c, base + b"040000 tree %s\tcontext\0" % ctx.encode())
    print("fffd name", push_tree(c, t, b"ctx\n\nGitdrop-Op: context-set\n"))
    # same name twice via different normalization? capital
    ctx = mktree(c, b"100644 blob %s\tNotes.md\0" % blob.encode())
    t = mktree(c, base + b"040000 tree %s\tcontext\0" % ctx.encode())
    print("capital", push_tree(c, t, b"ctx\n\nGitdrop-Op: context-set\n"))
