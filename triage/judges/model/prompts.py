"""The judge's prompt templates, and the discipline for the untrusted text they carry.

Templates live in a top-level `prompts/` folder (force-included in the wheel as `triage/prompts`).
They are jinja2 templates rendered with `StrictUndefined`, so a missing variable is an error, not
an empty string. Each template declares its version on its first line (`{#- version: x-v1 -#}`);
`prompt_version()` joins those versions with a short hash of the template text, so an edit that
forgets to bump the version still changes the version stored with every verdict.

Untrusted text (question, comment, answer, passages, tool output) never goes into a template
raw: `clean()` strips control and zero-width characters and tag/nonce lookalikes, caps the length,
and JSON-encodes it, and the templates place it inside tagged blocks that carry a per-call nonce.
The injection guard (the last section) runs for every judge, the heuristic included: a cheap
deterministic detector of untrusted text that tries to instruct or fool the judge, so flagging never
depends on a model noticing.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import jinja2

from triage.domain.kernel import TextMemo
from triage.errors import ConfigError
from triage.judges.guard import CHECK_TAG_LOOKALIKE

_VERSION_LINE = re.compile(r"^\{#-?\s*version:\s*([\w.-]+)\s*-?#\}")


def prompt_dirs() -> list[Path]:
    """Where templates are looked up: the package's `prompts` (an installed wheel), then
    `<repo root>/prompts` (a source checkout)."""
    package = Path(__file__).resolve().parents[2]  # triage/ (this is triage/judges/model/prompts.py)
    return [d for d in (package / "prompts", package.parent / "prompts") if d.is_dir()]


@cache
def environment() -> jinja2.Environment:
    dirs = prompt_dirs()
    if not dirs:
        raise ConfigError("the judge's prompt templates are missing (no prompts/ folder next to triage/)")
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(d) for d in dirs]),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # output is a chat message, not HTML; data is JSON-encoded before it gets here
        keep_trailing_newline=False,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def template_source(name: str) -> str:
    env = environment()
    assert env.loader is not None
    try:
        source, _, _ = env.loader.get_source(env, name)
    except jinja2.TemplateNotFound as ex:
        raise ConfigError(f"prompt template {name!r} not found in {prompt_dirs()}") from ex
    return source


def render(name: str, **variables: Any) -> str:
    try:
        return environment().get_template(name).render(**variables).strip()
    except jinja2.TemplateNotFound as ex:
        raise ConfigError(f"prompt template {name!r} not found in {prompt_dirs()}") from ex


def template_version(name: str) -> str:
    found = _VERSION_LINE.match(template_source(name))
    if not found:
        raise ConfigError(f"prompt template {name!r} does not start with a '{{#- version: ... -#}}' line")
    return found.group(1)


def prompt_version(names: Sequence[str]) -> str:
    """E.g. "containment-v2+grounding-v1@3f2a9c1d": declared versions plus a hash of all the text."""
    digest = hashlib.sha256()
    versions: list[str] = []
    for name in names:
        digest.update(name.encode() + b"\0" + template_source(name).encode() + b"\0")
        version = template_version(name)
        if version not in versions:
            versions.append(version)
    return "+".join(versions) + "@" + digest.hexdigest()[:8]


def new_nonce() -> str:
    return secrets.token_hex(8)


# --- untrusted text ------------------------------------------------------------------------------

# Format characters (Cf: zero-width, bidi overrides, BOM ...) and control characters except
# newline and tab: they hide text from a human reviewer while the model still reads it.
_KEEP_CONTROLS = {"\n", "\t"}
# Anything that looks like one of our block tags, opening or closing, plus chat-template markers.
_TAG_LOOKALIKE = re.compile(
    r"</?\s*(?:data|passage|passages|question|comment|answer|tool_call|tool_calls|tool|system|user|"
    r"assistant|instructions?|rubric|nonce)\b[^<>]{0,200}>"
    r"|<\|[a-z_]{2,20}\|>|\[/?INST\]|<</?SYS>>",
    re.IGNORECASE,
)
_NONCE_ATTR = re.compile(r"\bnonce\s*[=:]\s*[\"']?[\w-]*[\"']?", re.IGNORECASE)


def _ascii_controls() -> re.Pattern[str]:
    dropped = "".join(chr(c) for c in [*range(0x20), 0x7F] if chr(c) not in _KEEP_CONTROLS)
    return re.compile(f"[{re.escape(dropped)}]")


_ASCII_CONTROLS = _ascii_controls()


def clean(text: str, limit: int, nonce: str | None = None) -> str:
    """Untrusted text made safe to embed: invisible characters, tag and nonce lookalikes removed,
    length capped (with a visible marker)."""
    cleaned = _cleaned(text)
    if nonce and (nonce in text or nonce in cleaned):
        # the call's nonce written into the data (it cannot be guessed: a test, or a bug) goes first,
        # then the lookalikes it may have hidden
        cleaned = _clean_all(_visible(text).replace(nonce, ""))
    if len(cleaned) > limit:
        cleaned = cleaned[:limit] + " [truncated]"
    return cleaned


def _visible(text: str) -> str:
    if text.isascii():
        # the common case, and a hot path (tens of KB per trace): in ASCII only controls are invisible
        return _ASCII_CONTROLS.sub("", text)
    return "".join(
        ch for ch in text if ch in _KEEP_CONTROLS or unicodedata.category(ch) not in {"Cc", "Cf", "Co", "Cs"}
    )


def _clean_all(text: str) -> str:
    return _NONCE_ATTR.sub("[nonce removed]", _TAG_LOOKALIKE.sub("[tag removed]", text))


#: a passage is cleaned for every call that shows it (both of the model judge's calls, each trace
#: that retrieves it): the work before the per-call nonce is done once per text
_cleaned = TextMemo(lambda text: _clean_all(_visible(text)), size=4096)


def clean_value(
    value: Any, limit: int, nonce: str | None = None, cleaner: Callable[[str, int, str | None], str] | None = None
) -> Any:
    """`cleaner` (`clean` unless given: the check judge's is `check_clean`) applied to every string
    inside a JSON-like value (tool arguments)."""
    each = cleaner or clean
    if isinstance(value, str):
        return each(value, limit, nonce)
    if isinstance(value, Mapping):
        return {each(str(k), 100, nonce): clean_value(v, limit, nonce, each) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean_value(v, limit, nonce, each) for v in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    return each(str(value), limit, nonce)


def encode(value: Any) -> str:
    """JSON, so that quotes, newlines and brackets inside the data cannot end the block."""
    return json.dumps(value, ensure_ascii=False)


# -- the injection guard -----------------------------------------------------------------------------


# -- the check judge's guard (`triage check`) ---------------------------------------------------------
#
# The check judge (`judges.check_llm`) is asked about expectations, verdicts `pass | fail | unsure`
# and quotes: text that tries to steer it speaks that vocabulary, not the triage judge's (layers,
# grounding). These patterns are its own, in English and in the common other languages, and its
# template's tag names are cleaned out of what it is shown (`check_clean`); the triage judge's
# patterns and `clean` are unchanged (the nightly job reads them).


def check_clean(text: str, limit: int, nonce: str | None = None) -> str:
    """`clean` for the check judge: its template's tag names and the role names neutralised too
    (`<expectation ...>`, `</answer>`, `<system>`), then what `clean` removes."""
    return clean(CHECK_TAG_LOOKALIKE.sub("[tag removed]", _visible(text)), limit, nonce)


def check_clean_value(value: Any, limit: int, nonce: str | None = None) -> Any:
    """`check_clean` applied to every string inside a JSON-like value (tool arguments)."""
    return clean_value(value, limit, nonce, check_clean)


