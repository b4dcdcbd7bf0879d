"""``report.md``: the comparison report as Markdown, for a terminal or a pull request.

Everything comes from ``report.json`` through :mod:`tvmfuse.comparison.tables`, the tables ``index.html``
shows too. Model-supplied text (contender, kernel and kind names, reasons) is escaped: ``|`` cannot
break a table, and ``<``, ``*``, ``_`` and friends print as themselves rather than as markup. The plots
are only in ``index.html``.
"""

from __future__ import annotations

import re

from . import tables
from .tables import Table

# What could start markup in a name: backslash, code, emphasis, strikethrough, heading-closing ``#``, entities,
# ``|`` (ends a table cell), ``<`` opening a tag or autolink, ``_`` at a word edge, ``(`` after ``]`` (a link).
SPECIAL = re.compile(r"[\\`*~#&|]|<(?=[A-Za-z/!?])|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])|(?<=\])\(")
MARKS = {"fastest": "**fastest**", "outside": "**✗ outside tolerance**", "aa": "A/A twin: noise floor"}


def text(value) -> str:
    """Plain Markdown text: punctuation that means markup backslash-escaped, newlines folded."""
    return SPECIAL.sub(lambda m: "\\" + m.group(0), " ".join(str(value).split()))


def code(value) -> str:
    """A code span (literal in GitHub and readable in a terminal); ``|`` escaped for tables."""
    value = " ".join(str(value).split())
    if not value:
        return ""
    runs = [len(m) for m in re.findall(r"`+", value)]
    fence = "`" * (max(runs, default=0) + 1)
    pad = " " if value.startswith("`") or value.endswith("`") else ""
    return f"{fence}{pad}{value.replace('|', chr(92) + '|')}{pad}{fence}"


def fenced(value: str) -> str:
    """A fenced code block holding ``value`` verbatim."""
    runs = [len(m) for m in re.findall(r"`{3,}", value)]
    fence = "`" * max(3, max(runs, default=0) + 1)
    return f"{fence}\n{value}\n{fence}"


def cell(value: str, style: str, marks: tuple[str, ...]) -> str:
    """One table cell in Markdown, by its column's style."""
    if style == "notes":
        flags = ", ".join(MARKS[m] for m in marks if m in MARKS)
        return ": ".join(p for p in (flags, text(value) if value else "") if p)
    if value in ("", tables.DASH):
        return value
    if style == "code" and "total" not in marks:
        return code(value)
    return text(value)


def table(t: Table, level: int = 3) -> list[str]:
    """A table as Markdown lines: one pipe table per device group, each under its device's name."""
    lines = []
    header = "| " + " | ".join(text(c.title) for c in t.columns) + " |"
    align = "|" + "|".join("---:" if c.style == "num" else "---" for c in t.columns) + "|"
    for group in t.groups:
        if group.label is not None:
            lines += [f"{'#' * level} {text(group.label)}", ""]
        lines += [header, align]
        for row in group.rows:
            cells = [cell(v, c.style, row.marks) for v, c in zip(row.cells, t.columns)]
            if "total" in row.marks:
                cells[0] = f"**{cells[0]}**"
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    for note in t.notes:
        lines += [text(note), ""]
    return lines


def render_markdown(data: dict) -> str:
    """Render a ``tvmfuse.compare/1`` report as Markdown.

    Parameters
    ----------
    data : dict
        The report (``report.json``, see :mod:`tvmfuse.comparison.report`).

    Returns
    -------
    str
        The Markdown document, ending with a newline; the same input gives the same text.
    """
    model = (data.get("model") or {}).get("source", tables.DASH)
    lines = [f"# tvmfuse compare: {code(model)}", ""]
    if data.get("command"):
        lines += [fenced(str(data["command"])), ""]
    facts = tables.facts(data)
    if facts:
        lines += [" · ".join(f"{k} {code(v) if k in ('model', 'sha256') else text(v)}" for k, v in facts), ""]
    env = tables.environment(data)
    if env:
        lines += ["## Environment", ""] + [f"- **{text(k)}:** {text(v)}" for k, v in env] + [""]
    lines += ["## Summary", ""] + table(tables.summary(data))
    build = tables.build(data)
    if build:
        lines += ["## Build", ""] + table(build)
    kernels, peers = tables.kernels(data), tables.peer_profiles(data)
    if kernels or peers:
        lines += ["## Kernels", ""]
        for t in kernels:
            lines += table(t)
        for t in peers:
            lines += [f"### {text(t.title)}", ""] + table(t, level=4)
    kinds = tables.time_by_kind(data)
    if kinds:
        lines += ["## Time by kind", ""]
        for t in kinds:
            lines += table(t)
    lines += ["Plots (latency distribution, speed-up, time by kind, roofline) are in `index.html`.", ""]
    return "\n".join(lines).rstrip("\n") + "\n"
