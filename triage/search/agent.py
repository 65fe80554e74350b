"""The small local agent `triage check` asks on embedded defaults: the demo's own docs agent, over
the embedded index, with no model (`domain.checks.Agent`).

For each question it searches the docs collection, and the issues collection too when the question
reads like a problem report (an error, a crash, something stuck); it takes the best passage found,
answers with that passage's text and cites its URL. When no passage scores `DECLINE_BELOW` or more
it declines: "The documentation does not cover this." It reports the searches it made as its tool
calls and the passages it saw as retrieved, as an agent that logs them would.

Deterministic: the same index and question give the same answer. It is a plain retrieve-and-quote
agent, so it fixes what searching the right collection fixes (the retrieval, tool-routing and
skipped-retrieval failures, the content gaps nothing in the index matches) and not what it cannot:
a content gap whose words match an unrelated page gets that page's text (no decline), and a
passage quoted whole can state a value the case says must not be claimed.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence

from triage.domain.checks import AgentRun, ToolUse
from triage.domain.records import Passage
from triage.search.index import Index

#: a best passage scoring below this (BM25, title and path weighted) is no answer: the agent declines
DECLINE_BELOW = 10.0
TOP_K = 3
#: the answer quotes the best passage up to this many characters (whole paragraphs)
ANSWER_CHARS = 1800
DECLINE = (
    "The documentation does not cover this: I found nothing about it in the Kubeflow docs or issues, "
    "so I cannot give you a reliable answer."
)
#: words that make a question a problem report, for which the issues are searched too
_PROBLEM = re.compile(
    r"\b(?:error|errors|fail|fails|failed|failing|crash|crashes|crashing|hang|hangs|stuck|oom|oomkilled|"
    r"broken|why|bug|exception|timeout)\b",
    re.IGNORECASE,
)
_HEADING = re.compile(r"^#{1,6}\s.*$", re.MULTILINE)


def _quote(text: str, limit: int = ANSWER_CHARS) -> str:
    """The passage's paragraphs (headings dropped), whole, up to `limit` characters."""
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", _HEADING.sub("", text)) if p.strip()]
    kept: list[str] = []
    for paragraph in paragraphs:
        if kept and sum(len(p) + 2 for p in kept) + len(paragraph) > limit:
            break
        kept.append(paragraph)
    return "\n\n".join(kept)[: limit * 2]


class DemoAgent:
    """Retrieve and quote, over the embedded index (`tools`: tool name -> collection)."""

    name = "demo"

    def __init__(
        self, index: Index, tools: Mapping[str, str], *, docs: str = "docs", issues: str = "issues"
    ) -> None:
        self.index = index
        self._tool = {collection: tool for tool, collection in reversed(list(tools.items()))}
        self.docs, self.issues = docs, issues

    async def aclose(self) -> None:
        return None

    def collections(self, question: str) -> list[str]:
        """Where it searches: the docs, and the issues for a problem report."""
        wanted = [self.docs, self.issues] if _PROBLEM.search(question) else [self.docs]
        return [c for c in wanted if c in self.index.collections]

    def answer(self, question: str) -> AgentRun:
        searched = self.collections(question)
        found: list[Passage] = []
        calls: list[ToolUse] = []
        for collection in searched:
            calls.append(
                ToolUse(name=self._tool.get(collection, f"search_{collection}"), collection=collection,
                        args={"query": question, "top_k": TOP_K})
            )  # fmt: skip
            found += self.index.search(question, collection, TOP_K)
        best = _best(found)
        if best is None or (best.score or 0.0) < DECLINE_BELOW:
            return AgentRun(answer=DECLINE, retrieved=found, tool_calls=calls)
        answer = _quote(best.text)
        if best.source_url:
            answer += f"\n\nSource: {best.source_url}"
        return AgentRun(
            answer=answer,
            sources=[best.source_url] if best.source_url else [],
            retrieved=found,
            tool_calls=calls,
        )

    async def ask(self, question: str) -> AgentRun:
        return await asyncio.to_thread(self.answer, question)


def _best(passages: Sequence[Passage]) -> Passage | None:
    # the highest score; ties by URL, then id: the same answer on every run
    return min(passages, key=lambda p: (-(p.score or 0.0), p.source_url or "", p.id), default=None)
