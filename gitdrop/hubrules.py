"""Rules for the hub branch: the team registry (teams/<team>.toml) and the
record of archived rooms (archive/<room>.toml)."""

from . import fmt, model
from .errors import Refusal

TEAM_FIELDS = {"name": "", "lead": "", "members": [], "created": 0}


def team_path(team: str) -> str:
    return f"teams/{team}.toml"


def check_chain(reader, commits, pusher="") -> list:
    out = []
    for c in commits:
        parent_tree = reader.commit(c.parent).tree if c.parent else None
        changes = reader.diff(parent_tree, c.tree)
        out.append((c.oid, check(reader, c, changes, pusher)))
    return out


def _refuse(rule, c, reason, fix=""):
    raise Refusal(rule, reason, fix, commit=f"{c.oid[:12] or '(new)'} \"{c.subject[:60]}\"")


def check(reader, c, changes, pusher="") -> str:
    """Hub commits: create or update a team (its lead only), or record archives."""
    op = c.op or "team-update"
    if pusher and c.author != pusher:
        _refuse("authenticated-pusher", c, f"author {c.author} but pushed as {pusher}",
                f"recommit as {pusher}")
    if not c.parents:
        return op
    if op in ("room-archive", "room-restore", "room-destroy", "room-expire"):
        _refuse("lead-only", c, "archives are recorded by the hub itself",
                "use gitdrop room archive/destroy on the hub")
    if len(changes) != 1:
        _refuse("one-operation", c, "one team per commit", "make one commit per team")
    path, old, new = changes[0]
    if not path.startswith("teams/") or not path.endswith(".toml"):
        _refuse("format", c, f"{path} is not a team file", "teams live in teams/<team>.toml")
    team = path[6:-5]
    if new is None:
        _refuse("one-operation", c, "teams are not deleted", "")
    doc = _team(c, reader.blob_text(new))
    if doc["name"] != team or not model.is_name(team):
        _refuse("format", c, f"name must be {team!r}", "")
    if not model.is_agent_id(doc["lead"]) or model.split_agent(doc["lead"])[0] != team:
        _refuse("format", c, f"the lead of team {team} must be {team}/<name>", "")
    if old is None:
        return "team-create"
    prev = _team(c, reader.blob_text(old))
    if c.author != prev["lead"]:
        _refuse("lead-only", c, f"only {prev['lead']} (the lead of team {team}) changes it",
                f"ask {prev['lead']}")
    return "team-update"


def _team(c, text):
    try:
        data = fmt.loads_toml(text or "")
    except fmt.FormatError as e:
        _refuse("format", c, str(e), "")
    out = dict(TEAM_FIELDS)
    for k, v in data.items():
        if k not in TEAM_FIELDS or type(v) is not type(TEAM_FIELDS[k]):
            _refuse("format", c, f"team field {k!r} is unknown or of the wrong type",
                    "fields: name, lead, members, created")
        out[k] = v
    return out
