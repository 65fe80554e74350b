"""Passages out of a search tool's output, as the docs agent's search server formats it.

Structured `citations` first (their text from the matching Markdown block), else the
`### Result i (score: x)` Markdown blocks with their `**Source:**` lines, else the hits of a JSON
result (a list of `{text, url, title, score}`-like objects, as other servers and retrievers log them),
else `**Source:**` blocks cut at `---`, else the whole text as one passage. Used on live MCP results and on tool outputs
logged in traces alike.

Choosing by relevance before capping: which parts of a long text, and which of many passages,
a judge is shown when not all of it fits.

A tool output or a passage can be far larger than its prompt budget (a search server that returns
whole pages, a 60 KB HTML fetch) and the part that answers may be anywhere in it. Keeping the first
N characters (or the first N passages) hides an answer near the end; these functions keep the parts
that share the most (rare) words with a focus text (the question, or the question and the answer)
instead, BM25-scored, in their original order, with a visible marker where text was left out.

Pure functions of their arguments: no I/O, deterministic.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from triage.domain.kernel import TextMemo
from triage.domain.records import Passage

ERROR_PREFIXES = ("Search failed:", "Search rejected:")
# "No results found for your query.", "No issues found ...", "No code results found ..."
_EMPTY = re.compile(r"^No\b[^\n.]{0,40}\bfound\b", re.IGNORECASE)
_RESULT_HEADER = re.compile(
    r"^###\s+Result\s+(?P<n>\d+)(?:\s+\[(?P<cid>[^\]\s]+)\])?(?:\s+\(score:\s*(?P<score>[-+0-9.eE]+)\))?[^\n]*$",
    re.MULTILINE,
)
_META_LINE = re.compile(r"^\*\*(?P<key>[A-Za-z][A-Za-z ]*):\*\*\s*(?P<value>.*)$")
_SEPARATOR = re.compile(r"\n---\s*$")
_SOURCE_LINE = re.compile(r"^\*\*Source:\*\*\s*<?(\S+?)>?\s*$", re.MULTILINE)


@dataclass
class _Block:
    number: int
    cid: str | None
    score: float | None
    meta: dict[str, str] = field(default_factory=dict)
    text: str = ""


def _float(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def markdown_blocks(text: str) -> list[_Block]:
    """The `### Result i [cid] (score: x)` blocks of a docs-agent result, with their `**Key:**` lines.

    Blocks are cut at result headers only, never at `---`, because YAML bodies contain `---` too.
    """
    headers = list(_RESULT_HEADER.finditer(text))
    blocks = []
    for header, following in zip(headers, [*headers[1:], None], strict=False):
        body = text[header.end() : following.start() if following else len(text)]
        body = _SEPARATOR.sub("", body.rstrip()).strip("\n")
        block = _Block(int(header.group("n")), header.group("cid"), _float(header.group("score")))
        lines = body.split("\n")
        while lines and (meta := _META_LINE.match(lines[0].strip())):
            block.meta[meta.group("key").strip().lower()] = meta.group("value").strip()
            lines.pop(0)
        block.text = "\n".join(lines).strip()
        blocks.append(block)
    return blocks


def _text_of(item: Mapping[str, Any], keys: tuple[str, ...]) -> str | None:
    """The first non-blank string among `item`'s `keys`."""
    for key in keys:
        value = item.get(key)
        if isinstance(value, str) and value.strip():
            return value
    return None


def _citation_text(citation: Mapping[str, Any]) -> str | None:
    return _text_of(citation, ("text", "content", "snippet", "content_text"))


def _parsed(text: str) -> Any:
    """`text` decoded, where it is a JSON object or array; else None."""
    if not text.lstrip().startswith(("{", "[")):
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested too deep to decode: text
        return None


def _citations_and_text(text: str, structured: Any, data: Any) -> tuple[list[Mapping[str, Any]], str]:
    """Structured citations (or those of a JSON `{"citations", "markdown_summary"}` text, decoded as
    `data`) and the Markdown that goes with them."""
    if isinstance(structured, Mapping) and isinstance(structured.get("citations"), list):
        return [c for c in structured["citations"] if isinstance(c, Mapping)], text
    if isinstance(data, Mapping) and isinstance(data.get("citations"), list):
        summary = data.get("markdown_summary")
        return [c for c in data["citations"] if isinstance(c, Mapping)], (
            summary if isinstance(summary, str) else ""
        )
    return [], text


#: where a JSON search result keeps its list of hits, and where a hit keeps its text, address, title
#: and score: the shapes retrievers and search servers log (`{"results": [...]}`, LangChain's
#: `[{"page_content", "metadata": {"source"}}]`, Elasticsearch's `{"hits": {"hits": [{"_source"}]}}`)
_HIT_LISTS = ("results", "documents", "docs", "hits", "items", "matches", "chunks", "passages", "data", "sources")
_HIT_TEXT = ("text", "content", "page_content", "snippet", "content_text", "chunk", "body", "passage")
_HIT_URL = ("url", "source_url", "source", "link", "uri", "href", "path", "file")
_HIT_TITLE = ("title", "section", "heading", "name")
_HIT_SCORE = ("score", "_score", "relevance", "similarity")
#: a hit list is looked for this deep (`{"hits": {"hits": [...]}}` is two)
_HIT_DEPTH = 3


def _hit_fields(hit: Mapping[str, Any]) -> Mapping[str, Any]:
    """A hit's own keys, with those of its `metadata` or `_source` beneath (the hit's win)."""
    merged: dict[str, Any] = {}
    for nested in ("_source", "metadata", "document"):
        inner = hit.get(nested)
        if isinstance(inner, Mapping):
            merged.update(inner)
    return {**merged, **{k: v for k, v in hit.items() if k not in ("_source", "metadata", "document")}}


