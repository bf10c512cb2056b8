"""`gitdrop repair`: look the hub over and mend what a killed process or a damaged
disk left.

What it does by itself (each is safe: the same happens on the next write anyway):
- a damaged write-ahead log is kept aside and a new one made (gitdrop.wal);
- ref locks whose owner is dead are removed (gitdrop.locks), the log told first;
- temporary files a killed writer left (a file rewritten whole, a new object, a new
  log) are removed once their process is gone.

What it only reports, and mends when asked (`--apply`, `--set REF=COMMIT`):
- a ref that names no commit (a garbage or cut-short file, or a missing commit),
  with the value to put back: the last one gitdrop logged for it (or the newest
  commit pushed on top of it, which the log does not record), or else the newest
  commit of that room that no ref reaches any more.

Exit 0 when the hub is healthy afterwards; 8 (damaged) while a ref stays damaged.
"""

import os
import re
import time
from typing import Annotated, Optional

import typer

from .. import durable, locks, model, wal
from .base import Scope, command
from ..errors import Damaged, GitdropError, NotFound, UsageError

app = typer.Typer(add_completion=False)

SCOPES = ("refs/heads/", "refs/archive/")   # where gitdrop keeps its refs


# --- looking ----------------------------------------------------------------------

# The temporary files gitdrop's writers make, with the pid of the process that made
# each: files.write_whole, durable.Writer and wal._restore_object, wal.create.
_TEMP = re.compile(r"\.(\d+)(-[0-9a-f]+)?\.tmp$|^tmp_obj_(\d+)_[0-9a-f]+$|\.new(\d+)$")
_TEMP_AGE = 60   # seconds: a live writer's temp file lasts milliseconds


def stale_temp_files(path: str) -> list[str]:
    """Temporary files under the hub's own folders whose writer is gone (a kill -9
    between making one and putting it in place): nobody ever reads them."""
    out, now = [], time.time()
    for folder in ("gitdrop", "hooks", "objects"):
        for top, _, names in os.walk(os.path.join(path, folder)):
            for name in names:
                m = _TEMP.search(name)
                full = os.path.join(top, name)
                if m is None or _alive(int(next(g for g in m.groups() if g and g[0] != "-"))):
                    continue
                try:
                    if now - os.lstat(full).st_mtime >= _TEMP_AGE:
                        out.append(full)
                except FileNotFoundError:
                    pass
    return sorted(out)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True   # another user's: alive
    return True

def hub_path(s: Scope) -> str:
    from ..core import default_hub
    from ..leanstore import is_hub
    from ..transports.remote import is_url
    value = s.hub_value or default_hub()
    if is_url(value):
        raise UsageError(f"{value} is a git URL; repair works on the hub's own machine",
                         "run gitdrop repair --hub PATH where the hub lives")
    path = os.path.abspath(os.path.expanduser(value))
    if not is_hub(path):
        raise NotFound(f"no gitdrop hub at {path}", "give its path with --hub PATH")
    return path


def refs(path: str) -> dict:
    """Every ref gitdrop keeps: {ref: raw value}, loose files over packed-refs."""
    out = {}
    try:
        with open(os.path.join(path, "packed-refs"), "rb") as f:
            for line in f:
                if line.startswith((b"#", b"^")):
                    continue
                value, _, ref = line.rstrip(b"\n").partition(b" ")
                ref = ref.decode("utf-8", "replace")
                if ref.startswith(SCOPES):
                    out[ref] = value
    except FileNotFoundError:
        pass
    for scope in SCOPES:
        top = os.path.join(path, scope)
        for d, _dirs, files in os.walk(top):
            for f in files:
                if f.endswith(".lock"):
                    continue
                full = os.path.join(d, f)
                ref = os.path.relpath(full, path)
                try:
                    with open(full, "rb") as fh:
                        out[ref] = fh.read(100).split(b"\n", 1)[0].strip()
                except OSError:
                    out[ref] = b""
    return out


def _commit_ok(reader, oid: str) -> bool:
    try:
        c = reader.commit(oid)
        reader.tree(c.tree)
        return True
    except Exception:   # missing, damaged or of another kind: not a commit to trust
        return False


