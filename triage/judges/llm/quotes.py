"""Quote checks: is what the model cites really in the block it names?"""

from __future__ import annotations

import json
import re
import unicodedata

MIN_QUOTE_CHARS = 8

#: a block id as the prompts give them: R1 (retrieved), S1 (re-searched), T1 (tool call)
BLOCK_ID = re.compile(r"^[A-Za-z]{1,4}\d{1,4}$")

_QUOTE_CHARS = str.maketrans(
    {"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2013": "-", "\u2014": "-", "\u00a0": " "}
)


def normalise(text: str) -> str:
    """Whitespace runs become one space; typographic quotes and dashes become ASCII (models
    re-type them); nothing else changes."""
    text = unicodedata.normalize("NFC", text).translate(_QUOTE_CHARS)
    return re.sub(r"\s+", " ", text).strip()


def quote_found(quote: str, text: str) -> bool:
    """Is `quote` an exact substring of `text`, after whitespace normalisation?

    An ellipsis in the quote may skip text, but each piece must appear, in order. The model saw
    the text JSON-encoded, so a quote copied with JSON escapes (`\\"`, `\\n`) is decoded first.
    """
    return quote_in(quote, normalise(text))


def quote_in(quote: str, haystack: str) -> bool:
    """`quote_found` against a text already through `normalise` (a block's, normalised once for
    all the quotes that cite it)."""
    candidates = [quote]
    if "\\" in quote:
        try:
            candidates.append(json.loads(f'"{quote}"'))
        except ValueError:
            pass
    for candidate in candidates:
        needle = normalise(candidate).strip("\"' ")
        if len(needle) < min(MIN_QUOTE_CHARS, len(haystack)):
            continue
        pieces = [p.strip() for p in re.split(r"\.\.\.|\u2026", needle) if p.strip()]
        pos = 0
        for piece in pieces:
            at = haystack.find(piece, pos)
            if at < 0:
                break
            pos = at + len(piece)
        else:
            if pieces:
                return True
    return False


def safe_id(value: str) -> str:
    """An id from the model, shown in a retry message only when it looks like a block id."""
    return value if BLOCK_ID.match(value) else "an id that is not a block id"
