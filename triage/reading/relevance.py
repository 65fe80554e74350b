"""Choosing by relevance before capping: which parts of a long text, and which of many passages,
a judge is shown when not all of it fits.

A tool output or a passage can be far larger than its prompt budget (a search server that returns
whole pages, a 60 KB HTML fetch) and the part that answers may be anywhere in it. Keeping the first
N characters (or the first N passages) hides an answer near the end; these functions keep the parts
that share the most (rare) words with a focus text (the question, or the question and the answer)
instead, BM25-scored, in their original order, with a visible marker where text was left out.

Pure functions of their arguments: no I/O, deterministic.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

#: where text was left out between two kept parts (a quote copied across it does not match)
GAP = "\n[...]\n"
#: a part is at most this long: a paragraph, else lines grouped, else a long line cut at spaces
UNIT_CHARS = 600

_WORD = re.compile(r"[A-Za-z0-9]+")
_PART = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")
_STOP = frozenset(
    """a about all also an and any are as at be been but by can could did do does for from get has have how i if
    in into is it its just me my no not of on or our should so some than that the their them then there these
    they this to too up use used using was way we what when where which while who why will with would you your
    yes""".split()
)
_K1 = 1.2
_B = 0.75


def terms(text: str) -> list[str]:
    """The words of `text` for matching: lower case, stopwords out, an identifier both whole and by
    its parts (`earlyStopping` gives `earlystopping`, `early`, `stopping`), plurals folded."""
    out: list[str] = []
    for word in re.findall(r"[A-Za-z0-9_]+", text):
        pieces = {word.lower(), *(p.lower() for p in _PART.findall(word))}
        for piece in pieces:
            if len(piece) < 2 or piece in _STOP:
                continue
            out.append(_fold(piece))
    return out


def _fold(word: str) -> str:
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def _split_units(text: str, size: int) -> list[tuple[int, int]]:
    """(start, end) spans covering `text`: paragraphs, long ones as groups of lines, long lines cut
    at whitespace; each at most `size` characters (a word longer than that is cut too)."""
    units: list[tuple[int, int]] = []
    for para in re.finditer(r"\S(?:.*?\S)?(?=\n[ \t]*\n|\s*\Z)", text, re.DOTALL):
        start, end = para.span()
        if end - start <= size:
            units.append((start, end))
            continue
        group_start, group_end = -1, -1
        for line in re.finditer(r"[^\n]+", text[start:end]):
            ls, le = start + line.start(), start + line.end()
            if le - ls > size:
                if group_start >= 0:
                    units.append((group_start, group_end))
                    group_start = -1
                units.extend(_cut_line(text, ls, le, size))
                continue
            if group_start >= 0 and le - group_start > size:
                units.append((group_start, group_end))
                group_start = -1
            if group_start < 0:
                group_start = ls
            group_end = le
        if group_start >= 0:
            units.append((group_start, group_end))
    return units


def _cut_line(text: str, start: int, end: int, size: int) -> list[tuple[int, int]]:
    spans = []
    while start < end:
        stop = min(end, start + size)
        if stop < end:
            space = text.rfind(" ", start + size // 2, stop)
            stop = space if space > start else stop
        spans.append((start, stop))
        start = stop
        while start < end and text[start] == " ":
            start += 1
    return spans


def bm25_scores(documents: Sequence[Sequence[str]], query: Sequence[str]) -> list[float]:
    """BM25 of each tokenised document against the query terms (each distinct query term once)."""
    if not documents:
        return []
    n = len(documents)
    avg = sum(len(d) for d in documents) / n or 1.0
    df: Counter[str] = Counter()
    for doc in documents:
        df.update(set(doc))
    wanted = set(query)
    scores = []
    for doc in documents:
        tf = Counter(t for t in doc if t in wanted)
        score = 0.0
        for term, freq in tf.items():
            idf = math.log(1 + (n - df[term] + 0.5) / (df[term] + 0.5))
            score += idf * freq * (_K1 + 1) / (freq + _K1 * (1 - _B + _B * len(doc) / avg))
        scores.append(score)
    return scores


def excerpt(text: str, focus: str, limit: int) -> str:
    """`text` itself when it fits in `limit` characters; else its parts most relevant to `focus`,
    in their original order, joined by `GAP` (and `GAP` at either end where text was left out),
    at most `limit` characters. With nothing relevant, the head of the text."""
    if len(text) <= limit:
        return text
    spans = _split_units(text, min(UNIT_CHARS, max(limit // 2, 1)))
    scores = bm25_scores([terms(text[s:e]) for s, e in spans], terms(focus))
    ranked = sorted((i for i, score in enumerate(scores) if score > 0), key=lambda i: (-scores[i], i))
    if not ranked:
        return text[: max(0, limit - len(GAP))].rstrip() + GAP.rstrip()
    chosen: list[int] = []
    used = 0
    for i in ranked:
        cost = spans[i][1] - spans[i][0] + len(GAP)
        if used + cost > limit - len(GAP):
            continue
        chosen.append(i)
        used += cost
    if not chosen:  # even the best part is longer than the budget
        best = spans[ranked[0]]
        return GAP.lstrip() + text[best[0] : best[0] + max(0, limit - 2 * len(GAP))] + GAP.rstrip()
    chosen.sort()
    pieces: list[str] = []
    previous_end = 0
    for i in chosen:
        start, end = spans[i]
        between = text[previous_end:start]
        if between.strip():
            pieces.append(GAP)
        elif pieces:  # adjacent parts: their own separator, at most a blank line
            pieces.append("\n\n" if "\n\n" in between else "\n" if "\n" in between else " ")
        pieces.append(text[start:end])
        previous_end = end
    if text[previous_end:].strip():
        pieces.append(GAP)
    return "".join(pieces).strip("\n")


def most_relevant(texts: Sequence[str], focus: str, keep: int) -> list[int]:
    """The indexes of the `keep` texts most relevant to `focus`, in their original order (all of
    them when there are no more than `keep`); ties keep the earlier text."""
    if len(texts) <= keep:
        return list(range(len(texts)))
    scores = bm25_scores([terms(t) for t in texts], terms(focus))
    ranked = sorted(range(len(texts)), key=lambda i: (-scores[i], i))
    return sorted(ranked[:keep])
