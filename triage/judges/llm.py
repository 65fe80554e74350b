"""The LLM judge: facts about one trace from any OpenAI-compatible chat model, verified in code.

Two calls per trace, run concurrently:

- call A, containment (`prompts/containment_*.j2`): the question, the user's comment (labelled as
  the complaint, not evidence) and the passage sets, agent-retrieved R1.. and re-searched S1..;
  never the answer, so the verdict is not anchored on it. Per set `contains_answer | partial |
  no_answer` with cited ids and quotes, plus the component picked from the catalogue.
  An empty set is not sent: it holds no answer, and code says so. Where no set holds the answer
  and a follow-up search is given (`search_more`), the model may name queries in the docs' own
  vocabulary; their new passages get one more call A of their own (at most one per trace).
- call B, grounding and declining (`prompts/grounding_*.j2`): the question, the tool calls with
  their outputs (T1..), the R passages and the answer; never the S passages, since grounding is
  judged against what the agent saw. Claims `supported | contradicted | unsupported` with cited
  ids and quotes; `grounded | ungrounded | no_factual_claims`; `declined` with a quote from the
  answer. Skipped when the agent made no search call (the rule then needs no more facts).

Facts the trace proves (whether the agent searched, which collections) come in `base` and are
never asked. The layer is never asked either: `rule.decide` maps the facts.

The parts: `llm_replies` (what the model is shown and may cite, and how its quotes are found;
reply models and their schemas; verification in code; replies to facts), `llm_transport` (requests,
retries, usage, and the verified exchange: a reply that fails the checks gets one more try, told
which checks failed, then `JudgeRejected`).
A component picked outside the catalogue fails no check: the pick is discarded with a logged note
and the layer facts of the reply stand.

Prompts are cache-friendly: each call's system message (instructions, the catalogue, the reply
format) and its reply schema are the same bytes for every call of its kind in a run, so a server's
prompt cache can serve them; what changes (the nonce, the sets asked, the data) is the user message,
after them. In batch mode (`batch`, `triage feedback --batch`) each call's first attempt is asked
through a round of the Batch API (`judges.model.rounds`); a verification retry goes directly.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import openai
from pydantic import BaseModel

from triage.domain.config import Component
from triage.domain.ports import JudgeRequest, SearchMore
from triage.domain.records import Facts, Passage, Trace, Usage
from triage.errors import ConfigError, JudgeError, JudgeRejected, leaves
from triage.judges import guard
from triage.judges.model import prompts
from triage.judges.model.exchange import RECENT_TRACES, ChatExchange, RecentUsage, StructuredMode, model_retry
from triage.judges.model.replies import (
    CAP_ANSWER,
    CAP_COMMENT,
    CAP_QUESTION,
    ContainmentReply,
    FactMaker,
    GroundingReply,
    PassageSet,
    containment_problems,
    containment_schema,
    grounding_problems,
    grounding_schema,
    passage_set,
    tool_blocks,
)
from triage.retry import Budget, Clock

if TYPE_CHECKING:
    from triage.judges.model.rounds import BatchCollector

TEMPLATES = (
    "containment_system.j2",
    "containment_user.j2",
    "grounding_system.j2",
    "grounding_user.j2",
    "verification_retry.j2",
)

T = TypeVar("T", bound=BaseModel)

log = logging.getLogger("triage.judges.llm")


class LLMJudge:
    """Facts from an OpenAI-compatible chat model. See the module docstring for the design."""

    needs_research = True
    #: a request with `grounding=False` makes call A only (the cascade asks so)
    can_skip_grounding = True

    def __init__(
        self,
        *,
        client: openai.AsyncOpenAI,
        model: str,
        components: dict[str, Component],
        concurrency: int = 16,
        timeout: float = 60.0,
        max_retries: int = 3,
        structured: StructuredMode = "auto",
        default_component: str = "general",
        partial_is_answer: bool = False,
        product: str = "Kubeflow",
        backoff_base: float = 1.0,
        backoff_max: float = 30.0,
        clock: Clock | None = None,
        budget: Budget | None = None,
        recent_traces: int = RECENT_TRACES,
        search_again: int = 2,
        batch: BatchCollector | None = None,
    ) -> None:
        if not components:
            raise ConfigError("the LLM judge needs a component catalogue")
        self.model = model
        self.name = f"llm:{model}"
        self.prompt_version: str | None = prompts.prompt_version(TEMPLATES)
        #: usage per trace id, of the most recent traces only (O(1) in the run; totals: `usage`)
        self.usage_by_trace = RecentUsage(recent_traces)
        self.components = components
        self.default_component = (
            default_component if default_component in components else next(iter(components))
        )
        self.product = product
        #: queries of its own the model may have searched where no set shown holds the answer
        self.search_again = search_again
        self.facts = FactMaker(components, partial_is_answer)
        retry = model_retry(max_retries, backoff_base, backoff_max, clock, budget)
        if batch is not None:
            from triage.judges.model.batch import BatchRunner

            batch.attach(BatchRunner(client, retry=retry, metadata={"job": "triage feedback"}))
        self.batch = batch
        self.exchange = ChatExchange(
            client=client,
            model=model,
            retry=retry,
            concurrency=concurrency,
            timeout=timeout,
            structured=structured,
            batch=batch,
        )
        # the same for every call of a kind, so built once (and a cacheable prefix: no nonce in it)
        catalogue = [
            (name, ", ".join(c.keywords) if c.keywords else "(anything else)") for name, c in components.items()
        ]
        self._containment_system = prompts.render(
            "containment_system.j2",
            product=product,
            catalogue=catalogue,
            default_component=self.default_component,
        )
        self._grounding_system = prompts.render("grounding_system.j2", product=product)
        self._containment_schema = containment_schema(list(components))

    @property
    def usage(self) -> Usage:
        """Answered model calls and tokens, all traces."""
        return self.exchange.usage

    @property
    def requests(self) -> int:
        """HTTP requests made, including failed ones (usage.calls counts answered ones)."""
        return self.exchange.requests

    @property
    def structured_mode(self) -> str:
        """The response format in use (after any downgrade)."""
        return self.exchange.mode

    async def aclose(self) -> None:
        """Close the model client's connections (on the loop that opened them)."""
        if self.batch is not None:
            await self.batch.aclose()
        await self.exchange.aclose()

    async def judge(self, request: JudgeRequest) -> Facts:
        """`request.base` completed with the judged facts. With `grounding=False` (or no search
        call) call B is not made and `answer_grounded`/`answer_declined` stay as in `base`; with
        `containment=False` call A is not made and the containment facts stay as in `base` (a
        cascade that settled them)."""
        trace, research, comment, base = request.trace, request.research, request.comment, request.base
        usage = self.usage_by_trace.start(trace.id)
        findings = guard.trace_findings(trace, research, comment)
        try:
            # both calls at once (half the latency per trace); one failing cancels the other
            async with asyncio.TaskGroup() as group:
                task_a = (
                    group.create_task(
                        self._containment_searching(trace, research, comment, usage, request.search_more)
                    )
                    if request.containment or not base.agent_searched
                    else None
                )
                task_b = (
                    group.create_task(self._grounding(trace, usage))
                    # an empty answer has nothing to ground or decline: the engine settles both
                    if base.agent_searched and request.grounding and trace.answer.strip()
                    else None
                )
        except BaseExceptionGroup as group_error:
            raise _first_error(group_error) from None
        grounded_reply = task_b.result() if task_b else None
        if task_a is None:
            return self.facts.facts(base, findings, grounding=grounded_reply)
        reply, r_set, s_set, found = task_a.result()
        if found:  # the judge's own search brought passages the detector has not read yet
            findings += guard.passage_findings(found)
        if reply.component.name not in self.components:
            # not a reason to reject the reply: the pick is discarded, the layer facts stand
            log.info(
                "trace %s: the model picked component %r, which is not in the catalogue; discarded",
                trace.id,
                reply.component.name[:60],
                extra={"event": "component_discarded"},
            )
        return self.facts.facts(base, findings, grounding=grounded_reply, containment=(reply, r_set, s_set))

    # -- call A ---------------------------------------------------------------------------------

    async def _containment_searching(
        self,
        trace: Trace,
        research: list[Passage] | None,
        comment: str | None,
        usage: Usage,
        search_more: SearchMore | None,
    ) -> tuple[ContainmentReply, PassageSet, PassageSet | None, list[Passage]]:
        """Call A, and where no set holds the answer and the model names queries in the docs'
        vocabulary, those searched and call A asked again over the new passages (numbered on from
        the re-search's S ids; never the answer) and the re-searched ones its `partial` verdict
        cited: the one way past a question whose words are not the docs' words. Also returns the
        new passages, for the injection detector."""
        asking = self.search_again if search_more is not None and research is not None else 0
        reply, r_set, s_set = await self._containment(trace, research, comment, usage, search_again=asking)
        queries = [q for q in (reply.search_again.queries if reply.search_again else []) if q.strip()]
        if not asking or not queries or s_set is None or self._answered(reply, r_set, s_set):
            return reply, r_set, s_set, []
        assert search_more is not None
        found = await search_more(queries[:asking])
        if not found:
            return reply, r_set, s_set, []
        # the re-searched passages the first reply found part of the answer in are shown again with
        # the new ones: an answer split across two chunks of a page, one re-searched and one found
        # by the follow-up, is whole only where both are seen together
        carried = self._partly(reply, research)
        try:
            more, _, more_set = await self._containment(trace, None, comment, usage, only=[*carried, *found])
        except JudgeError as ex:  # rejected or unavailable; a ConfigError (a bad key) still stops the run
            # extra evidence that failed: the first reply stands, the new passages are still read
            log.info("trace %s: the follow-up call failed (%s); the first verdict stands", trace.id, ex)
            return reply, r_set, s_set, found
        if more_set is None or not more_set.passages or more.research is None:
            return reply, r_set, s_set, found
        log.info(
            "trace %s: the judge searched %d queries of its own; %d new passages, %s",
            trace.id,
            len(queries[:asking]),
            len(found),
            more.research.verdict,
            extra={"event": "judge_search"},
        )
        merged = self._with_more(reply, s_set, more, queries[:asking])
        return merged, r_set, s_set.joined(more_set), found

    @staticmethod
    def _partly(reply: ContainmentReply, research: list[Passage] | None) -> list[Passage]:
        """The re-searched passages the reply cites for a `partial` verdict (none for another)."""
        if reply.research is None or reply.research.verdict != "partial" or not research:
            return []
        cited = {q.passage_id for q in reply.research.evidence}
        return [p for p in research if p.id in cited]

    def _answered(self, reply: ContainmentReply, r_set: PassageSet, s_set: PassageSet) -> bool:
        verdicts = [reply.retrieved if r_set.passages else None, reply.research if s_set.passages else None]
        return any(v is not None and self.facts.maps_to_answer(v) for v in verdicts)

    @staticmethod
    def _with_more(
        reply: ContainmentReply, s_set: PassageSet, more: ContainmentReply, queries: list[str]
    ) -> ContainmentReply:
        """`reply` with the re-search's verdict taken from the follow-up where it says more (an
        answer, or part of one, where there was less); injection flags from either."""
        rank = {"no_answer": 0, "partial": 1, "contains_answer": 2}
        before = reply.research if s_set.passages else None
        after = more.research
        assert after is not None
        update: dict[str, Any] = {
            "injection_suspected": reply.injection_suspected or more.injection_suspected,
            "injection_note": "; ".join(n for n in (reply.injection_note, more.injection_note) if n),
        }
        if before is None or rank[after.verdict] > rank[before.verdict]:
            searched = "; ".join(json.dumps(q[:80], ensure_ascii=False) for q in queries)
            update["research"] = after.model_copy(
                update={"reasoning": f"after the judge searched {searched}: {after.reasoning}"}
            )
        return reply.model_copy(update=update)

    async def _containment(
        self,
        trace: Trace,
        research: list[Passage] | None,
        comment: str | None,
        usage: Usage,
        *,
        search_again: int = 0,
        only: list[Passage] | None = None,
    ) -> tuple[ContainmentReply, PassageSet, PassageSet | None]:
        """One call A. `only`: a follow-up over these passages alone, asked as the research set."""
        nonce = prompts.new_nonce()
        # what does not fit is chosen by relevance to the question (never to the answer: not shown here)
        focus = trace.question
        r_set = passage_set("retrieved", "R", trace.passages, nonce, focus)
        s_set = passage_set("research", "S", research, nonce, focus) if research is not None else None
        asked = [s for s in (r_set, s_set) if s is not None and s.passages]
        if only is not None:
            s_set = passage_set("research", "S", only, nonce, focus)
            asked = [s_set]
        user = prompts.render(
            "containment_user.j2",
            nonce=nonce,
            question=prompts.encode(prompts.clean(trace.question, CAP_QUESTION, nonce)),
            comment=prompts.encode(prompts.clean(comment, CAP_COMMENT, nonce) if comment else None),
            sets=asked,
            search_again=search_again,
        )
        reply = await self._ask(
            "containment",
            self._containment_system,
            user,
            self._containment_schema,
            ContainmentReply,
            lambda r: containment_problems(r, asked),
            usage,
            trace.id,
        )
        return reply, r_set, s_set

    # -- call B ---------------------------------------------------------------------------------

    async def _grounding(self, trace: Trace, usage: Usage) -> GroundingReply:
        nonce = prompts.new_nonce()
        # the answer's claims are what must be found: what does not fit is chosen by relevance to both
        focus = f"{trace.question}\n{trace.answer}"
        r_set = passage_set("retrieved", "R", trace.passages, nonce, focus)
        calls, t_blocks = tool_blocks(trace, nonce, focus)
        answer = prompts.clean(trace.answer, CAP_ANSWER, nonce)
        user = prompts.render(
            "grounding_user.j2",
            nonce=nonce,
            question=prompts.encode(prompts.clean(trace.question, CAP_QUESTION, nonce)),
            tool_calls=calls,
            passages=r_set.passages,
            answer=prompts.encode(answer),
        )
        blocks = {**r_set.blocks, **t_blocks}
        return await self._ask(
            "grounding",
            self._grounding_system,
            user,
            grounding_schema(),
            GroundingReply,
            lambda r: grounding_problems(r, blocks, answer),
            usage,
            trace.id,
        )

    # -- one verified exchange --------------------------------------------------------------------

    async def _ask(
        self,
        call: str,
        system: str,
        user: str,
        schema: dict[str, Any],
        reply_type: type[T],
        verify: Callable[[T], list[str]],
        usage: Usage,
        trace_id: str,
    ) -> T:
        messages: list[dict[str, str]] = [
            {"role": "system", "content": system},
            {"role": "user", "content": user},
        ]
        return await self.exchange.verified(
            call,
            messages,
            schema,
            reply_type,
            verify,
            usage,
            trace_id=trace_id,
            what=f"{call} reply for trace {trace_id}",
        )


def _first_error(group: BaseExceptionGroup) -> BaseException:
    """The error to raise for a failed call pair: a rejection or a config error before the rest."""
    errors = leaves(group)
    for kind in (ConfigError, JudgeRejected, JudgeError):
        for error in errors:
            if isinstance(error, kind):
                return error
    return errors[0]
