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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import openai

from triage.domain.checks import AgentRun, CheckCase, ExpectationCheck, ExpectationName
from triage.domain.kernel import one_line
from triage.domain.records import Passage, Usage
from triage.errors import JudgeRejected
from triage.judges.check_replies import CHECK_SCHEMA, CheckReply, Context, ModelAsked, combine
from triage.judges.model import prompts
from triage.judges.model.exchange import ChatExchange, StructuredMode, model_retry
from triage.judges.model.replies import quote_found
from triage.judges.offline.check_evidence import (
    EVIDENCE_CHARS,
    answer_findings,
    check_must_cite,
    check_tool_behavior,
    collection_of,
    guarded,
    no_answer,
    page_of,
)
from triage.retry import Budget, Clock

# -- the LLM judge -----------------------------------------------------------------------------------

TEMPLATES = ("check_system.j2", "check_user.j2", "verification_retry.j2")
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
