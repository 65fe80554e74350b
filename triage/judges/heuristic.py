"""The offline judge: facts from string evidence alone, no model.

- containment: a passage holds the answer when it covers most of the question's key terms;
- grounding: every specific in the answer (URL, flag, code span, identifier, number, version)
  appears somewhere in what the agent saw;
- declining: the answer uses a decline phrase.

Crude on purpose and cheap: its signals are computed for every trace, and they are what the
cascade judge uses to decide which traces need a model at all.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from triage.domain.records import Evidence, Facts, Passage, Trace, Usage
from triage.judges import guard

COVERAGE_THRESHOLD = 0.7

STOPWORDS = frozenset(
    """a about above after again all also am an and any are as at be been before being below between both but by
    can cannot could did do does doing done don down during each even ever every few for from further get gets
    getting got had has have having he her here hers him his how however i if in into is it its itself just
    let like make makes many may me might more most much must my need needs no nor not now of off on once only or
    other our out over own per please really same see set she should show so some still such than that the their
    them then there these they this those through to too try trying under until up upon us use used using very
    want wants was way we well were what when where whether which while who whom why will with within without
    would yes yet you your yours thing things something anything work works working""".split()
)

DECLINE_PATTERNS = re.compile(
    r"|".join(
        [
            r"\bi (?:do not|don't|didn't|did not) (?:have|find|see|know)\b",
            r"\bi (?:could not|couldn't|can't|cannot|was unable to|am unable to|wasn't able to) find\b",
            r"\b(?:unable|not able) to find\b",
            r"\bno (?:relevant )?information (?:about|on|regarding|in)\b",
            r"\b(?:is|are) not (?:covered|documented|mentioned|described)\b",
            r"\b(?:isn't|aren't) (?:covered|documented|mentioned|described)\b",
            r"\bnot (?:covered|documented|mentioned) in the\b",
            r"\b(?:the )?(?:docs|documentation) (?:do not|don't|does not|doesn't) (?:mention|cover|say|describe|"
            r"document|explain|include)\b",
            r"\bnothing in the (?:docs|documentation|search results)\b",
            r"\bi'm not sure\b",
            r"\bi am not sure\b",
        ]
    ),
    re.IGNORECASE,
)

_WORD = re.compile(r"[a-z0-9][a-z0-9_\-]*[a-z0-9]|[a-z0-9]", re.IGNORECASE)
_URL = re.compile(r"https?://[^\s<>()\[\]`'\"]+")
_FLAG = re.compile(r"(?<![\w-])--[a-zA-Z][\w-]*")
_CODE = re.compile(r"`([^`\n]+)`")
_IDENT = re.compile(
    r"(?<![\w./-])(?:[A-Za-z_][\w-]*(?:[._/][A-Za-z0-9_-]+)+|[a-z]+[A-Z][A-Za-z0-9]*|[A-Za-z]+_[A-Za-z0-9_]+)"
)
_VERSION = re.compile(r"(?<![\w.])v?\d+\.\d+(?:\.\d+)*(?![\w.])")
_NUMBER = re.compile(r"(?<![\w.])\d{2,}(?![\w.])")


def _norm(word: str) -> str:
    word = word.lower()
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        word = word[:-1]
    return word


def key_terms(text: str) -> set[str]:
    """The question's content words, normalised."""
    return {
        _norm(w)
        for w in _WORD.findall(text)
        if len(w) >= 3 and w.lower() not in STOPWORDS and not w.isdigit()
    }


def coverage(terms: set[str], passage: Passage) -> float:
    if not terms:
        return 0.0
    words = {_norm(w) for w in _WORD.findall(f"{passage.title or ''} {passage.text}")}
    return len(terms & words) / len(terms)


def best_passage(terms: set[str], passages: Sequence[Passage]) -> tuple[Passage | None, float]:
    best: Passage | None = None
    best_cov = 0.0
    for passage in passages:
        cov = coverage(terms, passage)
        if cov > best_cov:
            best, best_cov = passage, cov
    return best, best_cov


def specifics(answer: str) -> list[str]:
    """The checkable specifics of an answer, in order of appearance, without repeats."""
    found: list[str] = []
    without_urls = _URL.sub(" ", answer)
    found += [u.rstrip(".,;:!?") for u in _URL.findall(answer)]
    found += _FLAG.findall(without_urls)
    found += [c.strip() for c in _CODE.findall(without_urls)]
    plain = _CODE.sub(" ", without_urls)
    found += [i.rstrip(".,;:") for i in _IDENT.findall(plain)]
    found += _VERSION.findall(plain)
    found += _NUMBER.findall(_VERSION.sub(" ", plain))
    return [s for s in dict.fromkeys(found) if s]


def _visible(text: str) -> str:
    return re.sub(r"\s+", " ", text).lower()


