"""A hub: the bare repository, its hooks and settings, its teams and the
lifecycle of its rooms (create, join, leave, archive, pin, destroy, reap)."""

import os
import sys
import time

import pygit2

from . import fmt, hubrules, model
from .core import Room, default_hub
from .errors import NotFound, Refusal, UsageError
from .store import Store
from .view import RoomView, first_parent_walk, render_file

# Settings that protect a hub: no rewrites or deletes by push, checked objects,
# durable writes, push options for the hook.
GIT_SETTINGS = {
    "receive.denyNonFastForwards": "true",
    "receive.denyDeletes": "true",
    "receive.fsckObjects": "true",
    "receive.advertisePushOptions": "true",
    "core.fsync": "objects,reference",
    "core.fsyncMethod": "fsync",
    "gc.auto": "0",
    "http.receivepack": "true",
}
HOOKS = ("pre-receive",)
REAPER = "hub/reaper"
DAY = 86400


def hooks_source() -> str:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    candidates = [os.path.join(here, "hooks"), os.path.join(os.path.dirname(__file__), "_hooks")]
    for c in candidates:
        if os.path.exists(os.path.join(c, "pre-receive")):
            return c
    raise NotFound("gitdrop's hook files are missing from this install", "reinstall gitdrop")


def install_hooks(git_dir: str) -> None:
    """Write the hooks with this interpreter and this gitdrop baked in."""
    src = hooks_source()
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.makedirs(os.path.join(git_dir, "hooks"), exist_ok=True)
    for name in HOOKS:
        with open(os.path.join(src, name)) as f:
            text = f.read()
        text = text.replace("@PYTHON@", os.path.realpath(sys.executable) if False else sys.executable)
        text = text.replace("@GITDROP_PATH@", pkg_parent)
        dest = os.path.join(git_dir, "hooks", name)
        tmp = dest + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o755)
        os.replace(tmp, dest)


def init(path: str = "", room: str = "lobby", creator: str = "hub/admin",
         fsync: bool = True) -> "Hub":
    """Create a hub (or upgrade one in place: hooks and settings; nothing is lost)."""
    path = os.path.abspath(os.path.expanduser(path or default_hub()))
    if not os.path.exists(os.path.join(path, "HEAD")):
        os.makedirs(path, exist_ok=True)
        pygit2.init_repository(path, bare=True, initial_head="hub")
    repo = pygit2.Repository(path)
    for k, v in GIT_SETTINGS.items():
        repo.config[k] = v
    if "gitdrop.fsync" not in repo.config:
        repo.config["gitdrop.fsync"] = "true" if fsync else "false"
    install_hooks(path)
    hub = Hub(path)
    if not hub.store.tip(model.HUB_REF):
        hub._hub_commit(creator, {"hub.toml": fmt.dumps_toml(
            {"version": 1, "created": hub.clock()})}, "hub created", "hub-init")
    if room and not hub.store.rooms():
        hub.create_room(creator, room, open_=True)
    return hub


