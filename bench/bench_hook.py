"""A hook-validated `git push` of one task file, beside the same push into the
same hub with no hook (the floor), in one run.

    python bench/bench_hook.py                 # 50 pushes each
    python bench/bench_hook.py --pushes 100

The hub is made by gitdrop.hub.init (real pre-receive hook, the hub's git
settings: fsck of incoming objects, fsync of objects and refs). The floor is a
copy of that hub with the hook removed, so the difference is the hook alone; a
bare repository with git's defaults is shown for reference. Each push carries
one commit made by hand (no trailers: the hook infers "task-create" from the
new tasks/<xx>/<id>.md), pushed with `git push` over the local transport; the same
commit goes to every target, in alternating order.
"""

import argparse
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import Timer, ms, ratio  # noqa: E402

import pygit2  # noqa: E402

from gitdrop import hub as hubmod, model  # noqa: E402
from gitdrop.view import render_file  # noqa: E402

AGENT = "bench/carol"
REF = model.ROOM_PREFIX + "lobby"


def git(*args, **kw):
    return subprocess.run(["git", *args], check=True, capture_output=True, **kw)


def task_commit(client: pygit2.Repository, parent, tid: int, now: int):
    """A commit made by hand: a new tasks/<xx>/<tid>.md, no Gitdrop trailers."""
    doc = model.with_defaults("task", {"id": str(tid), "title": f"pushed task {tid}",
                                       "creator": AGENT, "created": now, "updated": now})
    text = render_file("task", doc, f"Task {tid}, pushed with plain git.")
    base = client[parent].tree
    xx = model.bucket(tid)
    tasks = base["tasks"] if "tasks" in base else None
    tb = client.TreeBuilder(client[tasks.id]) if tasks is not None else client.TreeBuilder()
    bucket = client[tasks.id][xx] if tasks is not None and xx in client[tasks.id] else None
    bb = client.TreeBuilder(client[bucket.id]) if bucket is not None else client.TreeBuilder()
    bb.insert(f"{tid}.md", client.create_blob(text.encode()), pygit2.GIT_FILEMODE_BLOB)
    tb.insert(xx, bb.write(), pygit2.GIT_FILEMODE_TREE)
    root = client.TreeBuilder(base)
    root.insert("tasks", tb.write(), pygit2.GIT_FILEMODE_TREE)
    sig = pygit2.Signature(AGENT, "carol@bench.gitdrop", now, 0)
    return client.create_commit(None, sig, sig, f"task {tid}: pushed task {tid}\n",
                                root.write(), [parent])


def push(client_dir: str, target: str, oid) -> float:
    t = time.perf_counter()
    p = subprocess.run(["git", "--git-dir", client_dir, "push", "-q", target,
                        f"{oid}:{REF}"], capture_output=True)
    dt = time.perf_counter() - t
    if p.returncode:
        raise RuntimeError(f"push to {target} failed: {p.stderr.decode()}")
    return dt


