"""What the LLM judge shows the model: the citable blocks of a prompt, passage sets (R1.., S1..) and
tool calls (T1..), cleaned and capped; and how a quote the model cites is found in its block.

Each block keeps the cleaned text exactly as the model saw it, which is what quotes are checked
against (the last section: is what the model cites really in the block it names?).

What does not fit is chosen by relevance to a focus text, never first-N: a passage or tool output
longer than its cap is shown as its parts most relevant to the focus (`triage.reading.relevance`),
and a set with more than `MAX_PASSAGES` passages keeps the most relevant ones. The focus is the
question for containment (the answer is never shown there) and the question with the answer for
grounding (the answer's claims are what must be found).
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from triage.domain.records import Passage, Trace
from triage.errors import JudgeError
from triage.judges import prompts
from triage.reading.relevance import excerpt, most_relevant

# Field caps (characters). They bound the prompt (about 8k tokens for a typical trace) and stop a
# huge tool output from crowding out the rest.
CAP_QUESTION = 2000
CAP_COMMENT = 1000
CAP_ANSWER = 8000
CAP_PASSAGE = 2000
#: a set's passages share this much room: a passage gets at least `CAP_PASSAGE`, and the room short
#: ones leave goes to long ones (one 5 KB page among two short chunks is shown whole), so a small
#: set never loses what a large one must
SET_BUDGET = 12000
CAP_TITLE = 300
CAP_URL = 500
CAP_TOOL_OUTPUT = 3000
CAP_TOOL_ARG = 500
MAX_PASSAGES = 24
MAX_TOOL_CALLS = 12

#: the passage sets a containment call asks about, as the reply names them
SetKey = Literal["retrieved", "research"]


@dataclass
class Block:
    """A citable block as the model saw it: the cleaned text quotes are checked against."""

    id: str
    texts: list[str]
    source_url: str | None = None
    collection: str | None = None

    @cached_property
    def normalised(self) -> list[str]:
        """`texts` through `quotes.normalise`, once however many quotes cite the block."""
        return [normalise(t) for t in self.texts]

    def holds(self, quote: str) -> bool:
        """Is `quote` an exact substring (after normalisation) of one of the block's texts?"""
        return any(quote_in(quote, t) for t in self.normalised)


@dataclass
class PassageSet:
    key: SetKey
    prefix: str
    passages: list[dict[str, str]] = field(default_factory=list)
    blocks: dict[str, Block] = field(default_factory=dict)

    def joined(self, more: PassageSet) -> PassageSet:
        """This set and a follow-up's passages (ids numbered on, so none is shadowed) as one set."""
        return PassageSet(self.key, self.prefix, [*self.passages, *more.passages], {**self.blocks, **more.blocks})


def passage_set(
    key: SetKey, prefix: str, passages: Sequence[Passage], nonce: str, focus: str = ""
) -> PassageSet:
    """The set as the prompt shows it: each passage once, the `MAX_PASSAGES` most relevant to
    `focus` when there are more, each text cut to its parts most relevant to `focus`."""
    out = PassageSet(key=key, prefix=prefix)
    seen: set[str] = set()
    candidates: list[tuple[Passage, str]] = []
    for passage in passages:
        if not BLOCK_ID.match(passage.id):
            raise JudgeError(f"passage id {passage.id[:20]!r} is not a short id like R1 or S1")
        text = prompts.clean(passage.text, len(passage.text), nonce)
        same = normalise(text)
        if same in seen:  # the same chunk found by two queries: send it once
            continue
        seen.add(same)
        candidates.append((passage, text))
    keep = most_relevant([f"{p.title or ''}\n{text}" for p, text in candidates], focus, MAX_PASSAGES)
    caps = shared_caps([len(candidates[i][1]) for i in keep], SET_BUDGET, CAP_PASSAGE)
    for (passage, full), cap in zip((candidates[i] for i in keep), caps, strict=True):
        text = excerpt(full, focus, cap)
        title = prompts.clean(passage.title or "", CAP_TITLE, nonce)
        data = {
            "title": title,
            "source": prompts.clean(passage.source_url or "", CAP_URL, nonce),
            "collection": prompts.clean(passage.collection or "", 40, nonce),
            "text": text,
        }
        out.passages.append({"id": passage.id, "data": prompts.encode(data)})
        out.blocks[passage.id] = Block(passage.id, [text, title], passage.source_url, passage.collection)
    return out


def shared_caps(lengths: Sequence[int], budget: int, floor: int) -> list[int]:
    """Each length's cap when `budget` is shared by water-filling: every one gets what it needs up
    to a common level, the level as high as the budget allows, and never below `floor`."""
    if not lengths:
        return []
    if sum(lengths) <= budget:
        return list(lengths)
    left, level = budget, floor
    for n, length in enumerate(sorted(lengths)):
        share = left // (len(lengths) - n)
        if length > share:
            level = max(floor, share)
            break
        left -= length
    return [min(length, level) for length in lengths]


def tool_blocks(trace: Trace, nonce: str, focus: str = "") -> tuple[list[dict[str, str]], dict[str, Block]]:
    """Tool calls as T1..; a search output whose results are already listed as passages is not sent
    twice (it is the same text, and it would double the prompt); a long output is cut to its parts
    most relevant to `focus`."""
    shown = [normalise(p.text)[:80] for p in trace.passages if p.text.strip()]
    calls: list[dict[str, str]] = []
    blocks: dict[str, Block] = {}
    for number, call in enumerate(trace.tool_calls[:MAX_TOOL_CALLS], start=1):
        tid = f"T{number}"
        output_norm = normalise(call.output)
        if call.is_search and not call.error and shown and any(s in output_norm for s in shown):
            output = "[the results of this search are listed as passages in the retrieved set]"
        else:
            output = excerpt(prompts.clean(call.output, len(call.output), nonce), focus, CAP_TOOL_OUTPUT)
        args = prompts.clean_value(call.args, CAP_TOOL_ARG, nonce)
        data = {
            "tool": prompts.clean(call.name, 100, nonce),
            "arguments": args,
            "error": call.error,
            "output": output,
        }
        calls.append({"id": tid, "data": prompts.encode(data)})
        blocks[tid] = Block(tid, [output, prompts.encode(args)])
    return calls, blocks


# -- quotes ------------------------------------------------------------------------------------------

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