def _room_of(ref: str) -> str | None:
    for prefix in (model.ROOM_PREFIX, model.ARCHIVE_PREFIX):
        if ref.startswith(prefix):
            return ref[len(prefix):]
    return None


def _unreachable_heads(path: str, reader) -> list:
    """Commits no ref reaches that no other such commit builds on, deepest history
    first: [(depth, time, oid)]."""
    import subprocess
    p = subprocess.run(["git", "--git-dir", path, "fsck", "--unreachable", "--no-reflogs",
                        "--no-progress"], capture_output=True, text=True)
    commits = [line.split()[2] for line in p.stdout.splitlines()
               if line.startswith("unreachable commit ")]
    parents = set()
    for oid in commits:
        try:
            parents.update(reader.commit(oid).parents)
        except KeyError:
            pass
    depth: dict = {}

    def depth_of(oid: str) -> int:
        line = []
        while oid and oid not in depth:
            line.append(oid)
            try:
                oid = reader.commit(oid).parent
            except KeyError:
                oid = ""
        n = depth.get(oid, 0)
        for c in reversed(line):
            n += 1
            depth[c] = n
        return n
    heads = [(depth_of(c), reader.commit(c).time, c) for c in commits
             if c not in parents and _commit_ok(reader, c)]
    return sorted(heads, reverse=True)


def _candidates(path: str, reader, ref: str, heads: list) -> list[str]:
    """Commits that were `ref`'s tip once, by what their tree says: a room's
    room.toml names it; the hub branch has hub.toml."""
    from .. import fmt
    room = _room_of(ref)
    out = []
    for _depth, _when, oid in heads:
        tree = reader.commit(oid).tree
        if ref == model.HUB_REF:
            if reader.read_path(tree, "hub.toml") is not None:
                out.append(oid)
            continue
        text = reader.read_path(tree, model.ROOM_FILE)
        try:
            name = fmt.loads_toml(text.decode()).get("name") if text else None
        except Exception:   # a file we cannot read names no room
            name = None
        if room is not None and name == room:
            out.append(oid)
    return out


def damaged_refs(path: str) -> list[dict]:
    """Refs that name no commit, each with the value to put back if one is known:
    [{ref, holds, why, offer, source, candidates}]."""
    from ..catfile import CatFile
    reader = CatFile(git_dir=path)
    out, heads = [], None
    try:
        for ref, raw in sorted(refs(path).items()):
            value = raw.decode("ascii", "replace")
            if durable.is_oid(value):
                if _commit_ok(reader, value):
                    continue
                why = f"names commit {value}, which is missing or damaged"
            else:
                why = (f"holds {raw[:60].decode('utf-8', 'replace')!r}, not a commit id"
                       if raw.strip() else "is empty")
            entry = {"ref": ref, "holds": raw.decode("utf-8", "replace"), "why": why,
                     "offer": "", "source": "", "candidates": []}
            logged = wal.last_logged(path, ref)
            if logged and logged != value and _commit_ok(reader, logged):
                if heads is None:
                    heads = _unreachable_heads(path, reader)
                entry.update(_past_logged(path, reader, ref, logged, heads))
            else:
                if heads is None:
                    heads = _unreachable_heads(path, reader)
                found = _candidates(path, reader, ref, heads)
                entry["candidates"] = found
                depths = {oid: d for d, _w, oid in heads}
                if found and (len(found) == 1 or depths[found[0]] > depths[found[1]]):
                    entry.update(offer=found[0], source="the newest commit of its history "
                                 "that no ref reaches")
            out.append(entry)
    finally:
        reader.close()
    return out


