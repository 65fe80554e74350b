"""Synthetic thumbs-down traces for the nightly benchmark, built from real corpus chunks.

Each trace looks like what the Kubeflow docs agent logs: a root AGENT observation (the user's
question in, the answer out), 1-3 TOOL calls whose outputs are real search results over
../shared/corpus in the docs agent's Markdown format (the same `format_results` the MCP server
uses), and a GENERATION. Each carries one `user_feedback` = 0 vote. Deterministic for a seed.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from triage.domain.config import IndexFolder
from triage.search.index import NO_RESULTS, Chunk, Index, chunks_of_folder, format_results

FOLDERS = {"docs": "kubeflow-docs", "code": "katib-examples"}
TOOLS = {"docs": "search_kubeflow_docs", "code": "search_kubeflow_code", "issues": "search_github_issues"}
TOP_K = 5

_TEMPLATES = (
    "How do I set up {topic} in Kubeflow?",
    "What does the documentation say about {topic}?",
    "Where do I configure {topic}?",
    "Can you explain {topic} for {component}?",
    "Why does {topic} fail in my {component} deployment?",
)
_COMMENTS = (
    "wrong version",
    "this is outdated",
    "did not answer my question",
    "the link is broken",
    "made up a flag that does not exist",
    None,
)
_DECLINE = "I couldn't find this in the Kubeflow documentation. You may want to ask on the Kubeflow Slack."


def folders(corpus: Path) -> list[IndexFolder]:
    return [IndexFolder(collection=c, path=corpus / name) for c, name in FOLDERS.items()]


def corpus_missing(corpus: Path) -> str | None:
    """Why the corpus cannot be used, or None."""
    missing = [str(corpus / name) for name in FOLDERS.values() if not (corpus / name).is_dir()]
    return f"corpus folder(s) not found: {', '.join(missing)}" if missing else None


def trace_id(seed: int, n: int) -> str:
    # 32 lowercase hex digits, the shape of an OTel trace id (the SDK treats others as legacy)
    return hashlib.sha256(f"bench:{seed}:{n}".encode()).hexdigest()[:32]


def _topic(chunk: Chunk) -> str:
    label = chunk.title.split(" > ")[-1]
    label = re.sub(r"[`*_\[\]()]", "", label).strip()
    return label or chunk.title


def _first_sentence(text: str) -> str:
    body = " ".join(line for line in text.splitlines() if line.strip() and not line.startswith("#"))
    found = re.search(r"[A-Z][^.!?]{30,200}[.!?]", body)
    return found.group(0) if found else body[:160]


class TraceFactory:
    """Builds import-format records (notes/contracts.md) for the benchmark."""

    def __init__(self, corpus: Path, seed: int = 7) -> None:
        chunks = [c for folder in folders(corpus) for c in chunks_of_folder(folder)]
        self.docs = [c for c in chunks if c.collection == "docs" and len(c.text) > 200]
        self.index = Index(chunks)
        self.seed = seed
        self._search_cache: dict[tuple[str, str], str] = {}

    def _search(self, query: str, collection: str) -> str:
        key = (query, collection)
        if key not in self._search_cache:
            self._search_cache[key] = format_results(self.index.search(query, collection, TOP_K))
        return self._search_cache[key]

    def records(self, count: int, now: datetime) -> Iterator[dict[str, Any]]:
        rng = random.Random(self.seed)
        for n in range(count):
            yield self._record(n, rng, now)

    def _record(self, n: int, rng: random.Random, now: datetime) -> dict[str, Any]:
        tid = trace_id(self.seed, n)
        chunk = rng.choice(self.docs)
        component = chunk.id.split(":", 1)[1].split("/")[0]
        question = rng.choice(_TEMPLATES).format(topic=_topic(chunk), component=component)
        start = now - timedelta(hours=1) - timedelta(seconds=rng.uniform(0, 19 * 3600))
        calls = [("docs", question)]
        if rng.random() < 0.5:
            calls.append(("code", question))
        if rng.random() < 0.2:
            calls.append(("issues", question))
        outputs = [self._search(q, c) if c != "issues" else NO_RESULTS for c, q in calls]

        kind = rng.random()
        if kind < 0.5:
            first = next((o for o in outputs if o != NO_RESULTS), "")
            body = first.split("\n\n", 1)[1] if "\n\n" in first else chunk.text
            answer = f"According to the docs: {_first_sentence(body)}"
        elif kind < 0.7:
            answer = _DECLINE
        else:
            answer = (
                f"Set `--enable-{_topic(chunk).lower().replace(' ', '-')[:30]}` to true in the "
                f"{component} config and restart the controller (supported since v1.{n % 10})."
            )
        messages = [
            {"role": "system", "content": "You are the Kubeflow docs assistant."},
            {"role": "user", "content": question},
        ]
        root = f"{tid[:16]}"
        observations: list[dict[str, Any]] = [
            {
                "id": root,
                "traceId": tid,
                "type": "AGENT",
                "name": "docs-agent",
                "parentObservationId": None,
                "startTime": start.isoformat(),
                "endTime": (start + timedelta(seconds=8)).isoformat(),
                "input": json.dumps({"messages": messages}),
                "output": json.dumps({"role": "assistant", "content": answer}),
                "metadata": {"agent_version": "0.9.2"},
                "sessionId": None,
                "userId": f"user-{n % 97}",
                "environment": "production",
            }
        ]
        for i, ((collection, query), output) in enumerate(zip(calls, outputs, strict=True)):
            observations.append(
                {
                    "id": f"{tid[:12]}t{i:03d}",
                    "traceId": tid,
                    "type": "TOOL",
                    "name": TOOLS[collection],
                    "parentObservationId": root,
                    "startTime": (start + timedelta(seconds=1 + i)).isoformat(),
                    "endTime": (start + timedelta(seconds=1.5 + i)).isoformat(),
                    "input": json.dumps({"query": query, "top_k": TOP_K}),
                    "output": json.dumps(output),
                    "metadata": {},
                    "environment": "production",
                }
            )
        observations.append(
            {
                "id": f"{tid[:12]}g000",
                "traceId": tid,
                "type": "GENERATION",
                "name": "answer",
                "parentObservationId": root,
                "startTime": (start + timedelta(seconds=5)).isoformat(),
                "endTime": (start + timedelta(seconds=8)).isoformat(),
                "input": json.dumps(messages),
                "output": json.dumps({"role": "assistant", "content": answer}),
                "metadata": {"model": "gpt-4o-mini"},
                "environment": "production",
            }
        )
        vote = {
            "id": f"vote-{tid}",
            "name": "user_feedback",
            "dataType": "BOOLEAN",
            "value": 0,
            "comment": rng.choice(_COMMENTS),
            "traceId": tid,
            "timestamp": (start + timedelta(seconds=40)).isoformat(),
            "userId": f"user-{n % 97}",
            "environment": "production",
            "source": "API",
        }
        return {"traceId": tid, "observations": observations, "scores": [vote]}