def _hit_text(hit: Mapping[str, Any]) -> str | None:
    return _text_of(hit, _HIT_TEXT)


def _is_hit(item: Any) -> bool:
    """A search hit, not a chat content part (`{"type": "text", "text"}` is one of those)."""
    if not isinstance(item, Mapping):
        return False
    fields = _hit_fields(item)
    if _hit_text(fields) is None:
        return False
    return any(key in fields for key in (*_HIT_URL, *_HIT_TITLE, *_HIT_SCORE)) or "text" not in fields


def json_hits(value: Any, depth: int = 0) -> list[Mapping[str, Any]] | None:
    """The hits of a JSON search result (a list of hits, or one under a `_HIT_LISTS` key), else None."""
    if isinstance(value, list):
        if not value:
            return [] if depth else None  # `{"results": []}`: a search that found nothing
        return [_hit_fields(v) for v in value] if all(_is_hit(v) for v in value) else None
    if isinstance(value, Mapping) and depth < _HIT_DEPTH:
        for key in _HIT_LISTS:
            if key in value:
                found = json_hits(value[key], depth + 1)
                if found is not None:
                    return found
    return None


def _first_str(hit: Mapping[str, Any], keys: tuple[str, ...]) -> str | None:
    for key in keys:
        value = hit.get(key)
        if isinstance(value, str | int | float) and not isinstance(value, bool) and str(value).strip():
            return str(value)
    return None


def _hit_passages(hits: list[Mapping[str, Any]], prefix: str, collection: str | None) -> list[Passage]:
    return [
        Passage(
            id=f"{prefix}#{i}",
            source_url=_first_str(hit, _HIT_URL),
            collection=collection,
            text=_hit_text(hit) or "",
            title=_first_str(hit, _HIT_TITLE),
            score=next((s for s in (_float(hit.get(k)) for k in _HIT_SCORE) if s is not None), None),
        )
        for i, hit in enumerate(hits, 1)
    ]


def passages_from_output(text: str, structured: Any, collection: str | None) -> list[Passage]:
    """Passages of one successful search result: structured citations first (their text from the
    matching Markdown block), else `**Source:**` Markdown blocks, else the hits of a JSON result,
    else the whole text as one passage."""
    prefix = collection or "search"
    data = _parsed(text)  # decoded once: a JSON text may carry citations or hits
    citations, markdown = _citations_and_text(text, structured, data)
    blocks = markdown_blocks(markdown)
    if citations:
        by_cid = {b.cid: b for b in blocks if b.cid}
        passages = []
        for i, cite in enumerate(citations, 1):
            cid = str(cite.get("id")) if cite.get("id") is not None else None
            block = by_cid.get(cid) if cid else None
            if block is None and not by_cid and i <= len(blocks):
                block = blocks[i - 1]  # no ids on either side: pair them by position
            body = _citation_text(cite) or (block.text if block else None)
            if not body:
                continue
            url = cite.get("url") or (block.meta.get("source") if block else None) or None
            title = cite.get("title") or cite.get("section") or (block.meta.get("section") if block else None)
            score = _float(cite.get("score"))
            passages.append(
                Passage(
                    id=f"{prefix}#{i}",
                    source_url=str(url) if url else None,
                    collection=collection,
                    text=body,
                    title=str(title) if title else None,
                    score=score if score is not None else (block.score if block else None),
                )
            )
        return passages
    if blocks:
        return [
            Passage(
                id=f"{prefix}#{i}",
                source_url=b.meta.get("source") or None,
                collection=collection,
                text=b.text or "(empty)",
                title=b.meta.get("section") or None,
                score=b.score,
            )
            for i, b in enumerate(blocks, 1)
        ]
    hits = json_hits(structured) or json_hits(data)
    if hits is not None:
        return [p for p in _hit_passages(hits, prefix, collection) if p.text.strip()]
    if not text.strip() or _EMPTY.match(text.strip()):
        return []
    if _SOURCE_LINE.search(text):
        return _source_blocks(text, prefix, collection)
    # some other server's plain answer: keep it, without a source
    return [Passage(id=f"{prefix}#1", collection=collection, text=text.strip())]


def _source_blocks(text: str, prefix: str, collection: str | None) -> list[Passage]:
    """`**Source:** <url>` blocks without result headers, cut at `---` lines."""
    found: list[Passage] = []
    for block in re.split(r"^\s*---\s*$", text, flags=re.MULTILINE):
        source = _SOURCE_LINE.search(block)
        if source:
            body = _SOURCE_LINE.sub("", block).strip()
            found.append(
                Passage(
                    id=f"{prefix}#{len(found) + 1}",
                    source_url=source.group(1),
                    collection=collection,
                    text=body,
                )
            )
    return found


def is_error_text(text: str) -> bool:
    return text.lstrip().startswith(ERROR_PREFIXES)


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


def _terms(text: str) -> tuple[str, ...]:
    """The words of `text` for matching: lower case, stopwords out, an identifier both whole and by
    its parts (`earlyStopping` gives `earlystopping`, `early`, `stopping`), plurals folded."""
    out: list[str] = []
    for word in re.findall(r"[A-Za-z0-9_]+", text):
        pieces = {word.lower(), *(p.lower() for p in _PART.findall(word))}
        for piece in pieces:
            if len(piece) < 2 or piece in _STOP:
                continue
            out.append(_fold(piece))
    return tuple(out)


#: a passage's parts are weighed against the question for every call that shows the passage
terms = TextMemo(_terms, size=8192)


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