def _past_logged(path: str, reader, ref: str, logged: str, heads: list) -> dict:
    """What to put back for a ref whose last logged value is `logged`. A push is not
    in the log, so commits pushed after it are lost with the ref: unreachable now,
    and on `logged`'s first-parent line. The newest such commit is offered if it is
    the only one that deep and the rules accept its commits since `logged` (as
    gitdrop verify checks them); else `logged`, or nothing when two lines are as
    deep, with every such commit listed to choose from (--set)."""
    from ..verify import check_commits
    memo: dict = {}
    later = [oid for oid in _candidates(path, reader, ref, heads)
             if oid != logged and _extends(reader, oid, logged, memo)]
    if not later:
        return {"offer": logged, "source": "the last value gitdrop logged for it"}
    depths = {oid: d for d, _w, oid in heads}
    newest = later[0]
    if len(later) > 1 and depths[later[1]] == depths[newest]:
        return {"offer": "", "candidates": [logged] + later}
    try:
        check_commits(reader, ref, logged, newest, None)
    except (GitdropError, KeyError, ValueError):   # refused, or an object is missing
        return {"offer": logged, "candidates": later,
                "source": "the last value gitdrop logged for it; the later commits listed "
                "as candidates build on it but are not accepted by the rules"}
    return {"offer": newest, "candidates": [logged] + later[1:],
            "source": f"the newest commit built on {logged[:12]}, the last value gitdrop "
            "logged for it: pushed with git, which the log does not record"}


def _extends(reader, oid: str, base: str, memo: dict) -> bool:
    """Whether `base` is on `oid`'s first-parent line (`memo` keeps the answer for
    every commit walked, so heads of one history are walked once)."""
    line = []
    while oid and oid != base and oid not in memo:
        line.append(oid)
        try:
            oid = reader.commit(oid).parent
        except KeyError:
            oid = ""
    found = oid == base or memo.get(oid, False)
    for c in line:
        memo[c] = found
    return found


# --- mending ----------------------------------------------------------------------

def put_back(path: str, ref: str, oid: str) -> None:
    """Set `ref` to `oid` ("": remove it) under its lock, durably, and logged (so
    that a replay of the log after a crash ends where this left it)."""
    full = os.path.join(path, ref)
    lock = full + ".lock"
    fd = locks.take(lock)
    if fd is None:
        wal.clear_lock(path, ref)
        fd = locks.take(lock)
        if fd is None:
            raise Damaged(f"{ref} is locked by a live writer", "run gitdrop repair again")
    try:
        try:
            os.write(fd, oid.encode() + b"\n")
            os.fsync(fd)

            def move():
                if oid:
                    os.replace(lock, full)
                else:
                    os.unlink(full)
                    os.unlink(lock)
            if os.path.exists(wal.path_for(path)):
                with wal.for_hub(path).append([(ref, "", oid)]):
                    move()
            else:
                move()
        except BaseException:
            try:
                os.unlink(lock)
            except FileNotFoundError:
                pass
            raise
    finally:
        os.close(fd)
    wal.fsync_path(os.path.dirname(full))


def _commit_id(path: str, value: str) -> str:
    from ..catfile import CatFile
    reader = CatFile(git_dir=path)
    try:
        if durable.is_oid(value) and _commit_ok(reader, value):
            return value
    finally:
        reader.close()
    raise UsageError(f"{value!r} is not a commit of this hub", "give a full commit id")


# --- the command ------------------------------------------------------------------

