"""The LLM check judge's replies and what code verifies of them: the reply's strict schema (a verdict
per expectation asked, with quotes), and, for each expectation, the evidence a "pass" must carry
for code to accept it (`verify_pass`: quotes found in the answer that carry the correction's
values, a passage of a `must_cite` page the answer's words stand on, a decline cue, a tool call
shown...); `combine` joins the verdicts of an answer's parts. A pass that does not verify is
undecided with the reason."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from triage.domain.checks import AgentRun, CheckCase, ExpectationCheck
from triage.domain.kernel import one_line
from triage.domain.records import Confidence, Passage
from triage.judges.check_offline import offline_answers, offline_correction, offline_decline, offline_rests_on
from triage.judges.model.replies import strict_schema
from triage.judges.offline.check_evidence import (
    EVIDENCE_CHARS,
    digits_in,
    holds,
    numbers_in,
    page_of,
    prose_sentences,
    unticked,
)
from triage.judges.offline.claims import claim_anchors, correction_values, is_negative, offline_claim
from triage.judges.offline.declines import decline_cues
from triage.judges.offline.text import specifics, squash, word_set

#: what the model is asked about; `must_cite` is always code's
ModelAsked = Literal["correction", "answers", "rests_on", "must_not_claim", "decline", "tool_behavior"]


class _Reply(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CheckVerdict(_Reply):
    expectation: ModelAsked
    reasoning: str
    verdict: Literal["pass", "fail", "unsure"]
    #: exact substrings of the answer shown
    quotes: list[str]
    #: rests_on: the retrieved passage that backs the statement, and its words
    passage_id: str
    passage_quote: str
    #: tool_behavior: the call that does what the behaviour names
    call_id: str
    confidence: Literal["high", "low"]


class CheckReply(_Reply):
    injection_note: str
    injection_suspected: bool
    verdicts: list[CheckVerdict]


CHECK_SCHEMA: dict[str, Any] = strict_schema(CheckReply)


@dataclass
class Context:
    """What a pass is verified against: the case, the run, the whole answer as shown (cleaned), the
    passages and calls shown."""

    case: CheckCase
    run: AgentRun
    answer: str
    passages: dict[str, tuple[Passage, str]]
    calls: frozenset[str]


def required_values(correction: str, question: str) -> list[str]:
    """The correction's values code can look for, as the offline judge reads them
    (`check_offline.correction_values`, and the numbers it writes in digits), beyond the question's."""
    asked = squash(unticked(question))
    found = [s for s in correction_values(correction) if not holds(asked, s)]
    numbers = sorted(digits_in(unticked(correction)) - numbers_in(question))
    return found + [n for n in numbers if not any(n == squash(s) for s in found)]


#: "CPU/GPU", "Katib/Trainer": two names joined by a slash, each a value (not a path or a URL)
_SLASHED = re.compile(r"[A-Za-z][\w-]*(?:/[A-Za-z][\w-]*)+")


def _carries(text: str, value: str, question: str = "") -> bool:
    """`value` stated in `text`: a number whole (number words read as digits), a slashed pair of
    names as each of its names (the question's own names need not be restated), else as written."""
    if re.fullmatch(r"\d+(?:\.\d+)?", value):
        return value in numbers_in(unticked(text))
    have = squash(unticked(text))
    if holds(have, value):
        return True
    if _SLASHED.fullmatch(value) and "." not in value:
        asked = squash(unticked(question))
        names = [n for n in value.split("/") if not holds(asked, n)]
        return bool(names) and all(holds(have, n) for n in names)
    return False


def _quotes(verdicts: Sequence[CheckVerdict]) -> list[str]:
    return [q for v in verdicts for q in v.quotes if q.strip()]


def _verify_correction(verdicts: Sequence[CheckVerdict], ctx: Context) -> str | None:
    quotes = _quotes(verdicts)
    if not quotes:
        return "no quote states the correction"
    correction = ctx.case.expected.answer or ""
    values = required_values(correction, ctx.case.question)
    joined = "\n".join(quotes)
    missing = [v for v in values if not _carries(joined, v, ctx.case.question)]
    if missing:
        return f"the quotes do not carry {', '.join(missing[:4])} of the correction"
    if not values and all(decline_cues(q) for q in quotes):
        return "the quotes decline"
    offline = offline_correction(correction, ctx.case, ctx.run)
    if offline.passed is False:
        return f"code reads otherwise: {offline.evidence}"
    return None


def _verify_answers(verdicts: Sequence[CheckVerdict], ctx: Context) -> str | None:
    quotes = _quotes(verdicts)
    if not quotes:
        return "no quote of the sentence that answers"
    if not any(len(q.strip()) >= 12 and not decline_cues(q) for q in quotes):
        return "every quote declines or is too short to answer"
    offline = offline_answers(ctx.case, ctx.run)
    if offline.passed is False:
        return f"code reads otherwise: {offline.evidence}"
    return None


def _verify_decline(verdicts: Sequence[CheckVerdict], ctx: Context) -> str | None:
    quotes = _quotes(verdicts)
    if not any(decline_cues(q) for q in quotes):
        return "no quote carries a decline"
    offline = offline_decline(ctx.case, ctx.run)
    if offline.passed is False:
        return f"code reads otherwise: {offline.evidence}"
    return None


def _shares(statement: str, backing: str, question: str) -> bool:
    """A statement and a passage's words share a value (a specific or a number) of the statement,
    or `SHARED_WORDS` content words beyond the question's."""
    values = [s for s in specifics(unticked(statement)) if not s.startswith(("http://", "https://"))]
    if any(_carries(backing, v) for v in values):
        return True
    if numbers_in(unticked(statement)) & numbers_in(unticked(backing)) - numbers_in(question):
        return True
    shared = (word_set(unticked(statement)) & word_set(unticked(backing))) - word_set(question)
    return len(shared) >= SHARED_WORDS


