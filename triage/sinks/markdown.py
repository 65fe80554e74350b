"""Markdown for the sinks: escaping untrusted text, and the templates (jinja2)."""

from __future__ import annotations

import re

from jinja2 import Environment, PackageLoader, StrictUndefined

from triage.redact import printable, redact

# Inline Markdown that could format, link or break out of a line. Block syntax (headings, lists,
# quotes, tables) needs a line start, and user text never gets one: it is folded onto one line
# that the template starts itself.
# Links and images need `[`, emphasis `*` or `_`, code a backtick, tables `|`, strikethrough `~`.
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~])")
_BLOCK_START = re.compile(r"^(?:(\d+)([.)])|([#>+=-]))")
_AUTOLINK = re.compile(r"(?i)\b(https?|ftp)(:)(//)|\b(www)(\.)")


#: user text in the report is cut to this many characters; the whole of it stays in the trace
USER_TEXT_CHARS = 500


def md(text: object, limit: int = USER_TEXT_CHARS) -> str:
    """Escape untrusted text for one line of Markdown: no HTML, no formatting, no links, no newlines,
    no control or invisible characters, no secret; at most `limit` characters."""
    flat = " ".join(printable(redact(str(text)), limit).split())
    flat = flat.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    flat = _MD_SPECIAL.sub(r"\\\1", flat)
    # should a template ever start a line with user text, it still cannot open a block
    flat = _BLOCK_START.sub(lambda m: f"{m[1]}\\{m[2]}" if m[2] else f"\\{m[3]}", flat)
    # GitHub turns bare URLs into links; an escaped colon or dot stops that and renders the same
    return _AUTOLINK.sub(lambda m: f"{m[1]}\\:{m[3]}" if m[1] else f"{m[4]}\\.", flat)


def code(text: object) -> str:
    """An identifier as inline code; backticks removed so it cannot close the span early."""
    return "`" + printable(redact(str(text)), USER_TEXT_CHARS).replace("`", "'") + "`"


templates = Environment(
    loader=PackageLoader("triage.sinks", "templates"),
    undefined=StrictUndefined,
    autoescape=False,  # Markdown, not HTML: escaping is explicit, with the `md` filter
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)
templates.filters["md"] = md
templates.filters["code"] = code
