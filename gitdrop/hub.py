"""A hub: the bare repository, its hooks and settings, its teams and the
lifecycle of its rooms (create, join, leave, archive, pin, destroy, reap)."""

import contextlib
import os
import sys
import time

import pygit2

from . import durable, files, fmt, hubrules, layout, machine, model, rules, taskindex, tokens, \
    wal, writequeue
from .core import Room, by_short_name, count_arg, default_hub
from .hookfiles import install_hooks, refresh_hooks
from .errors import Conflict, Damaged, GitdropError, NotFound, Refusal, UsageError
from .rules import is_message
from .store import Store
from .view import CommitData, RoomView, first_parent_walk, render_file

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
# Set once, kept as the owner changes them: the most one push may send (git
# receives the whole pack into quarantine before the hook can refuse it, so a
# push of garbage could fill the disk every write of the hub needs). 1 GiB is past
# any push the rules accept at the default limits (10,000 commits, 64 KB files).
GIT_DEFAULTS = {"receive.maxInputSize": "1g"}
REAPER = "hub/reaper"
PACK_LOOSE = 6700   # loose objects past which a reap packs them (git's own gc.auto)
OPERATOR = "hub/admin"   # the hub's operator (any hub/* identity speaks as it)
MOVE_JOURNAL = "gitdrop/move"   # a room's ref move under way: the ref, where to, the tip
DAY = 86400


class _NotDue(Exception):
    """A room the reaper listed as due is due no more (checked under its lock)."""


def init(path: str = "", room: str = "lobby", creator: str = OPERATOR,
         fsync: bool = True, clock=None) -> "Hub":
    """Create a hub (or upgrade one in place: hooks and settings; nothing is lost)."""
    path = os.path.abspath(os.path.expanduser(path or default_hub()))
    from .leanstore import is_hub
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:   # git would take it; libgit2, through pygit2, cannot
        raise UsageError(f"{path!r} is not valid UTF-8; nothing was written",
                         "give gitdrop init a path in UTF-8") from None
    if not is_hub(path):
        if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)) and \
                not _empty_bare_repo(path):
            raise UsageError(f"{path} is not empty and is not a gitdrop hub; nothing was "
                             "written", "give gitdrop init a new or empty directory "
                             "(e.g. gitdrop init ~/hubs/team.git)")
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:   # a name too long, no permission, a read-only disk
            raise UsageError(f"cannot create {path}: {e.strerror}; nothing was written",
                             "give gitdrop init a directory you may create") from None
        pygit2.init_repository(path, bare=True, initial_head="hub")
    repo = pygit2.Repository(path)
    for k, v in GIT_SETTINGS.items():
        repo.config[k] = v
    for k, v in GIT_DEFAULTS.items():
        if k not in repo.config:
            repo.config[k] = v
    # The hub's own hooks (relative: git runs them in the hub), whatever the serving
    # account's global or system git config says for its other repositories: a
    # core.hooksPath there skipped gitdrop's hook. Only the hub's own setting counts.
    if "core.hooksPath" not in pygit2.Config(os.path.join(path, "config")):
        repo.config["core.hooksPath"] = "hooks"
    if "gitdrop.fsync" not in repo.config:
        repo.config["gitdrop.fsync"] = "true" if fsync else "false"
    install_hooks(path)
    if durable.method_for(repo.config, path) == "wal":
        size = repo.config["gitdrop.walSize"] if "gitdrop.walSize" in repo.config else ""
        wal.create(path, int(size) if size else wal.DEFAULT_SIZE)
    hub = Hub(path, clock=clock)
    if not hub.store.tip(model.HUB_REF):
        hub._hub_commit(creator, {"hub.toml": fmt.dumps_toml(
            {"version": 1, "created": hub.clock()})}, "hub created", "hub-init")
    if room and not hub.store.rooms():
        hub.create_room(creator, room, open_=True)
    return hub


def _empty_bare_repo(path: str) -> bool:
    """A bare repository with no refs yet (git init --bare): safe to make a hub of."""
    if not (os.path.isfile(os.path.join(path, "HEAD")) and os.path.isdir(
            os.path.join(path, "objects"))):
        return False
    if os.path.exists(os.path.join(path, "packed-refs")):
        return False
    return not any(files for _d, _s, files in os.walk(os.path.join(path, "refs")))


def _reached(step: str) -> None:
    """A named point of a room's ref move (the tests kill a process at each)."""


def _release(held) -> None:
    for _ref, tx, fd in held:
        tx.__exit__(RuntimeError, None, None)   # frees it; commits nothing more
        if fd is not None:
            os.close(fd)


