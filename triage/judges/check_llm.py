"""The LLM check judge (`LLMCheckJudge`): a regression case's expectations that code cannot
decide, asked of an OpenAI-compatible model and verified in code (see
`triage.judges.CHECK_JUDGES`).

A model's word is never a pass. Each pass comes with evidence that code checks (`verify_pass`):
quotes that are exact substrings of the answer and carry what the expectation needs (the
correction's values, a decline cue, a passage of the `must_cite` page sharing the statement's
values or words, a tool call's id), and no contrary reading by code (the offline judge's:
a correction's value missing or swapped, a forbidden claim's sentence made again, a decline that
invents, an answer that declines, a statement the page contradicts). A pass whose evidence does not
hold is undecided, with the reason; a fail stands. Measured with a model that lies with the best
evidence it can find (the perfect check model's, every expectation passed): 17 of the 76 wrong
answers of evals/check still pass (meaning, not strings: a right value weakened by a caveat), so the
injection guard (`judges.guard.check_injection_findings`) stays the first line.

The whole answer is judged: one longer than `CAP_ANSWER` is shown in overlapping parts
(`answer_parts`), one call per part, and the verdicts combine (`combine`): a fail in any part fails;
`must_not_claim` passes only when every part passes; any other expectation passes when a part's
evidence verifies (a correction's quotes taken together across the parts); else undecided.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import openai
from pydantic import BaseModel, ConfigDict

from triage.domain.checks import AgentRun, CheckCase, ExpectationCheck, ExpectationName
from triage.domain.kernel import one_line
from triage.domain.records import Confidence, Passage, Usage
from triage.errors import JudgeRejected
from triage.judges.check_offline import offline_answers, offline_correction, offline_decline, offline_rests_on
from triage.judges.model import prompts
from triage.judges.model.exchange import ChatExchange, StructuredMode, model_retry
from triage.judges.model.replies import quote_found, strict_schema
from triage.judges.offline.check_evidence import (
    EVIDENCE_CHARS,
    answer_findings,
    check_must_cite,
    check_tool_behavior,
    collection_of,
    digits_in,
    guarded,
    holds,
    no_answer,
    numbers_in,
    page_of,
    prose_sentences,
    unticked,
)
from triage.judges.offline.claims import claim_anchors, correction_values, is_negative, offline_claim
from triage.judges.offline.declines import decline_cues
from triage.judges.offline.text import specifics, squash, word_set
from triage.retry import Budget, Clock

# -- the LLM judge -----------------------------------------------------------------------------------

TEMPLATES = ("check_system.j2", "check_user.j2", "verification_retry.j2")
#: what the model is asked about; `must_cite` is always code's
ModelAsked = Literal["correction", "answers", "rests_on", "must_not_claim", "decline", "tool_behavior"]
CAP_QUESTION = 2000
CAP_EXPECTATION = 2000
#: the answer shown in one call; a longer one is shown in parts overlapping by `PART_OVERLAP`
CAP_ANSWER = 8000
PART_OVERLAP = 1500
#: an answer needing more parts than this is not shown whole: no pass can be earned on it
MAX_PARTS = 6
CAP_PASSAGE = 2500
CAP_URL = 500
MAX_PASSAGES = 12
MAX_CALLS = 12
#: a quote is a sentence or a list item, never the whole answer (evidence must point somewhere)
MAX_QUOTE_CHARS = 600
MAX_QUOTES = 6
#: a rests_on statement and its passage share a value, or this many content words beyond the question's
SHARED_WORDS = 2


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
class _Shown:
    """One call's data: the blocks as the model saw them (quotes are checked against them)."""

    names: list[ModelAsked]
    #: the part of the answer shown (cleaned), and which part of how many
    answer: str
    part: int
    parts: int
    user: str
    #: passage id -> the passage and its text as shown
    passages: dict[str, tuple[Passage, str]] = field(default_factory=dict)
    calls: frozenset[str] = frozenset()