def unsupported(answer: str, seen: Iterable[str]) -> list[str]:
    """Specifics of `answer` that appear in none of the texts the agent saw."""
    haystack = _visible("\n".join(seen))
    missing = []
    for item in specifics(answer):
        needle = _visible(item)
        if needle in haystack:
            continue
        if " " in needle and all(tok in haystack for tok in needle.split() if len(tok) > 1):
            continue  # a code span made only of seen tokens (a command line, reworded)
        missing.append(item)
    return missing


_WORD_PART = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])")
#: words of code and markup that claim nothing on their own: an answer adds them when it formats
#: what it saw (`enabled: true`, `https://`, `pip install`, `name:`)
BOILERPLATE = frozenset(
    """true false null none yes http https www com org html yaml yml json txt name value key spec metadata kind
    type api pip install sudo tar zip""".split()
)


def word_parts(text: str) -> set[str]:
    """The words of `text` and of its identifiers (`earlyStopping` -> early, stopping;
    `max_concurrency` -> max, concurrency), lower case, three letters or more."""
    return {p.lower() for p in _WORD_PART.findall(text) if len(p) >= 3}


def unseen_words(specific: str, seen: set[str]) -> list[str]:
    """The words of an answer's specific that the agent never saw (`seen` from `word_parts` of all
    it saw), leaving out code and markup boilerplate: a specific built only of seen words
    (`runtimeRef.name` from "runtimeRef" and "name") may be a rewording, one with a new word names
    something the agent was never shown."""
    return sorted(w for w in word_parts(specific) - seen if w not in BOILERPLATE)


def seen_texts(trace: Trace) -> list[str]:
    """Everything the agent saw: the question, every tool call's arguments and output, the
    passages and their sources."""
    seen = [trace.question, *(c.output for c in trace.tool_calls), *(p.text for p in trace.passages)]
    seen += [p.source_url or "" for p in trace.passages]
    seen += [json.dumps(c.args, ensure_ascii=False) for c in trace.tool_calls]
    return seen


def declines(answer: str) -> bool:
    return DECLINE_PATTERNS.search(answer) is not None


@dataclass
class Signals:
    """What the cheap checks found; also used by the cascade judge."""

    terms: set[str]
    retrieved_best: Passage | None
    retrieved_coverage: float
    research_best: Passage | None
    research_coverage: float | None
    unsupported: list[str]
    declined: bool


def signals(trace: Trace, research: list[Passage] | None) -> Signals:
    terms = key_terms(trace.question)
    r_best, r_cov = best_passage(terms, trace.passages)
    s_best, s_cov = best_passage(terms, research) if research is not None else (None, None)
    seen = [trace.question, *(c.output for c in trace.tool_calls), *(p.text for p in trace.passages)]
    seen += [p.source_url or "" for p in trace.passages]
    return Signals(
        terms, r_best, r_cov, s_best, s_cov, unsupported(trace.answer, seen), declines(trace.answer)
    )


class HeuristicJudge:
    """Facts from key-term coverage, specifics and decline phrases. Needs no model."""

    name = "heuristic"
    prompt_version: str | None = "heuristic-1"
    needs_research = True
    #: grounding is free here (no model call), so `grounding=False` changes nothing
    can_skip_grounding = False

    def __init__(self, threshold: float = COVERAGE_THRESHOLD) -> None:
        self.threshold = threshold
        self.usage = Usage()

    async def aclose(self) -> None:
        """Nothing to release."""

    async def judge(
        self,
        trace: Trace,
        research: list[Passage] | None,
        comment: str | None,
        base: Facts,
        *,
        grounding: bool = True,
    ) -> Facts:
        sig = signals(trace, research)
        retrieved = sig.retrieved_best is not None and sig.retrieved_coverage >= self.threshold
        in_index: bool | None = None
        collection = None
        if sig.research_coverage is not None:
            in_index = sig.research_best is not None and sig.research_coverage >= self.threshold
            collection = sig.research_best.collection if in_index and sig.research_best else None
        holder = sig.retrieved_best if retrieved else (sig.research_best if in_index else None)
        evidence = {
            "retrieved_has_answer": Evidence(
                passage_ids=[sig.retrieved_best.id] if sig.retrieved_best else [],
                note=f"best key-term coverage {sig.retrieved_coverage:.2f}",
            ),
            "answer_grounded": Evidence(note=f"{len(sig.unsupported)} unsupported specifics"),
        }
        if sig.research_coverage is not None:
            evidence["index_has_answer"] = Evidence(
                passage_ids=[sig.research_best.id] if sig.research_best else [],
                note=f"best key-term coverage {sig.research_coverage:.2f}",
            )
        facts = base.model_copy(
            update={
                "retrieved_has_answer": retrieved,
                "index_has_answer": True if retrieved else in_index,
                "answer_collection": (holder.collection if holder else collection),
                "answer_grounded": not sig.unsupported,
                "answer_declined": sig.declined,
                "unsupported_claims": sig.unsupported,
                "answer_sources": [holder.source_url] if holder and holder.source_url else [],
                "evidence": evidence,
            }
        )
        return guard.flag(facts, guard.trace_findings(trace, research, comment))