def spawn(argv, stdin: bytes = b"", env=None) -> float:
    t = time.perf_counter()
    subprocess.run(argv, input=stdin, check=True, capture_output=True, env=env)
    return time.perf_counter() - t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pushes", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--dir", default="")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args(argv)
    work = common.begin(a.dir, "hook-",
                        "gitdrop hook: git push of one task file, with and without the hook")
    try:
        hub_dir = os.path.join(work, "hub.git")
        floor_dir = os.path.join(work, "floor.git")
        plain_dir = os.path.join(work, "plain.git")
        client_dir = os.path.join(work, "client.git")
        for d in (hub_dir, floor_dir, plain_dir, client_dir):
            shutil.rmtree(d, ignore_errors=True)
        h = hubmod.init(hub_dir)
        h.room("lobby").register(AGENT)
        shutil.copytree(hub_dir, floor_dir, symlinks=True)
        os.remove(os.path.join(floor_dir, "hooks", "pre-receive"))
        git("clone", "-q", "--bare", "--no-local", hub_dir, plain_dir)
        git("clone", "-q", "--bare", "--no-local", hub_dir, client_dir)
        hook = os.path.join(hub_dir, "hooks", "pre-receive")
        with open(hook) as f:
            python = f.readline()[2:].split()[0]
        targets = {"hook": hub_dir, "floor": floor_dir, "plain": plain_dir}
        print(f"hub: gitdrop.hub.init (hook {hook}, interpreter {python} -S); "
              "floor: the same hub, hook removed; plain: git clone --bare, git defaults")

        client = pygit2.Repository(client_dir)
        parent = client.references[REF].target
        t = Timer()
        names = list(targets)
        for i in range(a.warmup + a.pushes):
            oid = task_commit(client, parent, i + 1, int(time.time()))
            order = names if i % 2 == 0 else names[::-1]
            for name in order:
                dt = push(client_dir, targets[name], oid)
                if i >= a.warmup:
                    t.add(name, dt)
            parent = oid
        for name, d in targets.items():
            tip = str(pygit2.Repository(d).references[REF].target)
            assert tip == str(parent), f"{name} did not take every push"

        # A push the hook must refuse (an unregistered author): proves it ran.
        sig = pygit2.Signature("bench/nobody", "nobody@bench.gitdrop", int(time.time()), 0)
        bad = client.create_commit(None, sig, sig, "a note from nobody\n",
                                   client[parent].tree_id, [parent])
        p = subprocess.run(["git", "--git-dir", client_dir, "push", "-q", hub_dir,
                            f"{bad}:{REF}"], capture_output=True, text=True)
        refused = p.returncode != 0 and "registered-author" in p.stderr

        # What the hook costs on its own, and the interpreter's start-up.
        env = dict(os.environ, GIT_DIR=hub_dir)
        line = f"{client[parent].parents[0].id} {parent} {REF}\n".encode()
        pkg = common.ROOT
        for _ in range(a.pushes):
            t.add("hook alone (run by hand, one commit)", spawn([hook], line, env))
            t.add("python -S -c pass", spawn([python, "-S", "-c", "pass"]))
            t.add("python -S, import gitdrop.hook", spawn(
                [python, "-S", "-c", f"import sys; sys.path.insert(0, {pkg!r}); "
                 "import gitdrop.hook"]))
            t.add("git cat-file --batch (start, one object)", spawn(
                ["git", "--git-dir", hub_dir, "cat-file", "--batch"], f"{parent}\n".encode()))

        print(f"\n## git push of one task file, {a.pushes} pushes each (+{a.warmup} warm-up)")
        floor = t.med("floor")
        print(f"  {'target':44} {'median':>9} {'p99':>9} {'vs floor':>9}   (ms)")
        for name, label in (("hook", "hub with the gitdrop pre-receive hook"),
                            ("floor", "same hub, no hook (the floor)"),
                            ("plain", "bare repo, git defaults")):
            print(f"  {label:44} {ms(t.med(name)):>9} {ms(t.p99(name)):>9} "
                  f"{ratio(t.med(name), floor):>9}")
        print("\n## parts (not pushes)")
        for label in ("hook alone (run by hand, one commit)", "python -S -c pass",
                      "python -S, import gitdrop.hook", "git cat-file --batch (start, one object)"):
            print(f"  {label:44} {ms(t.med(label)):>9} {ms(t.p99(label)):>9}")
        print(f"\nrefused push by an unregistered author: {'refused (hook ran)' if refused else 'NOT REFUSED'}")
        print(f"target: hook-validated push within 2x the floor: {t.med('hook') / floor:.2f}x "
              f"(p99 {t.p99('hook') / t.p99('floor'):.2f}x)")
        print(f"\nfinished: {time.strftime('%Y-%m-%d %H:%M:%S')}; command: {common.command()}")
        return 0 if refused else 1
    finally:
        if not a.keep and not a.dir:
            common.leave(work)


if __name__ == "__main__":
    sys.exit(main())