def answer_parts(answer: str, cap: int = CAP_ANSWER, overlap: int = PART_OVERLAP) -> list[str]:
    """`answer` in windows of at most `cap` characters, each overlapping the next by about `overlap`
    (so a sentence cut at one window's end is whole in the next), cut at a line break, a sentence
    end or a space where one is near."""
    if len(answer) <= cap:
        return [answer]
    parts: list[str] = []
    start = 0
    while start < len(answer):
        end = start + cap
        if end >= len(answer):
            parts.append(answer[start:])
            break
        floor = end - overlap // 2
        cut = max(answer.rfind("\n", floor, end), answer.rfind(". ", floor, end) + 1)
        if cut <= floor:
            cut = answer.rfind(" ", floor, end)
        cut = cut if cut > floor else end
        parts.append(answer[start:cut])
        nxt = cut - overlap
        space = re.search(r"[\n.!?]\s|\s", answer[nxt : nxt + 200])
        start = nxt + space.end() if space else nxt
    return parts


def check_problems(reply: CheckReply, shown: _Shown) -> list[str]:
    """What a reply gets wrong in form, in code (expectation names and check names only, never
    quoted text): the verdicts asked, each quote an exact substring of the block it cites, each id
    one shown. A pass whose evidence does not carry what it must is judged later (`verify_pass`)."""
    problems: list[str] = []
    given = [v.expectation for v in reply.verdicts]
    for name in shown.names:
        n = given.count(name)
        if n != 1:
            problems.append(f'"{name}" needs exactly one verdict, the reply has {n}')
    for name in sorted(set(given) - set(shown.names)):
        problems.append(f'"{name}" was not asked about')
    for v in reply.verdicts:
        what = f'"{v.expectation}"'
        quotes = [q for q in v.quotes if q.strip()]
        if len(quotes) > MAX_QUOTES:
            problems.append(f"{what}: at most {MAX_QUOTES} quotes")
        if any(len(q) > MAX_QUOTE_CHARS for q in quotes):
            problems.append(
                f"{what}: a quote is at most {MAX_QUOTE_CHARS} characters (a sentence, not the answer)"
            )
        if any(not quote_found(q, shown.answer) for q in quotes):
            problems.append(f"{what}: a quote is not an exact substring of the answer")
        if v.passage_id and v.passage_id not in shown.passages:
            problems.append(f"{what}: passage_id names no passage shown")
        elif v.passage_quote.strip():
            if not v.passage_id:
                problems.append(f"{what}: a passage_quote needs its passage_id")
            elif not quote_found(v.passage_quote, shown.passages[v.passage_id][1]):
                problems.append(f"{what}: the passage_quote is not an exact substring of {v.passage_id}")
        if v.call_id and v.call_id not in shown.calls:
            problems.append(f"{what}: call_id names no tool call shown")
        if v.expectation == "must_not_claim" and v.verdict == "fail" and not quotes:
            problems.append('"must_not_claim" fail needs the quote that makes the claim again')
        if v.expectation == "decline" and v.verdict == "pass" and not quotes:
            problems.append('"decline" pass needs the quote that declines')
    return problems


# -- what code verifies of a pass ------------------------------------------------------------------------


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