class Hub:
    def __init__(self, path: str = "", clock=None):
        self.path = os.path.abspath(os.path.expanduser(path or default_hub()))
        self.store = Store(self.path)
        self.clock = clock or (lambda: int(time.time()))

    def room(self, name: str) -> Room:
        self.store.room_tip(name)  # raises NotFound with a hint
        return Room(self.store, name, self.clock)

    def config(self, key: str, default: int) -> int:
        cfg = self.store.repo.config
        try:
            return int(cfg[key]) if key in cfg else default
        except ValueError:
            return default

    # --- the hub branch ---------------------------------------------------------
    def _hub_view(self) -> RoomView:
        tip = self.store.tip(model.HUB_REF)
        tree = self.store.reader.commit(tip).tree if tip else None
        return RoomView(self.store.reader, tree, tip, "hub")

    def _hub_commit(self, author, files, subject, op, **extra):
        trailers = [("op", op)] + [(k, str(v)) for k, v in extra.items() if v]

        def build(view, tip):
            return files, fmt.format_message(subject, "", trailers), {}
        oid, _ = self.store.write(model.HUB_REF, build, author, now=self.clock(), check=False)
        return oid

    def register_team(self, name: str, lead: str, members=(), by: str = "") -> dict:
        if not model.is_name(name):
            raise UsageError(f"bad team name {name!r}", "letters, digits, '.', '_', '-'")
        lead = lead if "/" in lead else f"{name}/{lead}"
        members = [m if "/" in m else f"{name}/{m}" for m in members if m]
        old = self.team(name, missing_ok=True)
        author = by or (old["lead"] if old else lead)
        if old and author != old["lead"]:
            raise Refusal("lead-only", f"team {name} is led by {old['lead']}",
                          f"ask {old['lead']} to change it")
        doc = {"name": name, "lead": lead, "members": sorted(set(members) | {lead}),
               "created": old["created"] if old else self.clock()}
        # the hub branch has its own small rule set; run it as the hook would
        from .view import CommitData
        proposed = CommitData("", None, ["x"], author, "", self.clock(),
                              fmt.format_message("team", "", [("op", "team")]))
        txt = fmt.dumps_toml(doc)
        fake = _TextReader({"old": fmt.dumps_toml(old) if old else None, "new": txt})
        hubrules.check(fake, proposed, [(hubrules.team_path(name),
                                         "old" if old else None, "new")])
        self._hub_commit(author, {hubrules.team_path(name): txt},
                         f"team {name} {'updated' if old else 'created'} (lead {model.short(lead)})",
                         "team-update" if old else "team-create")
        return doc

    def team(self, name: str, missing_ok=False) -> dict | None:
        text = self._hub_view().text(hubrules.team_path(name))
        if text is None:
            if missing_ok:
                return None
            raise NotFound(f"no team {name!r}", "create it: gitdrop team create NAME --lead L")
        return dict(hubrules.TEAM_FIELDS, **fmt.loads_toml(text))

    def teams(self) -> list[dict]:
        view = self._hub_view()
        return [self.team(n[:-5]) for n in view.names("teams") if n.endswith(".toml")]

    # --- rooms --------------------------------------------------------------------
    def create_room(self, creator: str, name: str, teams=(), open_: bool = False,
                    settings: dict | None = None) -> dict:
        if not model.is_name(name):
            raise UsageError(f"bad room name {name!r}", "letters, digits, '.', '_', '-'")
        if self.store.tip(self.store.room_ref(name)) or \
                self.store.tip(model.ARCHIVE_PREFIX + name):
            raise Refusal("format", f"room {name!r} already exists", "pick another name")
        teams = [t for t in teams if t]
        leads = {}
        for t in teams:
            team = self.team(t, missing_ok=True)
            if team:
                leads[t] = team["lead"]
        doc = model.with_defaults("room", {"name": name, "created": self.clock(),
                                           "open": open_ or not teams, "teams": teams,
                                           "leads": leads, "settings": settings or {}})

        def build(view, tip):
            if tip:
                raise Refusal("format", f"room {name!r} already exists", "pick another name")
            return ({model.ROOM_FILE: render_file("room", doc)},
                    fmt.format_message(f"room {name} created by {model.short(creator)}"
                                       + (f" for {', '.join(teams)}" if teams else ""), "",
                                       [("op", "room-create")]), {})
        oid, _ = self.store.write(self.store.room_ref(name), build, creator, now=self.clock())
        return {"room": name, "commit": oid, "teams": teams, "open": doc["open"]}

    def join_room(self, team: str, room: str, by: str) -> dict:
        t = self.team(team)
        r = self.room(room)
        if team in r.view().room["teams"]:
            return {"room": room, "team": team, "joined": False}
        by = by or t["lead"]
        r.update_room(by, "room-join", f"team {team} joined {room}",
                      teams=lambda d: d["teams"] + [team],
                      leads=lambda d: dict(d["leads"], **{team: t["lead"]}))
        return {"room": room, "team": team, "joined": True}

    def leave_room(self, team: str, room: str, by: str) -> dict:
        r = self.room(room)
        if team not in r.view().room["teams"]:
            raise NotFound(f"team {team!r} is not in room {room!r}", "")
        r.update_room(by, "room-leave", f"team {team} left {room}",
                      teams=lambda d: [x for x in d["teams"] if x != team],
                      leads=lambda d: {k: v for k, v in d["leads"].items() if k != team})
        return {"room": room, "team": team, "left": True}

    def pin_room(self, room: str, by: str, pinned: bool = True) -> dict:
        if self.store.tip(model.ARCHIVE_PREFIX + room):
            rec = self._archive_record(room)
            self._require_lead_at(room, model.ARCHIVE_PREFIX + room, by)
            self._hub_commit(by, {f"archive/{room}.toml": fmt.dumps_toml(dict(rec, pinned=pinned))},
                             f"archived room {room} {'pinned' if pinned else 'unpinned'}",
                             "room-pin", room=room)
        else:
            self.room(room).update_room(by, "room-pin",
                                        f"room {room} {'pinned' if pinned else 'unpinned'}",
                                        pinned=pinned)
        return {"room": room, "pinned": pinned}

    def _require_lead_at(self, room: str, ref: str, by: str) -> None:
        tip = self.store.tip(ref)
        c = self.store.reader.commit(tip)
        view = RoomView(self.store.reader, c.tree, tip, room)
        leads = set(view.room["leads"].values()) | set(view.leads())
        if by not in leads and by != REAPER:
            raise Refusal("lead-only", f"{by} is not a lead of room {room!r} "
                          f"(leads: {', '.join(sorted(leads)) or 'none'})",
                          "ask a lead of the room to do this")

    def archive_room(self, room: str, by: str, why: str = "") -> dict:
        ref = self.store.room_ref(room)
        self.store.room_tip(room)
        self._require_lead_at(room, ref, by)
        tip = self.store.move_ref(ref, model.ARCHIVE_PREFIX + room)
        pinned = RoomView(self.store.reader, self.store.reader.commit(tip).tree, tip, room).room["pinned"]
        self._hub_commit(by, {f"archive/{room}.toml": fmt.dumps_toml(
            {"name": room, "archived": self.clock(), "tip": tip, "pinned": pinned})},
            f"room {room} archived by {model.short(by)}" + (f" ({why})" if why else ""),
            "room-archive", room=room)
        return {"room": room, "archived": True, "tip": tip}

    def restore_room(self, room: str, by: str) -> dict:
        self._require_lead_at(room, model.ARCHIVE_PREFIX + room, by)
        self.store.move_ref(model.ARCHIVE_PREFIX + room, self.store.room_ref(room))
        self._hub_commit(by, {f"archive/{room}.toml": None},
                         f"room {room} restored by {model.short(by)}", "room-restore", room=room)
        return {"room": room, "archived": False}

    def _archive_record(self, room: str) -> dict:
        text = self._hub_view().text(f"archive/{room}.toml")
        return fmt.loads_toml(text) if text else {"name": room, "archived": 0, "pinned": False}

    def destroy_room(self, room: str, by: str, why: str = "") -> dict:
        """Hard delete: the room's ref goes; only a lead of the room may do it."""
        ref = self.store.room_ref(room)
        if not self.store.tip(ref):
            ref = model.ARCHIVE_PREFIX + room
            if not self.store.tip(ref):
                raise NotFound(f"no room {room!r}", "gitdrop room list --all")
        self._require_lead_at(room, ref, by)
        tip = self.store.tip(ref)
        self.store.delete_ref(ref)
        files = {f"archive/{room}.toml": None} if self._hub_view().text(f"archive/{room}.toml") else {}
        self._hub_commit(by, files, f"room {room} destroyed by {model.short(by)}"
                         + (f" ({why})" if why else ""), "room-destroy", room=room, tip=tip)
        return {"room": room, "destroyed": True, "tip": tip}

    def rooms(self, status: str = "active") -> list[dict]:
        out = []
        kinds = {"active": [model.ROOM_PREFIX], "archived": [model.ARCHIVE_PREFIX],
                 "all": [model.ROOM_PREFIX, model.ARCHIVE_PREFIX]}.get(status)
        if kinds is None:
            raise UsageError(f"bad status {status!r}", "active, archived or all")
        now = self.clock()
        for prefix in kinds:
            for name in self.store.rooms(prefix):
                tip = self.store.tip(prefix + name)
                c = self.store.reader.commit(tip)
                room = RoomView(self.store.reader, c.tree, tip, name).room
                idle = now - c.time
                out.append({"room": name, "status": "active" if prefix == model.ROOM_PREFIX
                            else "archived", "teams": room["teams"], "open": room["open"],
                            "pinned": room["pinned"] or (prefix == model.ARCHIVE_PREFIX and
                                                         self._archive_record(name).get("pinned", False)),
                            "last_activity": c.time,
                            "health": "busy" if idle < 3600 else "quiet" if idle < 7 * DAY else "idle"})
        return out

    def rooms_of_team(self, team: str) -> list[dict]:
        return [r for r in self.rooms() if team in r["teams"]]

    def room_status(self, room: str) -> dict:
        r = self.room(room)
        view = r.view()
        tasks = [view.task(t)[0] for t in view.task_ids()]
        n = 0
        for n, _c in enumerate(first_parent_walk(self.store.reader, view.commit), 1):
            if n >= 10000:
                break
        last = self.store.reader.commit(view.commit)
        return {"room": room, "teams": view.room["teams"], "open": view.room["open"],
                "leads": view.room["leads"], "pinned": view.room["pinned"],
                "agents": [a["id"] for a in view.agents()],
                "open_tasks": sum(1 for t in tasks if t["state"] not in ("completed", "cancelled")),
                "tasks": len(tasks), "commits": n if n < 10000 else "10000+",
                "last_activity": last.time, "last": last.subject, "tip": view.commit}

    def reap(self, now: int | None = None) -> dict:
        """Archive idle rooms (if gitdrop.idleArchiveDays > 0) and destroy archives older
        than gitdrop.archiveExpiryDays (default 90) unless pinned. Commits what it did."""
        now = self.clock() if now is None else now
        idle_days = self.config("gitdrop.idleArchiveDays", 0)
        expiry_days = self.config("gitdrop.archiveExpiryDays", 90)
        archived, destroyed = [], []
        if idle_days > 0:
            for r in self.rooms("active"):
                if not r["pinned"] and now - r["last_activity"] >= idle_days * DAY:
                    self.archive_room(r["room"], REAPER, f"idle {idle_days} days")
                    archived.append(r["room"])
        if expiry_days > 0:
            for r in self.rooms("archived"):
                rec = self._archive_record(r["room"])
                if r["pinned"] or rec.get("pinned"):
                    continue
                if now - int(rec.get("archived", 0)) >= expiry_days * DAY:
                    self.destroy_room(r["room"], REAPER, f"archived over {expiry_days} days")
                    destroyed.append(r["room"])
        return {"archived": archived, "destroyed": destroyed}

    def verify(self, room: str, archived: bool = False) -> list:
        """Re-check a whole room from its first commit (no clock rule)."""
        from .verify import check_commits
        ref = (model.ARCHIVE_PREFIX if archived else model.ROOM_PREFIX) + room
        tip = self.store.tip(ref)
        if not tip:
            raise NotFound(f"no room {room!r}", "")
        return check_commits(self.store.reader, model.ROOM_PREFIX + room, "", tip)


class _TextReader:
    """Lets the hub rules read proposed text as if it were blobs."""

    def __init__(self, texts):
        self.texts = texts

    def blob_text(self, key):
        return self.texts.get(key) if key else None


def open_hub(path: str = "", create: bool = True) -> Hub:
    path = os.path.abspath(os.path.expanduser(path or default_hub()))
    if create and not os.path.exists(os.path.join(path, "HEAD")):
        return init(path)
    return Hub(path)