@command(app, "repair")
def repair(s: Scope,
           apply: Annotated[bool, typer.Option(
               "--apply", help="Also put each damaged ref back to the value offered.")] = False,
           set_: Annotated[Optional[list[str]], typer.Option(
               "--set", metavar="REF=COMMIT",
               help="Put REF back to COMMIT (one of the candidates listed; repeat).")] = None,
           drop: Annotated[Optional[list[str]], typer.Option(
               "--drop", metavar="REF",
               help="Remove a damaged REF that has nothing to put back (repeat).")] = None):
    """Clear dead processes' locks, rebuild a damaged log, list damaged refs (--apply)."""
    path = hub_path(s)
    hub = f"gitdrop --hub {path} repair"
    report: dict = {"hub": path, "log": "none", "locks_cleared": [], "locks_in_use": [],
                    "temp_removed": [], "damaged": [], "restored": []}
    # 1. the log (a damaged one is rebuilt as the hub is opened, and says so)
    from ..wal import read_config
    had = os.path.exists(wal.path_for(path))
    if had or durable.method_for(read_config(path), path) == "wal":
        log = wal.for_hub(path)
        report["log"] = f"rebuilt (the damaged one is {log.recovered})" if log.recovered \
            else "ok" if had else "made (there was none)"
    # 2. locks: a dead owner's go; a live one's stay
    for name in locks.find(path):
        ref = name[:-len(".lock")]
        state = wal.clear_lock(path, ref) if ref != "packed-refs" else locks.clear(path, ref)
        if state == "cleared":
            report["locks_cleared"].append(name)
        elif state in ("held", "young"):
            report["locks_in_use"].append(name)
    # 3. temporary files of writers killed before they put them in place
    for full in stale_temp_files(path):
        try:
            os.unlink(full)
            report["temp_removed"].append(os.path.relpath(full, path))
        except FileNotFoundError:
            pass
    # 4. refs: what is damaged, and what to put back
    wanted = {}
    for item in set_ or []:
        ref, eq, value = item.partition("=")
        if not eq or not ref.startswith("refs/"):
            raise UsageError(f"--set {item!r}: expected REF=COMMIT",
                             "e.g. --set refs/heads/rooms/lobby=<commit id>")
        wanted[ref] = _commit_id(path, value.strip())
    for ref in drop or []:
        wanted[ref] = ""
    found = damaged_refs(path)
    stray = [ref for ref in wanted if ref not in {e["ref"] for e in found}]
    if stray:   # --set and --drop are for damaged refs only
        raise UsageError(f"{', '.join(stray)} is not damaged",
                         "--set and --drop only mend a ref that gitdrop repair lists")
    for entry in found:
        oid = wanted[entry["ref"]] if entry["ref"] in wanted else \
            entry["offer"] if apply and entry["offer"] else None
        if oid is None:
            report["damaged"].append(entry)
            continue
        put_back(path, entry["ref"], oid)
        report["restored"].append({"ref": entry["ref"], "to": oid})
    # 5. hooks another gitdrop install wrote (after one installed anew elsewhere): they
    # run that install's rules, maybe older than what this one writes
    from ..hookfiles import hooks_elsewhere, refresh_hooks
    report["hooks_replaced"] = refresh_hooks(path, also_other=True) if apply else []
    report["hooks_elsewhere"] = sorted(hooks_elsewhere(path))
    healthy = not report["damaged"]
    s.emit(dict(report, ok=healthy, healthy=healthy), lambda: _show(report, hub))
    if not healthy:
        raise typer.Exit(Damaged.exit_code)


def _show(report: dict, hub: str) -> None:
    import sys
    print(f"log: {report['log']}")
    for name in report["locks_cleared"]:
        print(f"cleared {name}: its owner was dead")
    for name in report["locks_in_use"]:
        print(f"left {name}: a live process holds it")
    for name in report["temp_removed"]:
        print(f"removed {name}: a temporary file its killed writer left")
    for r in report["restored"]:
        print(f"put back {r['ref']} = {r['to']}" if r["to"] else f"removed {r['ref']}")
    for name in report["hooks_replaced"]:
        print(f"hook {name}: another gitdrop's, replaced by this one's")
    for name in report["hooks_elsewhere"]:
        print(f"hook {name}: another gitdrop install's (it runs that one's rules)")
        print(f"next: {hub} --apply (or gitdrop init on the hub) puts this one's in place",
              file=sys.stderr)
    for e in report["damaged"]:
        print(f"damaged: {e['ref']} {e['why']}")
        if e["offer"]:
            print(f"  put back: {e['offer']} ({e['source']})")
        for c in e["candidates"]:
            if c != e["offer"]:
                print(f"  candidate: {c}")
    if report["damaged"]:
        with_offer = [e for e in report["damaged"] if e["offer"]]
        if with_offer:
            print(f"next: {hub} --apply", file=sys.stderr)
        for e in report["damaged"]:
            if not e["offer"]:
                print(f"next: {hub} --set {e['ref']}=COMMIT (one of the candidates above)"
                      if e["candidates"] else
                      f"next: {hub} --drop {e['ref']} (no commit of its history is left "
                      f"in the hub)",
                      file=sys.stderr)
    else:
        print("the hub is healthy")
