"""The independent re-search: the trace's question (with the user's comment, and the agent's own
search queries) against every collection.

`LocalSearcher` searches the embedded index in-process; `triage.search.mcp_client.McpSearcher` searches
through the agent's MCP server. Both implement `triage.domain.ports.Searcher`.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from triage.domain.config import TriageConfig
from triage.domain.ports import Searcher
from triage.domain.records import Passage, Trace
from triage.search.index import Index


@dataclass(frozen=True)
class Research:
    """A trace's re-search: its passages, and each collection that answered none of its searches
    with the first reason (what was found there is unknown, not nothing)."""

    passages: list[Passage]
    unavailable: dict[str, str] = field(default_factory=dict)


class LocalSearcher:
    """The embedded index, searched in a worker thread so the event loop keeps going."""

    def __init__(self, index: Index) -> None:
        self.index = index

    async def __aenter__(self) -> LocalSearcher:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def search(self, query: str, collection: str, top_k: int) -> list[Passage]:
        return await asyncio.to_thread(self.index.search, query, collection, top_k)


class Researcher:
    """Re-searches a trace's question in every collection; identical queries are made once.

    Query variants: the question; the question with the user's comment (`use_comment`); and each
    query the agent itself sent to a search tool (`use_agent_queries`), now in every collection: an
    agent that searched the right words in the wrong collection, or with a filter that hid the
    answer, is exactly what the re-search must be able to show. The variants' result lists are
    merged rank by rank (every list's first result, then every list's second, ...), so no variant or
    collection crowds out the others' best results.

    `more` is the judge's follow-up search (`max_more` queries of its own, in the index's
    vocabulary): the one way past a question whose words are not the docs' words.

    The cache is bounded (least recently used out) so memory stays flat however large the window:
    256 queries, far more than are in flight at once (concurrency x collections x variants).
    """

    def __init__(
        self,
        searcher: Searcher,
        collections: Sequence[str],
        top_k: int,
        use_comment: bool,
        cache_size: int = 256,
        max_query_chars: int = 512,
        use_agent_queries: bool = True,
        max_more: int = 2,
    ) -> None:
        self.searcher = searcher
        self.max_more = max_more
        self.max_query_chars = max_query_chars
        self.collections = list(collections)
        self.top_k = top_k
        self.use_comment = use_comment
        self.use_agent_queries = use_agent_queries
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple[str, str], asyncio.Future[list[Passage]]] = OrderedDict()
        self.calls = 0

    @classmethod
    def configured(cls, searcher: Searcher, config: TriageConfig) -> Researcher:
        """The re-search `[search]` and the collections of `config` describe."""
        return cls(
            searcher,
            config.collections,
            config.search.top_k,
            config.search.use_comment,
            max_query_chars=config.search.max_query_chars,
            use_agent_queries=config.search.use_agent_queries,
            max_more=config.search.judge_queries,
        )

    def _search(self, query: str, collection: str) -> asyncio.Future[list[Passage]]:
        key = (query, collection)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        self.calls += 1
        future = asyncio.ensure_future(self.searcher.search(query, collection, self.top_k))
        self._cache[key] = future
        future.add_done_callback(lambda done: self._forget_failed(key, done))
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return future

    def _forget_failed(self, key: tuple[str, str], done: asyncio.Future[list[Passage]]) -> None:
        """A failed or cancelled search is not remembered: the next trace asking it searches again."""
        if done.cancelled() or done.exception() is not None:
            if self._cache.get(key) is done:
                del self._cache[key]

    async def _gathered(self, tasks: list[asyncio.Future[list[Passage]]]) -> list[list[Passage] | Exception]:
        """The searches' outcomes, a failed query as its error. Shielded: the futures are shared by
        every trace asking the same query, so one trace's cancellation (its judge call failed) must
        not cancel them for the rest."""
        outcomes: list[list[Passage] | Exception] = []
        for outcome in await asyncio.gather(*(asyncio.shield(t) for t in tasks), return_exceptions=True):
            if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
                raise outcome  # a cancellation is not a failed query
            outcomes.append(outcome)
        return outcomes

    def queries(self, trace: Trace, comment: str | None) -> list[str]:
        """The query variants for a trace, each once, the question first."""
        question = cap_query(trace.question, self.max_query_chars)
        queries = [question]
        if self.use_comment and comment and comment.strip():
            # the comment is what a long query loses first: the question is the better search
            queries.append(cap_query(f"{question} {comment}", self.max_query_chars))
        if self.use_agent_queries:
            queries += [cap_query(q, self.max_query_chars) for q in agent_queries(trace)]
        return [q for q in dict.fromkeys(queries) if q]

    async def research(self, trace: Trace, comment: str | None) -> list[Passage]:
        """Passages S1..Sn, the variants' lists merged rank by rank, each chunk once. Raises
        `SearchError` when no search answered."""
        return (await self.research_all(trace, comment)).passages

    async def research_all(self, trace: Trace, comment: str | None) -> Research:
        """The passages, and the collections that answered none of the trace's searches. Raises
        `SearchError` when no search answered."""
        queries = self.queries(trace, comment)
        asked = [(c, q) for c in self.collections for q in queries]
        outcomes = await self._gathered([self._search(q, c) for c, q in asked])
        failures = [o for o in outcomes if isinstance(o, Exception)]
        if failures and len(failures) == len(outcomes):
            raise failures[0]  # nothing answered: the search is unavailable for this trace
        # one query variant refused (its own limit, a tool error): the others still count; but a
        # collection that answered nothing (its backend down, its breaker open) was not searched
        unavailable: dict[str, str] = {}
        for collection in self.collections:
            mine = [o for (c, _), o in zip(asked, outcomes, strict=True) if c == collection]
            if mine and all(isinstance(o, Exception) for o in mine):
                unavailable[collection] = str(mine[0])
        results = [o for o in outcomes if not isinstance(o, Exception)]
        return Research(merged(results, []), unavailable)

    async def more(
        self, queries: Sequence[str], known: Sequence[Passage], shown: Sequence[Passage] = ()
    ) -> list[Passage]:
        """A judge's follow-up search (`triage.domain.ports.SearchMore`): at most `max_more`
        queries, each in every collection, the passages in neither `known` (the re-search's) nor
        `shown` (the agent's: one it had is no answer found elsewhere) numbered on from `known`, at
        most `top_k` per query. Never raises `SearchError`: the follow-up is extra evidence, so a
        failed one leaves the judge's verdict on what it had."""
        wanted = [q for q in dict.fromkeys(cap_query(q, self.max_query_chars) for q in queries) if q]
        wanted = wanted[: self.max_more]
        if not wanted:
            return []
        tasks = [self._search(q, c) for c in self.collections for q in wanted]
        results = [o for o in await self._gathered(tasks) if not isinstance(o, Exception)]
        return merged(results, known, shown)[: self.top_k * len(wanted)]


def merged(
    results: Sequence[Sequence[Passage]], known: Sequence[Passage], shown: Sequence[Passage] = ()
) -> list[Passage]:
    """Result lists merged rank by rank (every list's first result, then every list's second, ...),
    each chunk once and none of `known` or `shown`, numbered S1.. on from `known`."""
    seen = {_chunk_key(p) for p in [*known, *shown]}
    passages: list[Passage] = []
    depth = max((len(found) for found in results), default=0)
    for rank in range(depth):
        for found in results:
            if rank >= len(found):
                continue
            passage = found[rank]
            key = _chunk_key(passage)
            if key in seen:
                continue
            seen.add(key)
            passages.append(passage.model_copy(update={"id": f"S{len(known) + len(passages) + 1}"}))
    return passages


def _chunk_key(passage: Passage) -> tuple[str | None, str]:
    return (passage.source_url, passage.text[:200])


def agent_queries(trace: Trace) -> list[str]:
    """The queries the agent sent to its search tools (the `query` argument, or arguments logged as
    a plain string), in order."""
    found: list[str] = []
    for call in trace.tool_calls:
        if not call.is_search:
            continue
        query = call.args.get("query")
        if isinstance(query, str) and query.strip():
            found.append(" ".join(query.split()))
    return found


def cap_query(text: str, limit: int) -> str:
    """`text` on one line, cut at a word boundary to at most `limit` characters (search servers
    refuse longer queries: the docs agent's at 512)."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    cut = flat[: limit + 1].rsplit(" ", 1)[0] if " " in flat[:limit] else flat[:limit]
    return cut[:limit].rstrip()
