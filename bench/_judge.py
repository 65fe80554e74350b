"""The judge stand-in's "model" for the benchmark: valid, verifiable replies built from each request.

The LLM judge checks every reply (cited ids must exist in the right set, quotes must be exact
substrings of the cited block), so the replies are made from the prompt itself: they cite passage
ids that are in it and quote text copied from those passages. Verdicts vary with a hash of the
question, so runs produce a mix of layers. Token counts are estimated from the text (about four
characters a token) and returned in `usage`, as a real server would.

The `batch_triage` call is the one the `run_batched_evaluation` job makes (one per trace).
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.doubles.openai_server import Block, Reply, asked_sets, call_kind, data_blocks  # noqa: E402

BATCH_CALL = "batch_triage"
LAYERS = ["ok", "generation", "retrieval", "content_gap_handled", "content_gap_hallucination"]


def tokens(text: str) -> int:
    return max(1, len(text) // 4)


def _pick(question: str, salt: str, choices: int) -> int:
    return hashlib.sha256(f"{salt}:{question}".encode()).digest()[0] % choices


def _quote(text: str) -> str:
    """An exact piece of `text`: a run of words from the middle of its first long line."""
    lines = [line.strip() for line in text.splitlines() if len(line.strip()) >= 40]
    line = lines[0] if lines else text.strip()
    words = line.split()
    piece = " ".join(words[: min(len(words), 12)])
    return piece if len(piece) >= 8 else text.strip()[:60]


@dataclass
class Stats:
    calls: Counter[str] = field(default_factory=Counter)
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def snapshot(self) -> Stats:
        return Stats(Counter(self.calls), self.prompt_tokens, self.completion_tokens)

    def minus(self, before: Stats) -> Stats:
        return Stats(
            self.calls - before.calls,
            self.prompt_tokens - before.prompt_tokens,
            self.completion_tokens - before.completion_tokens,
        )

    @property
    def total_calls(self) -> int:
        return sum(self.calls.values())


class BenchModel:
    """A responder for `tests.doubles.openai_server.OpenAIServer`; thread-safe (the server is threaded)."""

    def __init__(self) -> None:
        self.stats = Stats()
        self._lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> Reply:
        kind = call_kind(body)
        prompt = "\n".join(str(m.get("content") or "") for m in body.get("messages", []))
        if kind == "containment":
            reply = self._containment(body)
        elif kind == "grounding":
            reply = self._grounding(body)
        else:
            reply = self._batch(body)
        content = json.dumps(reply)
        used_in, used_out = tokens(prompt), tokens(content)
        with self._lock:
            self.stats.calls[kind] += 1
            self.stats.prompt_tokens += used_in
            self.stats.completion_tokens += used_out
        return Reply(content=content, prompt_tokens=used_in, completion_tokens=used_out)

    @staticmethod
    def _blocks(body: dict[str, Any]) -> list[Block]:
        user = next(m["content"] for m in body["messages"] if m["role"] == "user")
        return data_blocks(user)

    def _containment(self, body: dict[str, Any]) -> dict[str, Any]:
        blocks = self._blocks(body)
        question = next(b.value for b in blocks if b.tag == "question")
        reply: dict[str, Any] = {"injection_note": "", "injection_suspected": False}
        for key, prefix in (("retrieved", "R"), ("research", "S")):
            if key not in asked_sets(body):
                continue
            passages = [b for b in blocks if b.tag == "passage" and b.attrs["id"].startswith(prefix)]
            verdict = ["contains_answer", "partial", "no_answer"][_pick(question, key, 3)]
            evidence = []
            if verdict != "no_answer" and passages:
                chosen = passages[_pick(question, key + "#", len(passages))]
                evidence = [{"passage_id": chosen.attrs["id"], "quote": _quote(chosen.value["text"])}]
            else:
                verdict = "no_answer"
            reply[key] = {
                "reasoning": "benchmark model: verdict from a hash of the question",
                "verdict": verdict,
                "evidence": evidence,
                "confidence": "high",
            }
        schema = body.get("response_format", {}).get("json_schema", {}).get("schema", {})
        names = schema.get("properties", {}).get("component", {}).get("properties", {})
        enum = names.get("name", {}).get("enum") or ["general"]
        reply["component"] = {"reasoning": "benchmark model", "name": enum[_pick(question, "c", len(enum))]}
        return reply

    def _grounding(self, body: dict[str, Any]) -> dict[str, Any]:
        blocks = self._blocks(body)
        question = next(b.value for b in blocks if b.tag == "question")
        answer = next(b.value for b in blocks if b.tag == "answer")
        passages = [b for b in blocks if b.tag == "passage"]
        claims = []
        if passages and _pick(question, "g", 2) == 0:
            claims.append(
                {
                    "claim": "the answer restates the first passage",
                    "status": "supported",
                    "source_id": passages[0].attrs["id"],
                    "quote": _quote(passages[0].value["text"]),
                }
            )
        if "`--" in answer:
            claims.append({"claim": "the flag exists", "status": "unsupported", "source_id": "", "quote": ""})
        decline = re.search(r"I couldn't find[^.]*", answer)
        return {
            "injection_note": "",
            "injection_suspected": False,
            "claims": claims,
            "grounding": {
                "reasoning": "benchmark model",
                "verdict": "ungrounded" if any(c["status"] != "supported" for c in claims) else "grounded",
                "confidence": "high",
            },
            "declined": {
                "reasoning": "benchmark model",
                "verdict": "declined" if decline else "not_declined",
                "quote": decline.group(0) if decline else "",
                "confidence": "high",
            },
        }

    def _batch(self, body: dict[str, Any]) -> dict[str, Any]:
        user = next(m["content"] for m in body["messages"] if m["role"] == "user")
        return {"reasoning": "benchmark model", "layer": LAYERS[_pick(user[:500], "b", len(LAYERS))]}
