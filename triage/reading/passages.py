"""Passages out of a search tool's output, as the docs agent's search server formats it.

Structured `citations` first (their text from the matching Markdown block), else the
`### Result i (score: x)` Markdown blocks with their `**Source:**` lines, else the hits of a JSON
result (a list of `{text, url, title, score}`-like objects, as other servers and retrievers log them),
else `**Source:**` blocks cut at `---`, else the whole text as one passage. Used on live MCP results and on tool outputs
logged in traces alike.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

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
