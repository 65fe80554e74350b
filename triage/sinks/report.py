"""The Markdown report (a jinja2 template).

User text (questions, comments) is escaped: it cannot open a heading, a table, a link or HTML.
"""

from __future__ import annotations

import re
from collections import defaultdict

from jinja2 import Environment, PackageLoader, StrictUndefined

from triage.domain.outcome import Entry, RunResult
from triage.domain.records import Layer
from triage.redact import printable, redact
from triage.sinks.summary import summary_lines

# Inline Markdown that could format, link or break out of a line. Block syntax (headings, lists,
# quotes, tables) needs a line start, and user text never gets one: it is folded onto one line
# that the template starts itself.
# Links and images need `[`, emphasis `*` or `_`, code a backtick, tables `|`, strikethrough `~`.
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~])")
_AUTOLINK = re.compile(r"(?i)\b(https?|ftp)(:)(//)|\b(www)(\.)")


#: user text in the report is cut to this many characters; the whole of it stays in the trace
USER_TEXT_CHARS = 500


def md(text: object, limit: int = USER_TEXT_CHARS) -> str:
    """Escape untrusted text for one line of Markdown: no HTML, no formatting, no links, no newlines,
    no control or invisible characters, no secret; at most `limit` characters."""
    flat = " ".join(printable(redact(str(text)), limit).split())
    flat = flat.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    flat = _MD_SPECIAL.sub(r"\\\1", flat)
    # GitHub turns bare URLs into links; an escaped colon or dot stops that and renders the same
    return _AUTOLINK.sub(lambda m: f"{m[1]}\\:{m[3]}" if m[1] else f"{m[4]}\\.", flat)


def code(text: object) -> str:
    """An identifier as inline code; backticks removed so it cannot close the span early."""
    return "`" + printable(redact(str(text)), USER_TEXT_CHARS).replace("`", "'") + "`"


_env = Environment(
    loader=PackageLoader("triage.sinks", "templates"),
    undefined=StrictUndefined,
    autoescape=False,  # Markdown, not HTML: escaping is explicit, with the `md` filter
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)
_env.filters["md"] = md
_env.filters["code"] = code


def _grouped(entries: list[Entry]) -> dict[str, dict[str, list[Entry]]]:
    """owner -> layer -> entries, owners sorted, layers in the report's order."""
    groups: dict[str, dict[str, list[Entry]]] = defaultdict(lambda: defaultdict(list))
    for entry in entries:
        for owner in entry.owners:
            groups[owner][entry.layer.value].append(entry)
    order = [layer.value for layer in Layer]
    return {
        owner: {layer: groups[owner][layer] for layer in order if groups[owner].get(layer)}
        for owner in sorted(groups)
    }


def render_report(result: RunResult) -> str:
    groups = _grouped(result.entries)
    layers = [layer.value for layer in Layer if result.layer_counts.get(layer.value)]
    return _env.get_template("report.md.j2").render(
        result=result,
        groups=groups,
        layers=layers,
        totals={
            owner: {layer: len(items) for layer, items in by_layer.items()}
            for owner, by_layer in groups.items()
        },
        summary=summary_lines(result),  # our own text: not escaped
    )
