"""What every store of a hub shares: naming rooms, views, and the one write loop
(build on the tip, check with the rules, write the objects, move the ref with
compare-and-swap; on a lost race rebuild and check again).

No pygit2 here: `store.Store` reaches the repository through pygit2, and
`leanstore.LeanStore` through `git cat-file` and gitdrop's own object writer, so a
short command need not pay for importing pygit2.
"""

import random
import time

from . import combine, errors, model, rules, wal, writequeue
from .errors import Conflict, GitdropError, NotFound
from .view import CommitData, RoomView, keep
from .writequeue import Turn

EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
TREE_MODE, BLOB_MODE = 0o040000, 0o100644


def identity(author: str) -> tuple[str, str]:
    """The git author name and email gitdrop writes for an agent."""
    team, name = model.split_agent(author) if "/" in author else ("", author)
    return author, (f"{name}@{team}.gitdrop" if team else f"{name}@gitdrop")


class BaseStore:
    """A hub's rooms over some object store. Subclasses give: `path`, `reader`,
    `tip(ref)`, `_writer()`, `_entries(tree)`, `_cas(ref, old, new, why, w)`,
    and, where `_writer` may return None, `_native_tree` and `_native_commit`."""

    # publish(ref, old, new), if set, is called after each local CAS: it hands the
    # commit on (remote.py pushes it to a remote hub). False: it lost a race and
    # refreshed the ref, so rebuild; raising refuses the write (it puts the ref back).
    publish = None
    _last_view = None   # ((tree, room), what a view of it read): see _one

    def room_ref(self, room: str) -> str:
        # Every face reaches a room through here: a name like ../hub or x.lock
        # must not name some other ref.
        return model.ROOM_PREFIX + model.check_name("room", room)

    def room_tip(self, room: str) -> str:
        tip = self.tip(self.room_ref(room))
        if not tip:
            raise self.no_room(room)
        return tip

    def no_room(self, room: str) -> NotFound:
        """What to say of a room that is not active: archived (a writer whose room the
        reaper archived was told to create it, which the name refuses), or none."""
        if self.tip(model.ARCHIVE_PREFIX + room):
            return NotFound(f"room {room!r} is archived", f"a lead restores it (gitdrop room "
                            f"restore {room}); its history reads with gitdrop room show {room}")
        return NotFound(f"no room {room!r} in this hub",
                        "list rooms with gitdrop room list, or create it (gitdrop room create)")

    def view(self, room: str, at: str = "") -> RoomView:
        c = self.reader.commit(self.resolve(at) if at else self.room_tip(room))
        return RoomView(self.reader, c.tree, c.oid, room)

    # --- writing ----------------------------------------------------------------
    def _tree_with(self, base: str | None, changes: dict[str, str | None], w=None) -> str:
        """A new tree: `base` with each path set to its text, or removed when None.
        With a durable.Writer `w` the objects are written by it, else natively."""
        groups: dict[str, dict] = {}
        for path, text in changes.items():
            head, sep, rest = path.partition("/")
            groups.setdefault(head, {})[rest if sep else None] = text
        if w is not None:
            return self._tree_by(w, base, groups)
        return self._native_tree(base, groups)

    def _tree_by(self, w, base: str | None, groups: dict) -> str:
        entries = self._entries(base) if base else {}
        for head, sub in groups.items():
            if None in sub:
                text = sub[None]
                if text is None:
                    entries.pop(head, None)
                else:
                    entries[head] = (head, BLOB_MODE, w.blob(text.encode()))
                continue
            existing = entries.get(head)
            sub_base = existing[2] if existing and existing[1] == TREE_MODE else None
            new_sub = self._tree_with(sub_base, sub, w)
            if new_sub == EMPTY_TREE:
                entries.pop(head, None)
            else:
                entries[head] = (head, TREE_MODE, new_sub)
        return w.tree(entries.values())

    def write(self, ref: str, build, author: str, now: int | None = None,
              check: bool = True, tries: int = 20, recipe=None):
        """Append one commit to `ref` with CAS.

        `build(view, tip)` returns (changes {path: text|None}, message, result) or
        raises a Refusal. It is called again on a rebuilt view after a lost race,
        so a check against the state (a claim of a claimed task) sees the winner.
        With a `recipe` (combine.Recipe) the write may be made by whichever writer
        of this machine has the room's turn, with its own (see gitdrop.combine).
        """
        out = self._write_all(ref, [(build, author, now)], check, tries, True, recipe)
        return out[0]

    def write_many(self, ref: str, ops, now: int | None = None, check: bool = True,
                   tries: int = 20) -> list:
        """Group commit: `ops` is [(build, author)]. Each operation becomes its own
        commit, built on and checked against the one before it; the ref moves once
        (CAS), so the durable cost is paid once. Returns, per operation, (commit,
        result) or the GitdropError that refused it (a refused operation leaves no
        commit; the others still go in). After a lost race all are rebuilt."""
        return self._write_all(ref, [(b, a, now) for b, a in ops], check, tries, False)

    def _write_all(self, ref, ops, check, tries, raise_first, recipe=None):
        try:
            with writequeue.Using(self.path, ref):   # the room's files stay open meanwhile
                return self._write_turn(ref, ops, check, tries, raise_first, recipe)
        except OSError as e:   # a full or failing disk: said as such, not a traceback
            raise errors.storage(e) or e from None

    def _write_turn(self, ref, ops, check, tries, raise_first, recipe):
        room = ref.rpartition("/")[2]
        synced = []
        began = time.monotonic()
        # Only a local hub's writers combine: a remote one's commits must be pushed.
        slots = combine.for_ref(self.path, ref) \
            if recipe is not None and check and self.publish is None else None
        mine = slots.ask(recipe.payload) if slots is not None else None
        turn, answered = Turn(self.path, ref), []
        if mine is not None:
            # What the others wrote since this process last looked, read before the
            # turn: inside it, every writer of the room would wait for that.
            self._catch_up(ref)
        try:
            if mine is not None and combine.CAN_SLEEP:
                got, mine = self._await(slots, mine, turn, ref, synced)
                if got is not None:
                    writequeue.STATS["answered"] += 1
                    return self._outcomes([got], raise_first)
            else:
                turn.__enter__()
            try:
                taken = []
                if mine is not None:
                    got = self._answered(slots.answer(mine), ref, synced)
                    if got is not None:
                        writequeue.STATS["answered"] += 1
                        return self._outcomes([got], raise_first)
                    taken = self._take(slots, ref, recipe.rebuild, answered)
                    writequeue.STATS["carried"] += len(taken)
                shared = self._catch_up(ref)
                for attempt in range(tries):
                    if attempt:  # lost a race to git itself (a push): let it finish
                        writequeue.STATS["retries"] += 1
                        time.sleep(random.uniform(0, min(0.05, 0.0005 * 2 ** attempt)))
                    # A write rebuilt after lost races (a remote hub's push races can
                    # last seconds) is dated when it is built, not when it began.
                    late = int(time.monotonic() - began)
                    start = tip = self.tip(ref)
                    if not tip and ref.startswith(model.ROOM_PREFIX) and \
                            self.tip(model.ARCHIVE_PREFIX + room):
                        # archived since the write read it (a reaper): said so, not
                        # "team t is not a member" of the empty room it built on
                        raise self.no_room(room)
                    w = self._writer()
                    if w is not None:
                        w.defer_sync = True
                        synced.append(w)
                    out, tip, why, made, walked = self._build_ops(
                        room, tip, ops + [op for _, op in taken], len(ops), check, w,
                        raise_first and not taken, shared, late)
                    if taken:
                        slots.pending([(t, combine.encode(outcome, tip))
                                       for (t, _), outcome in zip(taken, out[len(ops):])])
                    moved = tip == start or self._cas(ref, start, tip, why or "write", w)
                    if moved:
                        if tip == start or self.publish is None or self.publish(ref, start, tip):
                            writequeue.STATS["writes"] += 1
                            seq = w.unsynced if w is not None and w.unsynced is not None else -1
                            if taken:
                                slots.done([t for t, _ in taken], seq)
                                answered += [t[0] for t, _ in taken]
                            if shared is not None and made:
                                shared.add([(oid, rules._brief(self.reader, oid), walked[oid])
                                            for oid in made])
                            return self._outcomes(out[:len(ops)], raise_first)
                if taken:
                    slots.pending([(t, combine.encode(Conflict("", ""), "")) for t, _ in taken])
                    slots.done([t for t, _ in taken], -1)
                    answered += [t[0] for t, _ in taken]
            finally:
                turn.__exit__(None, None, None)
                if slots is not None and combine.CAN_SLEEP:
                    slots.wake_asking()
        finally:
            # After the turn: the next writer builds while this one's record syncs,
            # and the walk memo's lines are written (its compaction took 70-140 ms:
            # inside the turn, every writer of the room waited for it).
            for w in synced:
                if w.unsynced is not None and not writequeue.sync_later(w):
                    try:
                        w.sync()
                    except OSError as e:   # the ref moved: the write is there, unsure
                        raise errors.storage(e, landed=True) or e from None
            # The writers whose requests this turn made: their records are synced
            # now (unless a server syncs later: then they sync through their own).
            for i in answered:
                slots.wake(i)
            memo = getattr(self.reader, "_walks", None)
            if memo:
                memo.flush()
        raise Conflict(f"{ref} kept moving; gave up after {tries} tries",
                       "try again in a moment")

    def _build_ops(self, room, tip, ops, own, check, w, stop_at_refusal, shared, late=0):
        """Each of `ops` [(build, author, now)] as its own commit on the one before,
        from `tip`; the first `own` are the caller's (a fault in one of them is
        raised; in another's, it is its outcome). Returns (outcomes, new tip, the
        first op's name, commits made, {commit: walk memo entry of its check})."""
        out, why, made, walked = [], "", [], {}
        memo = getattr(self.reader, "walks", None)
        if shared is not None and memo is not None:
            # Where the last writer to check each author's send left its walk, so
            # this one starts from there (another process's entry: it saved it).
            for _, author, _ in ops:
                got = shared.walk_for(author)
                if got is not None:
                    dict.__setitem__(memo, got[0], got[1])
        for build, author, now in ops:
            at = now if now is None else now + late
            rules.WALKED.entry = None
            try:
                oid, result, op = self._one(room, tip, build, author, at, check, w)
            except (GitdropError, combine.Replayed) as e:
                out.append(e)
                if stop_at_refusal:
                    break
                continue
            except Exception as e:   # a fault in another's operation
                if len(out) < own:
                    raise
                out.append(e)
                continue
            if oid != tip:
                tip, why = oid, why or op
                made.append(oid)
                walked[oid] = rules.WALKED.entry
            out.append((oid, result))
        return out, tip, why, made, walked

    @staticmethod
    def _outcomes(out, raise_first):
        if raise_first:
            for x in out:
                if isinstance(x, BaseException):
                    raise x
        return out

    def _await(self, slots, mine, turn, ref, synced):
        """Sleep on our request's slot until another writer's turn has answered it:
        returns (outcome, None) without ever taking the turn; or until the turn is
        free: returns (None, mine) holding it (None for mine: write it yourself).
        The turn's holder wakes the slots it answered, and as it lets go, the
        first writer still asking; a holder killed wakes nobody, so sleeps are
        short and look again."""
        start = time.perf_counter()
        try:
            while True:
                seen = slots.word(mine[0])
                if slots.state(mine[0]) == combine.DONE:
                    got = self._answered(slots.answer(mine), ref, synced)
                    if got is not None:
                        return got, None
                    turn.__enter__()
                    return None, None
                if turn.try_enter():
                    return None, mine
                slots.sleep(mine[0], seen, 0.02)
        finally:
            writequeue.STATS["waited"] += time.perf_counter() - start

    def _take(self, slots, ref, rebuild, answered) -> list:
        """The requests waiting in `slots`, as (slot, (build, author, now)); one
        that cannot be rebuilt here is answered at once (its error, or "write it
        yourself"; its slot goes in `answered`, to be woken)."""
        taken, view = [], None
        for t, payload in slots.take():
            try:
                if view is None:   # one view of the tip for all: each reads agents of it
                    view = self._view_at(ref.rpartition("/")[2], self.tip(ref))
                taken.append((t, rebuild(self, ref, payload, view)))
            except GitdropError as e:
                slots.pending([(t, combine.encode(e, ""))])
                slots.done([t], -1)
                answered.append(t[0])
            except Exception:
                slots.pending([(t, {"self": True})])
                slots.done([t], -1)
                answered.append(t[0])
        return taken

    def _view_at(self, room: str, tip: str) -> RoomView:
        """The room at `tip`, reusing what the last write's view read and parsed when
        its files are the same (messages change none). Builds copy what they
        change; the requests a turn rebuilds only read it."""
        if not tip:
            return RoomView(self.reader, None, "", room)
        tc = self.reader.commit(tip)
        view = RoomView(self.reader, tc.tree, tip, room)
        last = self._last_view
        if last is not None and last[0] == (tc.tree, room):
            view._cache = last[1]
        self._last_view = ((tc.tree, room), view._cache)
        return view

    def _answered(self, got, ref, synced):
        """The outcome another writer's turn gave our request, or None (write it
        here). Its durability is awaited like our own write's (`synced`)."""
        if got is None:
            return None
        kind, answer, seq = got
        outcome = combine.decode(answer)
        if outcome is None:
            return None
        log = self._log()
        if kind == "pending":
            # Its writer was killed between answering and saying the ref moved:
            # the answer holds only if the batch's last commit is in the history.
            if not answer.get("tip") or not self._has(ref, answer["tip"]):
                return None
            seq = 1 << 62   # which record is unknown: sync them all
        if seq >= 0 and log is not None:
            synced.append(combine.Ticket(log, seq))
        return outcome

    def _catch_up(self, ref: str):
        """What the other writers of `ref` on this machine wrote since this process
        last looked, as the walks back to read cursors need it (combine.Briefs);
        returns the shared log, for this turn's own commits (None: not shared)."""
        shared = combine.briefs_for(self.path, ref) if self.publish is None else None
        if shared is not None:
            known = getattr(self.reader, "briefs", None)
            if known is None or len(known) > 50000:
                known = self.reader.briefs = {}
            shared.since(known)
        return shared

    def _has(self, ref: str, oid: str, most: int = 10000) -> bool:
        at = self.tip(ref)
        for _ in range(most):
            if not at:
                return False
            if at == oid:
                return True
            at = self.reader.commit(at).parent
        return False

    def _log(self):
        """The hub's write-ahead log, where writes go through one (else None)."""
        return wal.for_hub(self.path) if getattr(self, "method", "") == "wal" else None

    def _ctx(self, when: int) -> "rules.Ctx":
        return rules.Ctx(self.reader, when, teams=self.teams)

    def teams(self) -> dict | None:
        """The hub's team registry {team: lead} (None without a hub branch). Read once
        per tip of the hub branch: every task move asks (rules._by_leads_now)."""
        from .hubrules import registry
        tip = self.tip(model.HUB_REF)
        if not tip:
            return None
        got = getattr(self, "_teams_read", None)
        if got is None or got[0] != tip:
            got = self._teams_read = (tip, registry(self.reader, tip))
        return got[1]

    def _one(self, room, tip, build, author, now, check, w):
        """Build and check one operation on `tip`; write its objects (not the ref).
        Returns (new commit, or `tip` for an accepted no-op; result; op)."""
        if tip and w is not None:
            w.settle()   # `tip` may be the group's previous commit, not yet in files
        view = self._view_at(room, tip)
        changes, message, result = build(view, tip)
        when = int(time.time()) if now is None else now
        proposed = CommitData("", None, [tip] if tip else [], author, "", when, message)
        if changes and all(view.text(p) == t for p, t in changes.items()):
            # Nothing would change (a repeated assign, say): the rules still judge
            # the operation, but an accepted no-op writes no commit.
            if check:
                rules.check(view, proposed, [rules.Change(p, t, t) for p, t in changes.items()],
                            self._ctx(when))
            return tip, result, ""
        if check:
            chs = [rules.Change(p, view.text(p), t) for p, t in changes.items()
                   if view.text(p) != t]
            op = rules.check(view, proposed, chs, self._ctx(when))
        else:
            op = ""
        tree = self._tree_with(view.tree, changes, w) if changes else \
            (view.tree or self._tree_with(None, {}, w))
        name, email = identity(author)
        parents = [tip] if tip else []
        if w is not None:
            oid = w.commit(tree, parents, name, email, when, message)
        else:
            oid = self._native_commit(tree, parents, name, email, when, message)
        known = getattr(self.reader, "_commits", None)
        if known is not None:   # the next operation builds on it: no need to read it back
            made = CommitData(oid, tree, parents, name, email, when, message)
            keep(self.reader, oid, made)
            # What the check parsed of its message, kept: the next operations' walks
            # back ask it of this commit (a parse each, inside the room's turn).
            made._parsed, made._op, made.rcpt = proposed._parsed, proposed._op, proposed.rcpt
        return oid, result, op or "write"
