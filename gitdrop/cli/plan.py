"""Agreeing before working: handshakes (a plan every target acks before GO),
contracts (the interfaces agents share) and the room's shared context."""

import sys
from typing import Annotated, Optional

import typer

from .base import Scope, ago, command, paint, read_text, short_id, split_list, sub_app, table
from ..errors import UsageError

handshake_app = sub_app("handshake", "Handshakes: a lead's plan that every target acks; "
                        "tasks bound to it start only at GO.")
contract_app = sub_app("contract", "Contracts: named interfaces, versioned, changed only by "
                       "their owner (or a lead).")
context_app = sub_app("context", "Shared context: small key/value notes for the whole room.")


# --- handshakes --------------------------------------------------------------

@command(handshake_app, "start")
def hs_start(s: Scope,
             plan: Annotated[Optional[str], typer.Option("--plan", help="The plan.",
                                                         show_default=False)] = None,
             plan_file: Annotated[Optional[str], typer.Option(
                 "--plan-file", help="Read the plan from a file ('-': stdin).",
                 show_default=False)] = None,
             to: Annotated[Optional[list[str]], typer.Option(
                 "--to", help="Who must ack (repeat; default: everyone else here).")] = None):
    """Start a handshake (leads only); prints its id."""
    text = read_text(plan, plan_file, "plan")
    if not text.strip():
        raise UsageError("a handshake needs a plan", "give --plan TEXT or --plan-file F")
    r = s.room.start_handshake(s.agent, text, split_list(to))
    s.note(f"handshake {r['id']} started; waiting for {', '.join(r['targets'])} "
           f"[{short_id(r['commit'])}]")
    for hint in r.get("hints", []):   # GO waits for every target's ack
        s.note(f"note: {hint}")
    s.emit(r, str(r["id"]))


@command(handshake_app, "ack")
def hs_ack(s: Scope, hid: Annotated[int, typer.Argument(help="The handshake's id.", metavar="ID")]):
    """Acknowledge a plan you were asked to agree to (once)."""
    r = s.room.ack_handshake(s.agent, hid)
    status = paint("GO", "green") if r["status"] == "go" else "pending"
    s.emit(r, f"handshake {hid}: acked ({status}) [{short_id(r['commit'])}]")


@command(handshake_app, "status")
def hs_status(s: Scope, hid: Annotated[Optional[int], typer.Argument(
        help="The handshake's id (default: all of them).", metavar="ID",
        show_default=False)] = None):
    """Who has acked and who has not; GO when every target has."""
    if hid is None:
        hs = s.room.handshakes()

        def show_all():
            if not hs:
                print(f"no handshakes in {s.room_name}")
                return
            table(["id", "status", "by", "acked", "waiting for"],
                  [(h["id"], h["status"], h["initiator"], ", ".join(h["acked"]) or "-",
                    ", ".join(h["pending"]) or "-") for h in hs])
        s.emit({"room": s.room_name, "handshakes": hs}, show_all)
        return
    h = s.room.handshake(hid)

    def show():
        status = paint("GO", "green") if h["status"] == "go" else paint(h["status"], "yellow")
        print(f"handshake {h['id']} by {h['initiator']}: {status}")
        print(f"  acked:       {', '.join(h['acked']) or '-'}")
        print(f"  waiting for: {', '.join(h['pending']) or '-'}")
        print()
        print(h["plan"].rstrip("\n"))
    s.emit({"handshake": h}, show)


# --- contracts ------------------------------------------------------------------

@command(contract_app, "declare")
def c_declare(s: Scope,
              name: Annotated[str, typer.Argument(help="The contract's name.")],
              text: Annotated[Optional[str], typer.Option("--text", help="The interface.",
                                                          show_default=False)] = None,
              file: Annotated[Optional[str], typer.Option(
                  "--file", help="Read the interface from a file ('-': stdin).",
                  show_default=False)] = None,
              kind: Annotated[str, typer.Option(
                  "--kind", help="function, dom_id, css_class, file_path, api_endpoint, event, "
                  "schema or other (default: other; a new version keeps it).",
                  show_default=False)] = "",
              project: Annotated[str, typer.Option("--project")] = ""):
    """Declare a contract, or its next version (owner or lead only)."""
    spec = read_text(text, file, "interface")
    r = s.room.declare_contract(s.agent, name, spec, kind=kind, project=project)
    s.emit(r, f"contract {name} v{r['version']} (owner {r['owner']}) [{short_id(r['commit'])}]")


@command(contract_app, "list")
def c_list(s: Scope,
           owner: Annotated[str, typer.Option("--owner")] = "",
           kind: Annotated[str, typer.Option("--kind")] = "",
           project: Annotated[str, typer.Option("--project")] = ""):
    """The room's contracts (names, owners, versions; not their text)."""
    cs = s.room.contracts(project=project, owner=owner, kind=kind)

    def show():
        if not cs:
            print(f"no contracts in {s.room_name}")
            return
        table(["name", "kind", "version", "owner", "updated"],
              [(c["name"], c["kind"], c["version"], c["owner"], ago(c["updated"])) for c in cs])
    s.emit({"room": s.room_name, "contracts": cs}, show)


@command(contract_app, "show")
def c_show(s: Scope, name: Annotated[str, typer.Argument(help="The contract's name.")]):
    """One contract: its header, then the interface."""
    c = s.room.contract(name)

    def show():
        print(f"contract {c['name']} v{c['version']} ({c['kind']}), owner {c['owner']}")
        print()
        print(c["spec"].rstrip("\n"))
    s.emit({"contract": c}, show)


# --- context ----------------------------------------------------------------------

@command(context_app, "set")
def ctx_set(s: Scope,
            key: Annotated[str, typer.Argument(help="The key.")],
            value: Annotated[Optional[str], typer.Argument(
                help="The value ('-': stdin).", show_default=False)] = None,
            clear: Annotated[bool, typer.Option("--clear", help="Remove the key.")] = False):
    """Set (or --clear) a piece of shared context."""
    if clear == (value is not None):
        raise UsageError("give a VALUE, or --clear", "gitdrop context set KEY VALUE")
    if value == "-":
        value = sys.stdin.read()
    r = s.room.set_context(s.agent, key, None if clear else value)
    s.emit(r, f"context {key} {'cleared' if clear else 'set'} [{short_id(r['commit'])}]")


@command(context_app, "get")
def ctx_get(s: Scope, key: Annotated[Optional[str], typer.Argument(
        help="The key (default: every key).", show_default=False)] = None):
    """Read shared context: one value as is, or every key with its first line."""
    ctx = s.room.context(key or "")

    def show():
        if key:
            print(ctx[key])
            return
        if not ctx:
            print(f"no context in {s.room_name}")
        for k, v in ctx.items():
            first = v.split("\n", 1)[0]
            more = " …" if "\n" in v or len(first) > 100 else ""
            print(f"{paint(k, 'bold')}: {first[:100]}{more}")
    s.emit({"room": s.room_name, "context": ctx}, show)
