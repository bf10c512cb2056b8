"""Instruction files: a task body that a worker with no context can start from.

A brief is the task's Markdown body with these sections (`## ` headings, in any
order; Objective and Acceptance criteria required):

    ## Objective            what done looks like, in a sentence or two
    ## Requirements         constraints that hold throughout
    ## Context              files to read first (one per list item)
    ## Steps                the way there, numbered
    ## Acceptance criteria  checkboxes (- [ ] ...) the reviewer ticks

A task whose header says `brief = true` must have that shape (rule task-brief).
"""

import os
import re

SECTIONS = ("Objective", "Requirements", "Context", "Steps", "Acceptance criteria")
REQUIRED = ("Objective", "Acceptance criteria")
# Linear on any body: "(.+?) *$" and a leading "\s*" (which spans blank lines) took
# seconds, then minutes, on a 64 KB body of spaces or newlines, in the hook.
_HEADING = re.compile(r"^## +(.*)$", re.M)
_BOX = re.compile(r"^[ \t]*[-*] \[( |x|X)\] +(.+)$", re.M)
_ITEM = re.compile(r"^[ \t]*[-*] +(.+)$", re.M)


def sections(body: str) -> dict[str, str]:
    """{heading: text} of the body's `## ` sections (text before the first: "")."""
    out, marks = {}, list(_HEADING.finditer(body))
    if marks and marks[0].start() > 0:
        out[""] = body[:marks[0].start()].strip()
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(body)
        out[m.group(1).strip()] = body[m.end():end].strip()
    return out


def checks(body: str) -> list[tuple[bool, str]]:
    """The acceptance criteria: (ticked, text) per checkbox."""
    text = sections(body).get("Acceptance criteria", "")
    return [(m.group(1) in "xX", m.group(2).strip()) for m in _BOX.finditer(text)]


def problem(body: str) -> str:
    """What keeps `body` from being a brief ("" if nothing)."""
    got = sections(body)
    unknown = [h for h in got if h and h not in SECTIONS]
    if unknown:
        return (f"unknown section {unknown[0]!r}; a brief has " + ", ".join(SECTIONS))
    missing = [h for h in REQUIRED if not got.get(h)]
    if missing:
        return f"the brief has no {missing[0]} section (or it is empty)"
    if not checks(body):
        return "the acceptance criteria are not checkboxes (- [ ] a criterion)"
    return ""


def context_files(body: str) -> list[str]:
    """The files the Context section says to read first (list items)."""
    text = sections(body).get("Context", "")
    return [re.sub(r"^`|`$", "", m.group(1).strip()) for m in _ITEM.finditer(text)]


def template(name: str) -> str:
    """A brief to start from: templates/briefs/NAME.md, or a file path."""
    from .errors import NotFound
    if os.path.isfile(name):
        with open(name, encoding="utf-8") as f:
            return f.read()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for base in (os.path.join(here, "templates", "briefs"),
                 os.path.join(os.path.dirname(__file__), "_templates", "briefs")):
        path = os.path.join(base, name + ".md")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                return f.read()
    names = sorted(n[:-3] for base in (os.path.join(here, "templates", "briefs"),)
                   if os.path.isdir(base) for n in os.listdir(base) if n.endswith(".md"))
    raise NotFound(f"no brief template {name!r}", "templates: " + (", ".join(names) or "none"))


def render(body: str) -> str:
    """The brief for a terminal: its sections, and the criteria ticked so far."""
    got, lines = sections(body), []
    for h in SECTIONS:
        if got.get(h):
            lines.append(h.upper())
            lines.extend("  " + x for x in got[h].splitlines())
            lines.append("")
    done = checks(body)
    lines.append(f"acceptance: {sum(t for t, _ in done)}/{len(done)} ticked")
    return "\n".join(lines)