def _verify_rests_on(verdicts: Sequence[CheckVerdict], ctx: Context) -> str | None:
    offline = offline_rests_on(ctx.case, ctx.run)
    if offline.passed is False:
        return f"code reads otherwise: {offline.evidence}"
    pages = {page_of(u) for u in ctx.case.expected.must_cite}
    reasons: list[str] = []
    for v in verdicts:
        shown = ctx.passages.get(v.passage_id)
        if shown is None:
            reasons.append("no passage named")
            continue
        passage, _ = shown
        if not passage.source_url or page_of(passage.source_url) not in pages:
            reasons.append(f"{v.passage_id} is not from the page(s) the case names")
            continue
        if not v.passage_quote.strip():
            reasons.append(f"no words quoted from {v.passage_id}")
            continue
        statements = [q for q in v.quotes if q.strip() and not decline_cues(q)]
        if not statements:
            reasons.append("no answer quote that states something (a decline rests on nothing)")
            continue
        if not any(_shares(q, v.passage_quote, ctx.case.question) for q in statements):
            reasons.append(
                f"the answer quote and the words of {v.passage_id} share no value or content words"
            )
            continue
        return None
    return "; ".join(dict.fromkeys(reasons)) or "no evidence"


def _verify_must_not_claim(verdicts: Sequence[CheckVerdict], ctx: Context) -> str | None:
    """Each claim is absent or rejected, as code reads the whole answer: no prose sentence makes it
    again (the offline reading), and where a sentence carries every anchor of the claim with its
    polarity, a quoted sentence of the other polarity carrying them rejects it."""
    quotes = _quotes(verdicts)
    sentences = prose_sentences(ctx.answer)
    for claim in ctx.case.expected.must_not_claim:
        found = offline_claim(claim, ctx.case, ctx.answer)
        if found.passed is False:
            return f"code reads {claim[:60]!r} made again: {found.evidence}"
        anchors = claim_anchors(claim, ctx.case.question)
        if not anchors:
            continue
        negative = is_negative(claim)
        touching = [s for s in sentences if is_negative(s) == negative and all(a.in_text(s) for a in anchors)]
        if not touching:
            continue
        rejecting = [q for q in quotes if is_negative(q) != negative and all(a.in_text(q) for a in anchors)]
        if not rejecting:
            return f'"{one_line(touching[0], 80)}" carries {claim[:60]!r} with its polarity and no quote rejects it'
    return None


def _verify_tool_behavior(verdicts: Sequence[CheckVerdict], ctx: Context) -> str | None:
    if any(v.call_id in ctx.calls for v in verdicts):
        return None
    return "no tool call named"


_VERIFY = {
    "correction": _verify_correction,
    "answers": _verify_answers,
    "rests_on": _verify_rests_on,
    "must_not_claim": _verify_must_not_claim,
    "decline": _verify_decline,
    "tool_behavior": _verify_tool_behavior,
}


def verify_pass(name: ModelAsked, verdicts: Sequence[CheckVerdict], ctx: Context) -> str | None:
    """None when code verifies the evidence of the passes `verdicts` give for `name`; else why not."""
    return _VERIFY[name](verdicts, ctx)


def _said(v: CheckVerdict) -> str:
    quotes = "; ".join(f'"{one_line(q, 100)}"' for q in v.quotes[:2] if q.strip())
    return (f"{quotes} " if quotes else "") + f"({one_line(v.reasoning, 140)})"


def combine(
    name: ModelAsked, verdicts: Sequence[tuple[int, CheckVerdict]], parts: int, ctx: Context
) -> ExpectationCheck:
    """One expectation's verdict from its verdicts over the parts shown (see the module docstring)."""

    def where(part: int) -> str:
        return f"part {part} of {parts}: " if parts > 1 else ""

    def check(passed: bool | None, evidence: str, confidence: Confidence = "low") -> ExpectationCheck:
        return ExpectationCheck(
            name=name, passed=passed, confidence=confidence, evidence=evidence[: EVIDENCE_CHARS * 2]
        )

    fails = [(p, v) for p, v in verdicts if v.verdict == "fail"]
    if fails:
        part, v = fails[0]
        return check(False, where(part) + _said(v), v.confidence)
    passes = [(p, v) for p, v in verdicts if v.verdict == "pass"]
    if not passes:
        part, v = verdicts[0]
        return check(None, where(part) + "unsure: " + _said(v))
    if name == "must_not_claim" and len(passes) < parts:
        missing = sorted(set(range(1, parts + 1)) - {p for p, _ in passes})
        return check(None, f"part {missing[0]} of {parts} is not passed: the whole answer is not cleared")
    if name in ("correction", "must_not_claim"):
        # their evidence is the answer's as a whole: the quotes of every part, taken together
        groups = [[v for _, v in passes]]
    else:
        groups = [[v] for _, v in passes]
    reasons: list[str] = []
    for group in groups:
        why = verify_pass(name, group, ctx)
        if why is None:
            first = group[0]
            return check(True, f"{_said(first)}; verified: {_VERIFIED[name]}", first.confidence)
        reasons.append(why)
    return check(None, f"the model's pass is not verified: {reasons[0]}. {_said(passes[0][1])}")


_VERIFIED = {
    "correction": "the quotes carry the correction's values",
    "answers": "the quoted sentence answers, no decline",
    "rests_on": "the statement shares its words with a passage of the page",
    "must_not_claim": "no sentence makes a claim again",
    "decline": "the quote declines, no invented specifics",
    "tool_behavior": "the call named was made",
}


#: a rests_on statement and its passage share a value, or this many content words beyond the question's
SHARED_WORDS = 2