class Hub:
    """A hub: its team registry (the hub branch) and the lifecycle of its rooms.

    `clock` (a function returning epoch seconds) dates every commit the hub and
    its rooms make and decides every age (health, idle archive, expiry)."""

    def __init__(self, path: str = "", clock=None):
        self.path = os.path.abspath(os.path.expanduser(path or default_hub()))
        from .leanstore import is_hub
        if not is_hub(self.path):
            raise no_hub(self.path)
        self.store = Store(self.path)
        self.clock = clock or (lambda: int(time.time()))
        # A hook whose gitdrop is gone (uninstalled, a venv made anew) refused every push
        refresh_hooks(self.path)
        if os.path.exists(os.path.join(self.path, MOVE_JOURNAL)):   # a move killed midway
            try:
                with self._moving():
                    self._finish_move()
            except OSError as e:   # not ours to write (a reader): the next mover does it
                sys.stderr.write(f"gitdrop: a room move in {self.path} was cut short and "
                                 f"is not finished yet ({e}); the next gitdrop command run "
                                 "by the hub's owner finishes it\n")

    moves_layout = True

    def room(self, name: str) -> Room:
        if not self.store.tip(self.store.room_ref(name)) and \
                self.store.tip(model.ARCHIVE_PREFIX + name):
            raise NotFound(f"room {name!r} is archived", f"read it with gitdrop room show "
                           f"{name}; a lead of the room restores it (gitdrop room restore "
                           f"{name})")
        self.store.room_tip(name)  # raises NotFound with a hint
        # A room of an older layout moves when it is first used, not every room at
        # every open (a hub of 200 rooms paid 10-16 ms a command for that). Only
        # here, on the hub's machine: a client of a URL must not write as hub/admin
        # (the hub's hook moves the room when a push arrives).
        if self.moves_layout:
            layout.upgrade(self.store, [name], now=self.clock())
        room = Room(self.store, name, self.clock)
        room.lead_claim = self.claim_lead
        return room

    def claim_lead(self, room: str, agent: str) -> None:
        """Make `agent` the lead of its team in `room`, as far as the team registry
        allows: a team nobody has made yet is created with it as lead (teams are
        self-service: the first to claim a name leads it); a team led by someone
        else is refused. The lead is then recorded in the room (an open room: the
        team joins; a closed one: the team must be a member already)."""
        team = model.split_agent(agent)[0]
        if model.reserved_team(team):
            raise Refusal("reserved-name", f"team {team!r} has no lead: "
                          + ("it is the hub's own" if team.lower() == model.ADMIN_TEAM else
                             "it holds agents that named no team"),
                          "register as team/name in a team of your own with --role lead")
        t = self.team(team, missing_ok=True)
        view = self.store.view(room)
        if t is None and not model.member_team(view.room, team):
            # said before the team is made: a refused registration made it all the same
            raise Refusal("room-membership", *rules.team_outside(
                view.room, room, team, f" once it exists (gitdrop team create {team} --lead "
                f"{model.short(agent)}), or register in a room your team is in"))
        if t is None:
            self.register_team(team, agent)
        elif t["lead"] != agent:
            raise Refusal("lead-only", f"team {team} is led by {t['lead']} (the hub's team "
                          f"registry); a role you give yourself makes nobody a lead",
                          f"register without --role lead, or ask {t['lead']} to hand the "
                          f"team over (gitdrop team create {team} --lead {model.short(agent)}"
                          f" --as {t['lead']})")
        if view.room["leads"].get(team) != agent and (
                view.room["open"] or team in view.room["teams"]):
            self.join_room(team, room, by=agent)

    def config(self, key: str, default: int) -> int:
        """A whole-number setting from the hub's git config (e.g. gitdrop.idleArchiveDays)."""
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

    def _hub_commit(self, author, files, subject, op, now=None, **extra):
        """One commit on the hub branch; `files` is {path: text|None} or a function of
        the current hub view returning it (called again after a lost race)."""
        trailers = [("op", op)] + [(k, str(v)) for k, v in extra.items() if v]

        def build(view, tip):
            return (files(view) if callable(files) else files,
                    fmt.format_message(subject, "", trailers), {})
        when = self.clock() if now is None else now
        oid, _ = self.store.write(model.HUB_REF, build, author, now=when, check=False)
        return oid

    # --- teams --------------------------------------------------------------------
    def register_team(self, name: str, lead: str, members=(), by: str = "",
                      remove=()) -> dict:
        """Create a team (by its lead, or a hub admin hub/...) or change it (its lead
        only): `members` are added to those it has, `remove` taken out (never its lead)."""
        if not model.is_name(name):
            raise UsageError(f"bad team name {name!r}", "letters, digits, '.', '_', '-'")
        lead = lead if "/" in lead else f"{name}/{lead}"
        members = [m if "/" in m else f"{name}/{m}" for m in members if m]
        remove = {m if "/" in m else f"{name}/{m}" for m in remove if m}
        if lead in remove:
            raise UsageError(f"{lead} leads team {name}: the lead stays a member",
                             f"hand the lead over first (gitdrop team create {name} --lead "
                             f"NEW --as {lead}), then take {model.short(lead)} out")
        by = by if not by or "/" in by else f"{name}/{by}"
        path = hubrules.team_path(name)
        old = self.team(name, missing_ok=True)
        if old is not None and old["lead"] == lead and set(members) <= set(old["members"]) \
                and not remove & set(old["members"]) - {lead}:
            # as asked already: no commit; but a hand-over killed before it reached
            # every room is finished by the same call, by either lead
            rooms = self._hand_over(name, by or lead, lead)
            if rooms or by in ("", lead):
                return dict(old, handed_over_in=rooms) if rooms else old
        author = by or (lead if old is None else "")
        if not author:
            raise Refusal("lead-only", f"team {name} exists and is led by {old['lead']}",
                          f"change it as its lead (--as {old['lead']})")
        doc = {}

        def build(view, tip):
            text = view.text(path)
            prev = dict(hubrules.TEAM_FIELDS, **fmt.loads_toml(text)) if text else None
            # added to what it has: a lead who named one new member dropped every other
            had = set(prev["members"]) if prev and isinstance(prev["members"], list) else set()
            doc.update(name=name, lead=lead, members=sorted((had | set(members)) - remove | {lead}),
                       created=prev["created"] if prev else self.clock())
            new = fmt.dumps_toml(doc)
            op = "team-update" if prev else "team-create"
            msg = fmt.format_message(f"team {name} {'updated' if prev else 'created'} "
                                     f"(lead {model.short(lead)})", "", [("op", op)])
            # the hub branch has its own small rule set: run it as the hook would
            proposed = CommitData("", None, [tip], author, "", self.clock(), msg)
            hubrules.check(_TextReader({"old": text, "new": new}, view.names("teams")), proposed,
                           [(path, "old" if prev else None, "new")])
            return {path: new}, msg, {}
        self.store.write(model.HUB_REF, build, author, now=self.clock(), check=False)
        out = dict(doc)
        # a name registered before its team named it (an open MCP registration) has a
        # token its registrant holds, who is now a member in the team's closed rooms
        held = [m for m in members if m not in (old or {}).get("members", ())
                and tokens.has(self.path, m)]
        if held:
            out["tokens_held"] = held
        if old is not None and old["lead"] != lead and author == old["lead"]:
            out["handed_over_in"] = self._hand_over(name, old["lead"], lead)
        return out

    def _hand_over(self, team: str, by: str, lead: str, rooms=None) -> list[str]:
        """After a hand-over in the registry, the team's entry in every active room
        goes to the new lead `lead`: written by `by`, the lead it replaced (its own
        entries), or the new lead (every entry still naming another). Else the old
        lead kept its powers there (settings, reviews, sign-offs) until somebody
        thought of gitdrop room join in each. Run again, it finishes one that was
        stopped partway. (Archived rooms are run by the registry's leads already,
        and restore records them.) The operator may write any."""
        done = []
        for name in self.store.rooms(model.ROOM_PREFIX) if rooms is None else rooms:
            try:
                view = self.store.view(name)
                was = view.room["leads"].get(team)
                if not was or was == lead or (by not in (was, lead)
                                              and not model.is_hub_identity(by)):
                    continue
                self.room(name).update_room(
                    by, "room-join", f"team {team}'s lead in {name} is now {model.short(lead)}",
                    leads=lambda d: dict(d["leads"], **{team: lead}))
                done.append(name)
            except GitdropError as e:   # that room keeps the old lead: said, not fatal
                sys.stderr.write(f"gitdrop: {name} still names another lead of team {team} "
                                 f"({e.reason}); {lead} takes it over there with gitdrop "
                                 f"--room {name} room join {name} --team {team}\n")
        return done

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

    def where_known(self, agent_id: str) -> str:
        """Where `agent_id` is someone's on this hub ("" if nowhere): its team's entry
        in the registry (lead or member), or a room, active or archived, it is
        registered in. A token for such a name is the hub owner's to mint: tokens are
        hub-wide, and one given to whoever registered a lead's name first in another
        room acted as that lead everywhere."""
        team = model.split_agent(agent_id)[0]
        t = self.team(team, missing_ok=True) if model.is_name(team) else None
        if t is not None and t["lead"] == agent_id:
            return f"the lead of team {team} in the team registry"
        if t is not None and agent_id in t["members"]:
            return f"a member of team {team} in the team registry"
        for prefix in (model.ROOM_PREFIX, model.ARCHIVE_PREFIX):
            for name in self.store.rooms(prefix):
                try:
                    tip = self.store.tip(prefix + name)
                    c = self._room_commit(prefix + name, tip)
                    if RoomView(self.store.reader, c.tree, tip, name).agent(agent_id):
                        return f"room {name}"
                except GitdropError:
                    continue   # a damaged room names nobody (repair says so)
        return ""

    # --- rooms: who may act on them ----------------------------------------------------
    def _locate(self, room: str) -> tuple[str, str, RoomView]:
        """(ref, tip, view) of an active or archived room."""
        for ref in (self.store.room_ref(room), model.ARCHIVE_PREFIX + room):
            tip = self.store.tip(ref)
            if tip:
                c = self._room_commit(ref, tip)
                return ref, tip, RoomView(self.store.reader, c.tree, tip, room)
        raise NotFound(f"no room {room!r} in this hub", "gitdrop room list --all")

    def _room_commit(self, ref: str, tip: str):
        """The commit a room's ref names; Damaged (exit 8) when it names none: a blob,
        tree or tag set there by hand (git lets refs/archive/ hold any object), or a
        commit that is missing. Every face read it as a commit: a traceback."""
        try:
            return self.store.reader.commit(tip)
        except KeyError:
            got = getattr(self.store, "repo", None)
            obj = got.get(tip) if got is not None else None
            what = f"a {obj.type_str}, not a commit" if obj is not None else \
                "no commit of this hub (missing, or an object it needs is)"
            raise Damaged(f"{ref} names {tip[:12]}, {what}: room "
                          f"{ref.rpartition('/')[2]!r} cannot be read",
                          self.repair_fix(ref)) from None

    def repair_fix(self, ref: str) -> str:
        """What to run when `ref` names no commit."""
        if getattr(self, "url", ""):   # a mirror holds what the hub has: mended there
            return f"ask the hub's owner to run gitdrop repair on the hub's machine ({ref})"
        return (f"see what can be put back: gitdrop --hub {self.path} repair (it names the "
                f"last commit gitdrop logged for {ref}; --apply puts it back)")

    def leads_of(self, view: RoomView) -> list[str]:
        """Who acts for a room (the same answer the rules give for room.toml): its
        recorded leads, each as the team registry has it now."""
        return rules.room_leads(view, self.store.teams())

    def _actor(self, view: RoomView, by: str) -> str:
        """`by` as team/name: a short name resolves among the room's agents and leads."""
        if not by or "/" in by:
            return by
        ids = view.agent_ids() + list(view.room["leads"].values())
        return by_short_name(by, ids) or by

    def _require_lead(self, view: RoomView, by: str, what: str, leads=None) -> str:
        by = self._actor(view, by)
        leads = self.leads_of(view) if leads is None else leads
        if by not in leads and not model.is_hub_identity(by):
            whose = f"its leads ({', '.join(leads)}) and the hub's operator" if leads else \
                "the hub's operator" + (" (an open room: any team's lead may join it)"
                                        if view.room["open"] else "")
            raise Refusal("lead-only", f"{by or 'nobody'} may not {what} room {view.name!r}: "
                          f"that is for {whose}", f"ask {' or '.join(leads)}" if leads else
                          f"ask the hub's operator (gitdrop --as hub/admin room {what} "
                          f"{view.name}, on the hub's machine)")
        return by

    # --- rooms: lifecycle ------------------------------------------------------------
    def create_room(self, creator: str, name: str, teams=(), open_: bool = False,
                    settings: dict | None = None) -> dict:
        if not model.is_name(name):
            raise UsageError(f"bad room name {name!r}", "letters, digits, '.', '_', '-'")
        if self.store.tip(self.store.room_ref(name)) or \
                self.store.tip(model.ARCHIVE_PREFIX + name):
            raise Refusal("format", f"room {name!r} already exists", "pick another name")
        # One room made at a time on this machine: Lobby and lobby made at once each
        # passed the check for the other.
        with writequeue.Turn(self.store.path, writequeue.NEW_ROOMS):
            hubrules.check_room_case(self.store.path, name)
            return self._create_room(creator, name, teams, open_, settings)

    def _create_room(self, creator, name, teams, open_, settings) -> dict:
        teams = list(dict.fromkeys(t for t in teams if t))
        leads = {}
        for t in teams:  # a member team has a lead: it signs, reviews and gets every message
            leads[t] = self.team(t)["lead"]
        for k, v in (settings or {}).items():
            if k not in model.DEFAULT_SETTINGS or not isinstance(v, int) or v < 0:
                raise UsageError(f"setting {k}={v!r} is unknown or not a whole number >= 0",
                                 "settings: " + ", ".join(model.DEFAULT_SETTINGS))
        doc = model.with_defaults("room", {"name": name, "created": self.clock(),
                                           "open": open_ or not teams, "teams": teams,
                                           "leads": leads, "settings": dict(settings or {}),
                                           "layout": model.LAYOUT})

        def build(view, tip):
            if tip:
                raise Refusal("format", f"room {name!r} already exists", "pick another name")
            return ({model.ROOM_FILE: render_file("room", doc)},
                    fmt.format_message(f"room {name} created by {model.short(creator)}"
                                       + (f" for {', '.join(teams)}" if teams else ""), "",
                                       [("op", "room-create")]), {})
        oid, _ = self.store.write(self.store.room_ref(name), build, creator, now=self.clock())
        return {"room": name, "commit": oid, "teams": teams, "open": doc["open"],
                "leads": leads}

    def join_room(self, team: str, room: str, by: str = "") -> dict:
        """Add a team (with its lead from the registry) to a room: by a lead of the room,
        or, in an open room, by the team's own lead. Also re-syncs a changed lead."""
        t = self.team(team)
        r = self.room(room)
        view = r.view()
        by = self._actor(view, by) or t["lead"]
        if "/" not in by:
            by = f"{team}/{by}"
        if team in view.room["teams"]:
            if view.room["leads"].get(team) == t["lead"]:
                return {"room": room, "team": team, "joined": False, "lead": t["lead"]}
            r.update_room(by, "room-join", f"team {team}'s lead in {room} is now "
                          f"{model.short(t['lead'])}",
                          leads=lambda d: dict(d["leads"], **{team: t["lead"]}))
            return {"room": room, "team": team, "joined": False, "lead": t["lead"],
                    "lead_changed": True}
        r.update_room(by, "room-join", f"team {team} joined {room}",
                      teams=lambda d: d["teams"] + [team],
                      leads=lambda d: dict(d["leads"], **{team: t["lead"]}))
        return {"room": room, "team": team, "joined": True, "lead": t["lead"]}

    def leave_room(self, team: str, room: str, by: str = "") -> dict:
        r = self.room(room)
        view = r.view()
        if team not in view.room["teams"]:
            raise NotFound(f"team {team!r} is not in room {room!r}",
                           f"its teams: {', '.join(view.room['teams']) or 'none'}")
        by = self._actor(view, by) or view.room["leads"].get(team, "")
        r.update_room(by, "room-leave", f"team {team} left {room}",
                      teams=lambda d: [x for x in d["teams"] if x != team],
                      leads=lambda d: {k: v for k, v in d["leads"].items() if k != team})
        return {"room": room, "team": team, "left": True}

    def room_settings(self, room: str, by: str = "", changes: dict | None = None) -> dict:
        """A room's settings (defaults with its overrides); with `changes`, set them
        first (a lead of the room, or the operator: the rules decide)."""
        r = self.room(room)
        if changes:
            bad = [f"{k}={v!r}" for k, v in changes.items() if k not in model.DEFAULT_SETTINGS
                   or not isinstance(v, int) or isinstance(v, bool) or v < 0]
            if bad:
                raise UsageError(f"setting {', '.join(bad)} is unknown or not a whole number "
                                 ">= 0", "settings: " + ", ".join(model.DEFAULT_SETTINGS))
            by = self._actor(r.view(), by) if by else OPERATOR
            r.update_room(by, "room-settings", f"room {room} settings: " + ", ".join(
                f"{k}={v}" for k, v in changes.items()),
                settings=lambda d: dict(d["settings"], **changes))
        view = r.view()
        return {"room": room, "settings": view.settings,
                "overrides": dict(view.room["settings"]), "defaults": dict(model.DEFAULT_SETTINGS)}

    def pin_room(self, room: str, by: str, pinned: bool = True) -> dict:
        """Pin: never archived for idleness, never expired. A lead of the room."""
        ref, tip, view = self._locate(room)
        word = "pinned" if pinned else "unpinned"
        if ref.startswith(model.ARCHIVE_PREFIX):
            by = self._require_lead(view, by, "pin")
            with self._moving():   # not between a reaper's check and its destroy
                if not self.store.tip(ref):
                    raise NotFound(f"room {room!r} is gone (destroyed as it was pinned)",
                                   "gitdrop room list --all")
                self._hub_commit(by, lambda hv: {self._record_path(room): fmt.dumps_toml(
                    dict(self._archive_record(room, hv), pinned=pinned))},
                    f"archived room {room} {word} by {model.short(by)}", "room-pin",
                    room=room)
        else:
            self.room(room).update_room(self._actor(view, by), "room-pin",
                                        f"room {room} {word}", pinned=pinned)
        return {"room": room, "pinned": pinned}

    def archive_room(self, room: str, by: str, why: str = "") -> dict:
        """Move rooms/<room> to refs/archive/rooms/<room> (history kept, readable,
        restorable) and record it on the hub branch. A lead of the room."""
        ref, tip, view = self._locate(room)
        if ref != self.store.room_ref(room):
            if self._archive_record(room).get("missing"):
                # the archive a killed process began (its move finished since): the
                # same call finishes it, recording it as it would have
                by = self._require_lead(view, by, "archive")
                return self._archive(room, by, why, self.clock(), moved=tip)
            raise Refusal("format", f"room {room!r} is already archived",
                          f"restore it with gitdrop room restore {room}")
        by = self._require_lead(view, by, "archive")
        return self._archive(room, by, why, self.clock())

    def _archive(self, room: str, by: str, why: str, now: int, moved: str = "") -> dict:
        ref = self.store.room_ref(room)
        tip = moved or self._move(ref, model.ARCHIVE_PREFIX + room, f"archived by {by}")
        view = self._view_at(room, tip)
        pinned = view.room["pinned"]
        # said to whoever archives: the work it stops (it comes back with a restore)
        open_tasks = sum(1 for t in taskindex.headers(view) if t["state"] in machine.OPEN
                         and t["state"] != "failed")
        gone = self._records_gone(room, keep=(f"destroy/{room}.toml",))
        record = fmt.dumps_toml({"name": room, "archived": now, "tip": tip, "pinned": pinned})
        self._hub_commit(by, lambda hv: dict(gone(hv), **{self._record_path(room): record}),
            f"room {room} archived by {model.short(by)}" + (f" ({why})" if why else ""),
            "room-archive", now=now, room=room, tip=tip)
        return {"room": room, "archived": True, "tip": tip, "pinned": pinned,
                "open_tasks": open_tasks}

    def restore_room(self, room: str, by: str) -> dict:
        ref, tip, view = self._locate(room)
        if not ref.startswith(model.ARCHIVE_PREFIX):
            if self._hub_view().text(self._record_path(room)) is None:
                raise Refusal("format", f"room {room!r} is not archived", "nothing to do")
            # the restore a killed process began (its move finished since): the same
            # call finishes it, as archive does, taking its stale record away
            by = self._require_lead(view, by, "restore")
        else:
            by = self._require_lead(view, by, "restore")
            tip = self._move(ref, self.store.room_ref(room), f"restored by {by}")
        now = self.clock()
        self._hub_commit(by, lambda hv: {self._record_path(room): None,
                                         self._restored_path(room): fmt.dumps_toml(
                                             {"name": room, "restored": now, "tip": tip})},
                         f"room {room} restored by {model.short(by)}", "room-restore",
                         now=now, room=room, tip=tip)
        # leads handed over in the registry while it was archived take their place
        # (the restorer writes what is its own to write; the rest are the registry's
        # leads' to record, by the team command run again or room join, and run the
        # room meanwhile all the same)
        teams = self.store.teams() or {}
        for team, was in view.room["leads"].items():
            if teams.get(team) and teams[team] != was:
                self._hand_over(team, by, teams[team], [room])
        return {"room": room, "archived": False, "tip": tip}

    def destroy_room(self, room: str, by: str, why: str = "") -> dict:
        """Hard delete (active or archived), agreed by the lead of every member team:
        each lead's call records their consent; the last one deletes the ref. In a
        room without team leads, one of its leads decides."""
        path = f"destroy/{room}.toml"
        try:
            ref, tip, view = self._locate(room)
        except NotFound:
            return self._destroyed_before(room, by)
        by = self.may_destroy(view, by)
        leads = self.destroyers(view)
        text = self._hub_view().text(path)
        was = fmt.loads_toml(text) if text else {}
        # Consents count only for the room they were given for, among the leads they
        # were given among: the operator agreed to wait for juno, juno took core out,
        # and a stranger's new team joined and destroyed the room with one call; a
        # destroy killed before its record went left consents that destroyed the
        # next room of the name with one call.
        had = set(was.get("consents", [])) if was.get("leads") == leads and \
            was.get("created") == view.room["created"] else set()
        agreed = sorted(had | {by})
        said = {OPERATOR if model.is_hub_identity(a) else a for a in agreed}   # any hub/*
        waiting = [x for x in leads if x not in said]
        if waiting:
            self._hub_commit(by, {path: fmt.dumps_toml({"name": room, "consents": agreed,
                                                        "leads": leads,
                                                        "created": view.room["created"]})},
                             f"{model.short(by)} agrees to destroy room {room} (waiting for "
                             f"{', '.join(waiting)})", "room-destroy-consent", room=room)
            return {"room": room, "destroyed": False, "tip": tip, "consents": agreed,
                    "waiting_for": waiting}
        return self._destroy(room, by, why, self.clock())

    def _destroyed_before(self, room: str, by: str) -> dict:
        """`room destroy` of a room that is gone: a destroy killed after the room went
        and before its hub commit left its records; the same call takes them away
        (else the consents counted for the next room of the name)."""
        if not self._records_gone(room)(self._hub_view()):
            raise NotFound(f"no room {room!r} in this hub", "gitdrop room list --all")
        self._hub_commit(by or OPERATOR, self._records_gone(room),
                         f"room {room} destroyed (its records, left by a destroy that was "
                         "stopped, taken away)", "room-destroy", room=room)
        return {"room": room, "destroyed": True, "tip": "", "finished": True}

    def _records_gone(self, room: str, keep=()):
        """What takes a room's records on the hub branch away (its archive, restore and
        destroy records, but those in `keep`), as files for _hub_commit."""
        paths = (self._record_path(room), self._restored_path(room), f"destroy/{room}.toml")
        return lambda hv: {p: None for p in paths if p not in keep and hv.text(p) is not None}

    def destroyers(self, view: RoomView) -> list[str]:
        """Whose consent destroys a room: the lead of every member team (as the team
        registry has it now), and in an open room the operator too (any team's lead
        may join one: a stranger's new team, its only recorded lead, destroyed it and
        its history alone)."""
        leads = sorted(set(rules.leads_now(view.room, self.store.teams()).values()))
        return leads + [OPERATOR] if view.room["open"] else leads

    def may_destroy(self, view: RoomView, by: str) -> str:
        """`by` as team/name if its consent counts (a recorded lead, or the operator)."""
        return self._require_lead(view, by, "destroy",
                                  [x for x in self.destroyers(view) if x != OPERATOR])

    def _destroy(self, room: str, by: str, why: str, now: int, ref: str = "",
                 still=None) -> dict:
        ref = ref or self._locate(room)[0]
        tip = self._move(ref, None, f"destroyed by {by}", still=still)
        self._hub_commit(by, self._records_gone(room),
                         f"room {room} destroyed by {model.short(by)}"
                         + (f" ({why})" if why else ""), "room-destroy", now=now,
                         room=room, tip=tip)
        return {"room": room, "destroyed": True, "tip": tip}

    def _move(self, ref: str, to: str | None, why: str, tries: int = 200, still=None) -> str:
        """Move (or, with to=None, delete) a room's ref. Both refs are locked first
        and the tip is read under the lock, so no writer can slip a commit in between
        (a writer that finds the lock taken retries and then finds no room). Two refs
        never change at once, so the move is written down first (MOVE_JOURNAL): a
        process killed at any point leaves it to the next move or the next open of the
        hub, which finishes it (_finish_move). `still(tip)`, under the locks, may
        raise to call the move off (the reaper's: is the room still due)."""
        with self._moving():
            self._finish_move()
            for _ in range(tries):
                held = self._lock_refs([ref] + ([to] if to else []))
                if held is None:
                    continue
                try:
                    tip = self.store.tip(ref)
                    if not tip:
                        raise NotFound(f"no ref {ref}", "gitdrop room list --all")
                    if to and self.store.tip(to):
                        raise Refusal("format", f"{to} already exists",
                                      "destroy or restore the other one first")
                    if still is not None:
                        still(tip)
                    self._write_journal(ref, to, tip)
                    _reached("journaled")
                    self._set_refs(held, [(to, "", tip)] if to else [], [(ref, tip, "")],
                                   f"gitdrop: {why}")
                    _reached("moved")
                    os.unlink(self._journal_path())
                    return tip
                finally:
                    _release(held)
            raise Conflict(f"{ref} stayed locked; gave up after {tries} tries", "try again")

    def _journal_path(self) -> str:
        return os.path.join(self.store.path, MOVE_JOURNAL)

    @contextlib.contextmanager
    def _moving(self):
        """One move of a room's ref at a time in this hub (an flock: a killed
        mover's goes with it), so a move never finishes another that is under way."""
        from .locks import fcntl
        path = self._journal_path() + ".lock"
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | files.NOFOLLOW, 0o644)
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _write_journal(self, ref: str, to: str | None, tip: str) -> None:
        path = self._journal_path()
        files.write_whole(path, f"{ref}\n{to or ''}\n{tip}\n".encode(),
                          sync=self.store.method != "none")
        if self.store.method != "none":
            wal.fsync_path(os.path.dirname(path))

    def _finish_move(self, tries: int = 200) -> None:
        """Finish the move a killed process left in MOVE_JOURNAL (the caller holds
        _moving): the new ref is made and the old one removed; but if a writer moved
        the old ref on since (it cleared the dead mover's lock), the room stayed where
        it was, and the new ref goes instead. Run again after a kill, it does the rest."""
        path = self._journal_path()
        try:
            with open(path, encoding="ascii") as f:
                ref, to, tip = (f.read().split("\n") + ["", ""])[:3]
        except FileNotFoundError:
            return
        if not ref.startswith("refs/") or not wal.is_oid(tip) or \
                (to and not to.startswith("refs/")):
            sys.stderr.write(f"gitdrop: {path} is not a ref move ({ref[:60]!r}); set aside "
                             f"as {path}.bad\n")
            os.replace(path, path + ".bad")
            return
        for _ in range(tries):
            held = self._lock_refs([ref] + ([to] if to else []))
            if held is None:
                continue
            try:
                now_ref, now_to = self.store.tip(ref), self.store.tip(to) if to else ""
                create, remove = [], []
                if now_ref in (tip, "") and now_to in (tip, ""):   # finish it
                    if to and not now_to:
                        create.append((to, "", tip))
                    if now_ref:
                        remove.append((ref, tip, ""))
                elif to and now_to == tip:   # the old ref moved on: undo
                    remove.append((to, tip, ""))
                self._set_refs(held, create, remove, "gitdrop: a killed move finished")
                _reached("finished")
                os.unlink(path)
                return
            finally:
                _release(held)
        raise Conflict(f"{ref} stayed locked; gave up finishing its move after {tries} "
                       "tries", "try again")

    def _lock_refs(self, refs: list[str]) -> list | None:
        """Each ref locked in a libgit2 transaction of its own (so that they can be
        changed one after the other, in an order that a kill cannot make harmful): the
        (ref, transaction, flock) list, or None when one is locked by another (then
        waited for, or cleared if its owner is dead)."""
        from . import locks
        held = []
        try:
            for ref in refs:
                tx = self.store.repo.transaction()
                held.append((ref, tx, None))
                tx.lock_ref(ref)
                # libgit2 takes no flock on its lock files: this process does while
                # they are its own, so that no one takes them for a dead process's.
                held[-1] = (ref, tx, locks.hold(self.store.path, ref))
            return held
        except (pygit2.GitError, OSError):   # a writer holds the lock for a moment
            _release(held)
        for ref in refs:
            if os.path.exists(os.path.join(self.store.path, ref + ".lock")):
                wal.clear_lock(self.store.path, ref)
        time.sleep(0.002)
        return None

    def _set_refs(self, held, create, remove, message: str) -> None:
        """Make the refs of `create` and then remove those of `remove` ((ref, old,
        new) each; their locks in `held`), one transaction at a time: new refs first,
        so that a kill in between leaves the room under both names, never under none.
        Logged as one write, so that a replay after a crash repeats it in order."""
        txs = {ref: tx for ref, tx, _fd in held}
        updates = create + remove

        def apply():
            for ref, _old, new in create:
                txs[ref].set_target(ref, new, message=message)
                txs[ref].commit()
                _reached("created")
            for ref, _old, _new in remove:
                txs[ref].remove(ref)
                txs[ref].commit()
        if updates and self.store.method == "wal":
            with wal.for_hub(self.store.path).append(updates):
                apply()
        else:
            apply()

    def _view_at(self, room: str, tip: str) -> RoomView:
        return RoomView(self.store.reader, self.store.reader.commit(tip).tree, tip, room)

    @staticmethod
    def _record_path(room: str) -> str:
        return f"archive/{room}.toml"

    @staticmethod
    def _restored_path(room: str) -> str:
        return f"restored/{room}.toml"

    def _restored_at(self, room: str, hub_view: RoomView | None = None) -> int:
        """When the room was last restored (0: never since it was archived): a restore
        adds no commit to the room, so the reaper, by its last commit, archived it
        again at its next round."""
        text = (hub_view or self._hub_view()).text(self._restored_path(room))
        try:
            got = fmt.loads_toml(text).get("restored", 0) if text else 0
        except fmt.FormatError:
            return 0
        return got if isinstance(got, int) and not isinstance(got, bool) else 0

    def _archive_record(self, room: str, hub_view: RoomView | None = None) -> dict:
        """An archived room's record; without one (a crash between the ref move and
        the record) it counts as archived at its last commit and not pinned."""
        text = (hub_view or self._hub_view()).text(self._record_path(room))
        ref = model.ARCHIVE_PREFIX + room
        tip = self.store.tip(ref)
        rec = fmt.loads_toml(text) if text else None
        # one for another archive of the name (a destroy killed before its hub commit
        # left it) is not this one's: a room archived later under the name took its
        # date and was destroyed at the next reap
        if rec is not None and (not rec.get("tip") or not tip or rec["tip"] == tip):
            return rec
        when = self._room_commit(ref, tip).time if tip else 0
        return {"name": room, "archived": when, "tip": tip, "pinned": False, "missing": True}

    # --- rooms: reading ---------------------------------------------------------------
    def rooms(self, status: str = "active") -> list[dict]:
        """Rooms with their teams, activity and health (and, archived, their expiry)."""
        out = []
        kinds = {"active": [model.ROOM_PREFIX], "archived": [model.ARCHIVE_PREFIX],
                 "all": [model.ROOM_PREFIX, model.ARCHIVE_PREFIX]}.get(status)
        if kinds is None:
            raise UsageError(f"bad status {status!r}", "active, archived or all")
        now = self.clock()
        expiry = self.config("gitdrop.archiveExpiryDays", 90)
        hv = self._hub_view()
        for prefix in kinds:
            for name in self.store.rooms(prefix):
                try:
                    tip = self.store.tip(prefix + name)
                    c = self._room_commit(prefix + name, tip)
                    room = RoomView(self.store.reader, c.tree, tip, name).room
                except Damaged as e:
                    # A ref that names no commit (or a missing one): listed, with
                    # what is wrong and how to mend it, so a list never hides it.
                    try:
                        when = int(os.stat(os.path.join(self.path, prefix + name)).st_mtime)
                    except OSError:
                        when = 0
                    out.append({"room": name, "status": "active" if prefix ==
                                model.ROOM_PREFIX else "archived", "teams": [],
                                "open": False, "leads": {}, "pinned": False,
                                "last_activity": when, "idle_seconds": max(0, now - when),
                                "health": "damaged", "damaged": e.reason, "fix": e.fix})
                    continue
                last = c.time if prefix != model.ROOM_PREFIX else \
                    max(c.time, self._restored_at(name, hv))
                idle = now - last
                row = {"room": name, "status": "active" if prefix == model.ROOM_PREFIX
                       else "archived", "teams": room["teams"], "open": room["open"],
                       "leads": room["leads"], "pinned": room["pinned"],
                       "last_activity": last, "idle_seconds": max(0, idle),
                       "health": "busy" if idle < 3600 else "quiet" if idle < 7 * DAY
                       else "idle"}
                if prefix == model.ARCHIVE_PREFIX:
                    rec = self._archive_record(name, hv)
                    row.update(pinned=bool(rec.get("pinned")), archived_at=rec["archived"],
                               expires=None if rec.get("pinned") or expiry <= 0
                               else rec["archived"] + expiry * DAY, health="archived")
                    if rec.get("missing"):
                        row["unrecorded"] = True
                out.append(row)
        return out

    def rooms_of_team(self, team: str, status: str = "active") -> list[dict]:
        return [r for r in self.rooms(status) if team in r["teams"]]

    def room_status(self, room: str, offset: int = 0, limit: int = 0) -> dict:
        """Teams, leads, agents, open tasks, last activity and size (active or archived).
        `agents` lists the ids from `offset` on, at most `limit` (0: all);
        `agents_total` counts them all and `agents_more` those past the page."""
        offset, limit = count_arg("offset", offset), count_arg("limit", limit)
        ref, tip, view = self._locate(room)
        tasks = taskindex.headers(view)
        ids = view.agent_ids()
        page = ids[offset:offset + limit] if limit > 0 else ids[offset:]
        n = messages = 0
        for n, c in enumerate(first_parent_walk(self.store.reader, tip), 1):
            if is_message(self.store.reader, c):
                messages += 1
            if n >= 10000:
                break
        last = self.store.reader.commit(tip)
        out = {"room": room, "status": "active" if ref.startswith(model.ROOM_PREFIX)
               else "archived", "teams": view.room["teams"], "open": view.room["open"],
               "leads": view.room["leads"], "pinned": view.room["pinned"],
               "agents": page, "agents_total": len(ids), "agents_offset": offset,
               "agents_more": max(0, len(ids) - offset - len(page)),
               "open_tasks": sum(1 for t in tasks if t["state"] not in ("completed", "cancelled")),
               "tasks": len(tasks), "commits": n if n < 10000 else "10000+",
               "messages": messages, "settings": view.settings,
               "last_activity": last.time, "last": last.subject, "tip": tip}
        if out["status"] == "archived":
            out["pinned"] = bool(self._archive_record(room).get("pinned"))
        return out

    # --- upkeep --------------------------------------------------------------------------
    def reap(self, now: int | None = None, progress=None) -> dict:
        """Archive rooms idle for gitdrop.idleArchiveDays (0, the default: never) and
        destroy archives older than gitdrop.archiveExpiryDays (default 90; 0: never),
        sparing pinned rooms. Each act is a commit on the hub branch by hub/reaper.
        First, in every active room, tasks whose claim lease has expired (by the
        hub's clock, whatever `now` says) are reaped by hub/reaper: a `reap` move
        on the room's branch. `progress(done, total)` hears of each room judged.
        A `now` ahead of the hub's clock is a dry run: what would be archived and
        destroyed then, with nothing done (dry_run). Acting on it, a milliseconds
        timestamp given for seconds destroyed every archive at once."""
        clock = self.clock()
        dry = now is not None and now > clock
        reaped = [] if dry else self.reap_tasks()
        now = clock if now is None else now
        idle_days = self.config("gitdrop.idleArchiveDays", 0)
        expiry_days = self.config("gitdrop.archiveExpiryDays", 90)
        spared: list[str] = []

        judged = [0, 0]

        def due(status, days, since, act, why):
            done = []
            rooms = self.rooms(status) if days > 0 else []
            judged[1] += len(rooms)
            for r in rooms:
                judged[0] += 1
                if progress is not None:
                    progress(judged[0], judged[1])
                if r["health"] == "damaged":   # gitdrop repair's, not the reaper's
                    continue
                if r.get("unrecorded"):
                    # archived by a process killed before it wrote the record: when,
                    # and whether pinned, is not known, so its expiry runs from now
                    # (from its last commit, a long idle room went at the next reap)
                    if not dry:
                        self._archive(r["room"], REAPER, "found archived without its "
                                      "record: its expiry runs from now", clock,
                                      moved=self.store.tip(model.ARCHIVE_PREFIX + r["room"]))
                    continue
                if now - r[since] < days * DAY:
                    continue
                if r["pinned"]:
                    spared.append(r["room"])
                    continue
                if not dry:
                    try:
                        act(r["room"], why)
                    except _NotDue:   # pinned, written to or restored since the list
                        continue
                    except (NotFound, Conflict, Damaged) as e:   # another reap's, say
                        sys.stderr.write(f"gitdrop: reap left room {r['room']} ({e.reason})\n")
                        continue
                done.append(r["room"])
            return done

        def archive(name, why):
            ref = self.store.room_ref(name)

            def still(tip):   # under the room's lock: nobody writes it meanwhile
                last = max(self._room_commit(ref, tip).time, self._restored_at(name))
                if self._view_at(name, tip).room["pinned"] or now - last < idle_days * DAY:
                    raise _NotDue()
            # dated by the hub's clock: a --now in the past made records the next
            # reap took for long expired, and destroyed
            self._archive(name, REAPER, why, clock,
                          moved=self._move(ref, model.ARCHIVE_PREFIX + name,
                                           f"archived by {REAPER}", still=still))

        def destroy(name, why):
            def still(tip):   # an archive still, this one, unpinned and expired
                rec = self._archive_record(name)
                # (a record of another archive of the name counts as missing)
                if rec.get("pinned") or rec.get("missing") or \
                        now - rec["archived"] < expiry_days * DAY:
                    raise _NotDue()
            self._destroy(name, REAPER, why, clock, ref=model.ARCHIVE_PREFIX + name,
                          still=still)
        archived = due("active", idle_days, "last_activity", archive,
                       f"idle over {idle_days} days")
        destroyed = due("archived", expiry_days, "archived_at", destroy,
                        f"archived over {expiry_days} days")
        return {"archived": archived, "destroyed": destroyed, "spared": spared, "now": now,
                "reaped": reaped, "dry_run": dry, "packed": 0 if dry else self.pack(),
                "swept": 0 if dry else self.sweep_room_files(),
                "idle_archive_days": idle_days, "archive_expiry_days": expiry_days}

    def sweep_room_files(self) -> int:
        """Remove the files gitdrop keeps beside git for rooms that are gone (neither
        active nor archived): each room's turn, request slots and commit briefs
        (gitdrop/queue/) and its task index (gitdrop/tasks/). Nothing removed them: a
        hub that had seen 200 rooms come and go kept 1,000 files, 600 MB to a copy that
        does not keep sparse files. A room's queue files go only while nobody holds
        its turn, and under it; the number of files removed."""
        import fcntl
        gone = 0
        base = os.path.join(self.path, "gitdrop")

        def here(room: str) -> bool:
            return bool(self.store.tip(model.ROOM_PREFIX + room) or
                        self.store.tip(model.ARCHIVE_PREFIX + room))
        queue = os.path.join(base, "queue")
        try:
            names = os.listdir(queue)
        except OSError:
            names = []
        prefix = model.ROOM_PREFIX.replace("/", "%")
        for name in names:
            room = name[len(prefix):]
            if not name.startswith(prefix) or name.endswith((".slots", ".briefs")) or \
                    not model.is_name(room) or here(room):
                continue   # (a room's turn file: its slots and briefs go with it)
            turn = os.path.join(queue, name)
            writequeue.forget_room(self.path, model.ROOM_PREFIX + room)
            try:
                fd = os.open(turn, os.O_RDWR | files.NOFOLLOW)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)   # nobody writes it now
                if here(room):   # made meanwhile (its first write came and went)
                    continue
                for extra in (".slots", ".briefs", ""):
                    try:
                        os.unlink(turn + extra)
                        gone += 1
                    except FileNotFoundError:
                        pass
            except OSError:
                pass
            finally:
                os.close(fd)
        tasks = os.path.join(base, "tasks")
        try:
            names = os.listdir(tasks)
        except OSError:
            names = []
        for name in names:   # derived from the room's tree: read again if ever needed
            room, dot, ext = name.rpartition(".")
            if dot and ext in ("idx", "ready") and model.is_name(room) and not here(room):
                try:
                    os.unlink(os.path.join(tasks, name))
                    gone += 1
                except OSError:
                    pass
        return gone

    def pack(self, most: int = PACK_LOOSE) -> int:
        """Pack the hub's objects once about `most` are loose (git gc --auto, in the
        foreground); the loose objects there were, about, or 0 if too few. Every
        write leaves loose objects and git's own gc is off on a hub (a push would run
        it): 440,000 of them took 1.8 GB and made verify five times slower. Safe while
        the hub is live: git packs before it deletes, and prunes only what nothing
        reaches and is two weeks old."""
        try:   # as git estimates it: one of the 256 fan-out directories
            loose = 256 * sum(1 for n in os.listdir(os.path.join(self.path, "objects", "17"))
                              if len(n) == 38)
        except OSError:
            return 0
        if loose < most:
            return 0
        import subprocess
        # refs stay loose (gc.packRefs): a logged delete the log's replay repeats after a
        # crash removes a ref's file, not a line of packed-refs
        p = subprocess.run(["git", "--git-dir", self.path, "-c", f"gc.auto={most}",
                            "-c", "gc.autoDetach=false", "-c", "gc.packRefs=false",
                            "gc", "--auto", "--quiet"],
                           capture_output=True, text=True)
        if p.returncode != 0:
            sys.stderr.write(f"gitdrop: packing the hub's objects failed "
                             f"({p.stderr.strip()[-300:]}); the next reap tries again\n")
            return 0
        return loose

    def reap_tasks(self) -> list[dict]:
        """Reap the tasks whose lease has expired, in every active room, as
        hub/reaper: [{room, task, state, assignee, ...}]. A room that cannot be
        read is skipped (and told on stderr); the next round tries it again."""
        out = []
        for name in self.store.rooms(model.ROOM_PREFIX):
            try:
                for r in Room(self.store, name, self.clock).reap_leases(REAPER):
                    out.append(dict(r, room=name))
            except (GitdropError, KeyError, ValueError, pygit2.GitError) as e:
                # one damaged ref (naming a tree, say) stopped every round of the reaper
                sys.stderr.write(f"gitdrop: reaping tasks in {name} failed ({e})\n")
        return out

    def reap_every(self, seconds: float) -> "threading.Event":
        """Reap in a background thread every `seconds` (the server runs this);
        set the returned event to stop it. A failed round is retried next time."""
        import threading
        stop = threading.Event()

        def loop():
            own = Hub(self.path, clock=self.clock)  # libgit2 repositories are per thread
            while not stop.wait(seconds):
                try:
                    own.reap()
                except Exception as e:  # a round that failed must not end the loop
                    sys.stderr.write(f"gitdrop: reap failed ({type(e).__name__}: {e})\n")
        threading.Thread(target=loop, name="gitdrop-reaper", daemon=True).start()
        return stop

    def verify(self, room: str, archived: bool = False, progress=None) -> list:
        """Re-check a whole room from its first commit (no clock rule); `progress(done,
        total)` hears of each commit checked."""
        from .verify import check_commits
        model.check_name("room", room)
        ref = (model.ARCHIVE_PREFIX if archived else model.ROOM_PREFIX) + room
        tip = self.store.tip(ref)
        if not tip:
            other = self.store.tip(model.ROOM_PREFIX + room if archived
                                   else model.ARCHIVE_PREFIX + room)
            raise NotFound(f"no {'archived ' if archived else ''}room {room!r}",
                           (f"it is {'active' if archived else 'archived'}: gitdrop verify "
                            f"{room}{'' if archived else ' --archived'}") if other else
                           "list them with gitdrop room list --all")
        self._room_commit(ref, tip)
        return check_commits(self.store.reader, model.ROOM_PREFIX + room, "", tip,
                             progress=progress, hub=self.store.tip(model.HUB_REF) or "")


class _TextReader:
    """Lets the hub rules read proposed text as if it were blobs."""

    def __init__(self, texts, team_files=()):
        self.texts, self.team_files = texts, list(team_files)

    def blob_text(self, key):
        return self.texts.get(key) if key else None


def no_hub(path: str) -> NotFound:
    what = "is not a gitdrop hub" if os.path.exists(path) else "does not exist"
    try:
        path.encode()
        named = True
    except UnicodeEncodeError:   # init refuses such a path: do not suggest it
        named = False
    return NotFound(f"no such hub: {path} {what}",
                    f"point --hub (or GITDROP_HUB) at a hub, or create one: gitdrop init {path}"
                    if what == "does not exist" and named else
                    "point --hub (or GITDROP_HUB) at a hub, or create one in a new "
                    "directory: gitdrop init PATH")
