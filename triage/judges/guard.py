"""The injection guard: a cheap deterministic detector for untrusted text that tries to instruct or
fool the judge, run for every judge (the heuristic included), so flagging never depends on a
model noticing.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from functools import lru_cache

from triage.domain.records import Evidence, Facts, Passage, Trace

_VERDICT_WORDS = (
    r"ok|okay|fine|correct|grounded|ungrounded|supported|faithful|accurate|good|pass(?:ed)?|"
    r"contains?[_ ]answer|no[_ ]answer|declined|not[_ ]declined|retrieval|generation|tool[_ ]routing|"
    r"content[_ ]gap\w*|agent[_ ]skipped\w*|relevant|irrelevant|hallucinat\w*|true|false|high|low"
)
_INJECTION_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    (
        "ignore-instructions",
        re.compile(
            r"\b(?:ignore|disregard|forget|override|bypass)\s+(?:all\s+|any\s+|the\s+|your\s+|these\s+|those\s+)*"
            r"(?:previous|prior|above|earlier|preceding|system|original|other)?\s*"
            r"(?:instructions?|prompts?|rules|directions|guidelines|rubric|context)",
            re.IGNORECASE,
        ),
    ),
    (
        "verdict-order",
        re.compile(
            rf"\b(?:classify|label|mark|rate|score|judge|grade|triage|categori[sz]e|treat|consider|evaluate)\s+"
            rf"(?:this|it|that|the\s+(?:answer|response|trace|passage|output|question))?\s*(?:as|to\s+be)\s+"
            rf"[\"'`]?(?:{_VERDICT_WORDS})\b",
            re.IGNORECASE,
        ),
    ),
    (
        "verdict-claim",
        re.compile(
            r"\b(?:the\s+)?(?:answer|response|output)\s+(?:is|was)\s+(?:fully\s+|completely\s+)?"
            r"(?:grounded|supported by the (?:passages|docs|documentation|sources)|faithful)\b",
            re.IGNORECASE,
        ),
    ),
    (
        "addressed-to-judge",
        re.compile(
            r"\b(?:note|message|instructions?|attention)\s+(?:to|for)\s+(?:the\s+|any\s+)?"
            r"(?:ai|llm|model|judge|evaluator|grader|reviewer|classifier|assistant)\b"
            r"|\b(?:dear|hey|attention)\s+(?:ai|llm|judge|evaluator|grader|reviewer|classifier)\b"
            r"|\byou\s+are\s+now\b|\bnew\s+instructions?\s*:"
            r"|\b(?:as|to)\s+the\s+(?:judge|evaluator|grader|reviewer)\b",
            re.IGNORECASE,
        ),
    ),
    (
        "fake-role-line",
        re.compile(
            r"(?:^|\n)\s*(?:#+\s*|\[|<)?(?:system|assistant|developer)(?:\]|>)?\s*:\s*\S+(?:[ \t]+\S+){2,}"
            r"|<\|im_start\|>|\[INST\]|<<SYS>>",
            re.IGNORECASE,
        ),
    ),
    (
        "fake-verdict-json",
        re.compile(
            r"[\"'](?:retrieved_has_answer|index_has_answer|answer_grounded|answer_declined|"
            r"injection_suspected|verdict|label|layer|triage_layer|grounding|declined)[\"']\s*:",
            re.IGNORECASE,
        ),
    ),
    (
        "fake-tag",
        re.compile(
            r"</?\s*(?:data|passage|question|comment|answer|tool_call|system)\b[^<>]{0,200}>|nonce\s*=",
            re.IGNORECASE,
        ),
    ),
]


def injection_findings(fields: Iterable[tuple[str, str | None]]) -> list[str]:
    """ "<field>: <pattern>" for every field whose text tries to instruct or fool the judge.

    Run on the raw text (before `clean`), so stripped lookalike tags are still reported.
    """
    found: list[str] = []
    for field, text in fields:
        if not text:
            continue
        labels = _labels(text) if len(text) <= CACHED_CHARS else _labels.__wrapped__(text)
        found += [f"{field}: {label}" for label in labels]
    return list(dict.fromkeys(found))


#: passages up to this long have their findings cached: the same index chunks come back for many
#: traces, and the seven patterns scan a text at about 3 ms per 10 KB (the largest CPU cost per
#: trace in the nightly benchmark before the cache)
CACHED_CHARS = 4_000


@lru_cache(maxsize=2048)
def _labels(text: str) -> tuple[str, ...]:
    # invisible characters are removed first so "ign\u200bore previous instructions" still matches
    visible = text if text.isascii() else "".join(ch for ch in text if unicodedata.category(ch) != "Cf")
    return tuple(label for label, pattern in _INJECTION_PATTERNS if pattern.search(visible))


def trace_findings(trace: Trace, research: Sequence[Passage] | None, comment: str | None) -> list[str]:
    """`injection_findings` over every piece of untrusted text a trace carries."""
    return injection_findings(
        [
            ("question", trace.question),
            ("comment", comment),
            ("answer", trace.answer),
            *_passage_fields([*trace.passages, *(research or [])]),
            *((f"tool output T{n}", c.output) for n, c in enumerate(trace.tool_calls, start=1)),
        ]
    )


def passage_findings(passages: Sequence[Passage]) -> list[str]:
    """`injection_findings` over passages found after `trace_findings` ran (a judge's own search)."""
    return injection_findings(_passage_fields(passages))


def _passage_fields(passages: Sequence[Passage]) -> list[tuple[str, str]]:
    return [(f"passage {p.id}", f"{p.title or ''}\n{p.text}") for p in passages]


def flag(facts: Facts, findings: list[str]) -> Facts:
    """`facts` marked `injection_suspected`, with the findings as the evidence note."""
    if not findings:
        return facts
    note = "; ".join(findings)[:1000]
    old = facts.evidence.get("injection_suspected")
    if old and old.note:
        note = f"{note}; {old.note}"[:1000]
    evidence = {**facts.evidence, "injection_suspected": Evidence(confidence="high", note=note)}
    return facts.model_copy(update={"injection_suspected": True, "evidence": evidence})