class LLMCheckJudge:
    """Decides a case's expectations with an OpenAI-compatible model, verified in code (see the
    module docstring). `tools`: tool name -> the collection it searches."""

    def __init__(
        self,
        *,
        client: openai.AsyncOpenAI,
        model: str,
        tools: Mapping[str, str] | None = None,
        concurrency: int = 16,
        timeout: float = 60.0,
        max_retries: int = 3,
        structured: StructuredMode = "auto",
        product: str = "Kubeflow",
        backoff_base: float = 1.0,
        backoff_max: float = 30.0,
        clock: Clock | None = None,
        budget: Budget | None = None,
    ) -> None:
        self.model = model
        self.name = f"llm:{model}"
        self.prompt_version: str | None = prompts.prompt_version(TEMPLATES)
        self.tools: Mapping[str, str] = dict(tools or {})
        self.product = product
        retry = model_retry(max_retries, backoff_base, backoff_max, clock, budget)
        self.exchange = ChatExchange(
            client=client,
            model=model,
            retry=retry,
            concurrency=concurrency,
            timeout=timeout,
            structured=structured,
        )
        #: the instructions, the same bytes for every call (the prompt cache's prefix)
        self.system = prompts.render("check_system.j2", product=product)

    @property
    def usage(self) -> Usage:
        return self.exchange.usage

    async def aclose(self) -> None:
        await self.exchange.aclose()

    async def check(self, case: CheckCase, run: AgentRun) -> list[ExpectationCheck]:
        failed = no_answer(case, run)
        if failed is not None:
            return failed
        exp = case.expected
        decided: dict[ExpectationName, ExpectationCheck] = {}
        asked: list[ModelAsked] = []
        for name in exp.names():
            if name == "must_cite":
                decided[name] = check_must_cite(exp.must_cite, run)
            elif name == "tool_behavior":
                found = check_tool_behavior(exp.tool_behavior or "", run, self.tools)
                if found is not None:
                    decided[name] = found
                else:
                    asked.append("tool_behavior")
            elif name == "rests_on":
                unseen = _page_unseen(case, run)
                if unseen is not None:
                    decided[name] = unseen
                else:
                    asked.append(name)
            else:
                asked.append(name)
        findings = answer_findings(run, case.question)
        # what code read of the run stays whatever its words say; a model's pass does not
        by_code = [n for n in decided if n in ("must_cite", "tool_behavior")]
        if asked:
            decided.update(await self._ask_model(case, run, asked))
        return guarded([decided[n] for n in exp.names()], findings, by_code)

    async def _ask_model(
        self, case: CheckCase, run: AgentRun, asked: list[ModelAsked]
    ) -> dict[ExpectationName, ExpectationCheck]:
        # the whole answer, cleaned once: every part shown is a window of it, and code reads it whole
        answer = prompts.check_clean(run.answer or "", len(run.answer or "") + 1)
        parts = answer_parts(answer)
        shown_parts = parts[:MAX_PARTS]
        shown = [
            self._render(case, run, asked, text, n, len(shown_parts)) for n, text in enumerate(shown_parts, 1)
        ]
        try:
            replies = await asyncio.gather(*(self._verified(s) for s in shown))
        except JudgeRejected as ex:
            reason = one_line(str(ex), 200)
            return {n: ExpectationCheck(name=n, passed=None, evidence=f"undecided: {reason}") for n in asked}
        ctx = Context(case, run, answer, shown[0].passages, shown[0].calls)
        flagged = [r.injection_note for r in replies if r.injection_suspected]
        out: dict[ExpectationName, ExpectationCheck] = {}
        for name in asked:
            verdicts = [(n, v) for n, r in enumerate(replies, 1) for v in r.verdicts if v.expectation == name]
            result = combine(name, verdicts, len(shown), ctx)
            if result.passed is True and len(parts) > MAX_PARTS:
                result = result.model_copy(
                    update={
                        "passed": None,
                        "confidence": "low",
                        "evidence": f"the answer needs {len(parts)} parts, only {MAX_PARTS} are shown",
                    }
                )
            if result.passed is True and flagged:
                # the model saw text that tries to instruct it: its pass is not enough
                result = result.model_copy(
                    update={
                        "passed": None,
                        "confidence": "low",
                        "evidence": f"the model suspects an injection ({one_line(flagged[0], 80)}); {result.evidence}"[
                            : EVIDENCE_CHARS * 2
                        ],
                    }
                )
            out[name] = result
        return out

    async def _verified(self, shown: _Shown) -> CheckReply:
        messages = [{"role": "system", "content": self.system}, {"role": "user", "content": shown.user}]
        return await self.exchange.verified(
            "check",
            messages,
            CHECK_SCHEMA,
            CheckReply,
            lambda reply: check_problems(reply, shown),
            Usage(),
            what="the check reply",
        )

    def _render(
        self, case: CheckCase, run: AgentRun, asked: list[ModelAsked], answer: str, part: int, parts: int
    ) -> _Shown:
        nonce = prompts.new_nonce()

        def data(value: Any, limit: int) -> str:
            return prompts.encode(prompts.check_clean_value(value, limit, nonce))

        exp = case.expected
        expectations: list[dict[str, str]] = []
        for name in asked:
            value: Any
            if name == "correction":
                value = {"corrected_answer": exp.answer}
            elif name == "answers":
                value = {"answers": True}
            elif name == "rests_on":
                value = {"pages": exp.must_cite}
            elif name == "must_not_claim":
                value = {"claims": exp.must_not_claim}
            elif name == "decline":
                value = {"decline": True}
            else:
                value = {"tool_behavior": exp.tool_behavior}
            expectations.append({"name": name, "data": data(value, CAP_EXPECTATION)})
        answer = prompts.check_clean(answer, CAP_ANSWER + 1, nonce)
        passages: list[dict[str, str]] = []
        shown_passages: dict[str, tuple[Passage, str]] = {}
        if "decline" in asked or "rests_on" in asked:
            for n, p in enumerate(run.retrieved[:MAX_PASSAGES], start=1):
                # the ids shown are ours, by position: an agent's own id is untrusted text, never an attribute
                pid = f"R{n}"
                text = prompts.check_clean(p.text, CAP_PASSAGE, nonce)
                value = {
                    "source": prompts.check_clean(p.source_url or "", CAP_URL, nonce),
                    "collection": prompts.check_clean(p.collection or "", 100, nonce),
                    "title": prompts.check_clean(p.title or "", 300, nonce),
                    "text": text,
                }
                passages.append({"id": pid, "data": prompts.encode(value)})
                shown_passages[pid] = (p, text)
        calls: list[dict[str, str]] = []
        if "tool_behavior" in asked and run.tool_calls is not None:
            for n, c in enumerate(run.tool_calls[:MAX_CALLS], start=1):
                value = {"tool": c.name, "collection": collection_of(c, self.tools), "arguments": c.args}
                calls.append({"id": f"T{n}", "data": data(value, 500)})
        user = prompts.render(
            "check_user.j2",
            nonce=nonce,
            question=data(case.question, CAP_QUESTION),
            expectations=expectations,
            answer=prompts.encode(answer),
            part=part,
            parts=parts,
            sources=data(run.sources[:20], CAP_URL),
            passages=passages,
            show_calls="tool_behavior" in asked,
            calls=calls,
        )
        return _Shown(asked, answer, part, parts, user, shown_passages, frozenset(c["id"] for c in calls))


def _page_unseen(case: CheckCase, run: AgentRun) -> ExpectationCheck | None:
    """`rests_on` where code can say it without a model: no passage of the page was retrieved, so
    nothing the answer says can be shown to rest on it (undecided when the answer cites the page,
    a fail when it neither cites nor retrieved it)."""
    pages = {page_of(u) for u in case.expected.must_cite}
    if any(p.source_url and page_of(p.source_url) in pages for p in run.retrieved[:MAX_PASSAGES]):
        return None
    cited = check_must_cite(case.expected.must_cite, run)
    if cited.passed is True:
        return ExpectationCheck(
            name="rests_on",
            passed=None,
            evidence="the answer cites the page, but none of its text was retrieved: nothing to check it against",
        )
    return ExpectationCheck(
        name="rests_on",
        passed=False if cited.passed is False else None,
        confidence="high" if cited.passed is False else "low",
        evidence=f"no passage of the page was retrieved: {cited.evidence}"[:EVIDENCE_CHARS],
    )
