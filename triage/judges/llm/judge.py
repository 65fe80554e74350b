"""The LLM judge: facts about one trace from any OpenAI-compatible chat model, verified in code.

Two calls per trace, run concurrently:

- call A, containment (`prompts/containment_*.j2`): the question, the user's comment (labelled as
  the complaint, not evidence) and the passage sets, agent-retrieved R1.. and re-searched S1..;
  never the answer, so the verdict is not anchored on it. Per set `contains_answer | partial |
  no_answer` with cited ids and quotes, plus the component picked from the catalogue.
  An empty set is not sent: it holds no answer, and code says so.
- call B, grounding and declining (`prompts/grounding_*.j2`): the question, the tool calls with
  their outputs (T1..), the R passages and the answer; never the S passages, since grounding is
  judged against what the agent saw. Claims `supported | contradicted | unsupported` with cited
  ids and quotes; `grounded | ungrounded | no_factual_claims`; `declined` with a quote from the
  answer. Skipped when the agent made no search call (the rule then needs no more facts).

Facts the trace proves (whether the agent searched, which collections) come in `base` and are
never asked. The layer is never asked either: `rule.decide` maps the facts.

Checks in code, after every reply: JSON valid against the reply model; cited ids exist in the
right set; each quote is an exact substring (after whitespace normalisation) of the block it
cites; `contains_answer` carries at least one quote; the component is in the catalogue. A reply
that fails gets one more try (told which checks failed), then `JudgeRejected`.

`partial` maps to "does not contain the answer" by default (`partial_is_answer=False`): a set
that only partly answers is a retrieval miss when the index holds the whole answer, and a content
gap when it does not. The raw verdict is kept in the evidence note, so a replay can remap it.

Transport: the openai client's own retries are off (`max_retries=0`); this module retries 429,
5xx, timeouts, connection errors and malformed replies (invalid JSON, refusals, wrong shape)
itself with exponential backoff (honouring `Retry-After`), so every attempt passes the judge's
own semaphore and is counted. After `max_retries` retries: `JudgeError` (unavailable), or
`JudgeRejected` when the model kept answering unusable output.

Structured output: `auto` tries a strict `json_schema`; a 400 that names the response format
downgrades the judge (once, for all later calls) to `json_object`, then to plain JSON parsing.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any, Literal, TypeVar

import openai
from pydantic import BaseModel, ConfigDict, ValidationError

from triage.domain.config import Component
from triage.domain.records import Evidence, Facts, Passage, Trace, Usage
from triage.errors import ConfigError, JudgeError, JudgeRejected, leaves
from triage.judges import prompts

StructuredMode = Literal["auto", "json_schema", "json_object", "none"]
_MODES: tuple[Literal["json_schema", "json_object", "none"], ...] = ("json_schema", "json_object", "none")

TEMPLATES = (
    "containment_system.j2",
    "containment_user.j2",
    "grounding_system.j2",
    "grounding_user.j2",
    "verification_retry.j2",
)

# Field caps (characters). They bound the prompt (about 8k tokens for a typical trace) and stop a
# huge tool output from crowding out the rest.
CAP_QUESTION = 2000
CAP_COMMENT = 1000
CAP_ANSWER = 8000
CAP_PASSAGE = 2000
CAP_TITLE = 300
CAP_URL = 500
CAP_TOOL_OUTPUT = 3000
CAP_TOOL_ARG = 500
MAX_PASSAGES = 24
MAX_TOOL_CALLS = 12
MIN_QUOTE_CHARS = 8

_ID = re.compile(r"^[A-Za-z]{1,4}\d{1,4}$")


# --- the replies the model must give -----------------------------------------------------------


class _Reply(BaseModel):
    model_config = ConfigDict(extra="forbid")


Confidence = Literal["high", "medium", "low"]


class Quote(_Reply):
    passage_id: str
    quote: str


class SetVerdict(_Reply):
    reasoning: str
    verdict: Literal["contains_answer", "partial", "no_answer"]
    evidence: list[Quote]
    confidence: Confidence


class ComponentPick(_Reply):
    reasoning: str
    name: str


class ContainmentReply(_Reply):
    injection_note: str
    injection_suspected: bool
    retrieved: SetVerdict | None = None
    research: SetVerdict | None = None
    component: ComponentPick


class Claim(_Reply):
    claim: str
    status: Literal["supported", "contradicted", "unsupported"]
    source_id: str
    quote: str


class GroundingVerdict(_Reply):
    reasoning: str
    verdict: Literal["grounded", "ungrounded", "no_factual_claims"]
    confidence: Confidence


class DeclineVerdict(_Reply):
    reasoning: str
    verdict: Literal["declined", "not_declined"]
    quote: str
    confidence: Confidence


class GroundingReply(_Reply):
    injection_note: str
    injection_suspected: bool
    claims: list[Claim]
    grounding: GroundingVerdict
    declined: DeclineVerdict


def _obj(properties: dict[str, Any]) -> dict[str, Any]:
    # strict structured output: every property required, nothing else allowed
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


_STR = {"type": "string"}
_CONF = {"type": "string", "enum": ["high", "low"]}


def containment_schema(sets: Sequence[str], components: Sequence[str]) -> dict[str, Any]:
    set_schema = _obj(
        {
            "reasoning": _STR,
            "verdict": {"type": "string", "enum": ["contains_answer", "partial", "no_answer"]},
            "evidence": {"type": "array", "items": _obj({"passage_id": _STR, "quote": _STR})},
            "confidence": _CONF,
        }
    )
    props: dict[str, Any] = {"injection_note": _STR, "injection_suspected": {"type": "boolean"}}
    props.update({key: set_schema for key in sets})
    props["component"] = _obj({"reasoning": _STR, "name": {"type": "string", "enum": list(components)}})
    return _obj(props)


def grounding_schema() -> dict[str, Any]:
    return _obj(
        {
            "injection_note": _STR,
            "injection_suspected": {"type": "boolean"},
            "claims": {
                "type": "array",
                "items": _obj(
                    {
                        "claim": _STR,
                        "status": {"type": "string", "enum": ["supported", "contradicted", "unsupported"]},
                        "source_id": _STR,
                        "quote": _STR,
                    }
                ),
            },
            "grounding": _obj(
                {
                    "reasoning": _STR,
                    "verdict": {"type": "string", "enum": ["grounded", "ungrounded", "no_factual_claims"]},
                    "confidence": _CONF,
                }
            ),
            "declined": _obj(
                {
                    "reasoning": _STR,
                    "verdict": {"type": "string", "enum": ["declined", "not_declined"]},
                    "quote": _STR,
                    "confidence": _CONF,
                }
            ),
        }
    )


# --- quote checks ------------------------------------------------------------------------------

_QUOTE_CHARS = str.maketrans(
    {"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2013": "-", "\u2014": "-", "\u00a0": " "}
)


def normalise(text: str) -> str:
    """Whitespace runs become one space; typographic quotes and dashes become ASCII (models
    re-type them); nothing else changes."""
    text = unicodedata.normalize("NFC", text).translate(_QUOTE_CHARS)
    return re.sub(r"\s+", " ", text).strip()


def quote_found(quote: str, text: str) -> bool:
    """Is `quote` an exact substring of `text`, after whitespace normalisation?

    An ellipsis in the quote may skip text, but each piece must appear, in order. The model saw
    the text JSON-encoded, so a quote copied with JSON escapes (`\\"`, `\\n`) is decoded first.
    """
    haystack = normalise(text)
    candidates = [quote]
    if "\\" in quote:
        try:
            candidates.append(json.loads(f'"{quote}"'))
        except ValueError:
            pass
    for candidate in candidates:
        needle = normalise(candidate).strip("\"' ")
        if len(needle) < min(MIN_QUOTE_CHARS, len(haystack)):
            continue
        pieces = [p.strip() for p in re.split(r"\.\.\.|\u2026", needle) if p.strip()]
        pos = 0
        for piece in pieces:
            at = haystack.find(piece, pos)
            if at < 0:
                break
            pos = at + len(piece)
        else:
            if pieces:
                return True
    return False


def _safe_id(value: str) -> str:
    # ids in a retry message come from the model: show them only when they look like ids
    return value if _ID.match(value) else "an id that is not a block id"


# --- prompt building -------------------------------------------------------------------------


@dataclass
class _Block:
    """A citable block as the model saw it: the cleaned text quotes are checked against."""

    id: str
    texts: list[str]
    source_url: str | None = None
    collection: str | None = None


@dataclass
class _Set:
    key: Literal["retrieved", "research"]
    prefix: str
    passages: list[dict[str, str]] = field(default_factory=list)
    blocks: dict[str, _Block] = field(default_factory=dict)


def _passage_set(
    key: Literal["retrieved", "research"], prefix: str, passages: Sequence[Passage], nonce: str
) -> _Set:
    out = _Set(key=key, prefix=prefix)
    seen: set[str] = set()
    for passage in passages:
        if len(out.passages) >= MAX_PASSAGES:
            break
        if not _ID.match(passage.id):
            raise JudgeError(f"passage id {passage.id[:20]!r} is not a short id like R1 or S1")
        text = prompts.clean(passage.text, CAP_PASSAGE, nonce)
        if normalise(text) in seen:  # the same chunk found by two queries: send it once
            continue
        seen.add(normalise(text))
        title = prompts.clean(passage.title or "", CAP_TITLE, nonce)
        data = {
            "title": title,
            "source": prompts.clean(passage.source_url or "", CAP_URL, nonce),
            "collection": prompts.clean(passage.collection or "", 40, nonce),
            "text": text,
        }
        out.passages.append({"id": passage.id, "data": prompts.encode(data)})
        out.blocks[passage.id] = _Block(passage.id, [text, title], passage.source_url, passage.collection)
    return out


def _tool_blocks(trace: Trace, nonce: str) -> tuple[list[dict[str, str]], dict[str, _Block]]:
    """Tool calls as T1..; a search output whose results are already listed as passages is not sent
    twice (it is the same text, and it would double the prompt)."""
    shown = [normalise(p.text)[:80] for p in trace.passages if p.text.strip()]
    calls: list[dict[str, str]] = []
    blocks: dict[str, _Block] = {}
    for number, call in enumerate(trace.tool_calls[:MAX_TOOL_CALLS], start=1):
        tid = f"T{number}"
        output_norm = normalise(call.output)
        if call.is_search and not call.error and shown and any(s in output_norm for s in shown):
            output = "[the results of this search are listed as passages in the retrieved set]"
        else:
            output = prompts.clean(call.output, CAP_TOOL_OUTPUT, nonce)
        args = prompts.clean_value(call.args, CAP_TOOL_ARG, nonce)
        data = {
            "tool": prompts.clean(call.name, 100, nonce),
            "arguments": args,
            "error": call.error,
            "output": output,
        }
        calls.append({"id": tid, "data": prompts.encode(data)})
        blocks[tid] = _Block(tid, [output, prompts.encode(args)])
    return calls, blocks


# --- the judge -------------------------------------------------------------------------------

T = TypeVar("T", bound=_Reply)


class _Unusable(Exception):
    """A reply that is not usable output (not JSON, a refusal, wrong shape, cut off)."""

    def __init__(self, reason: str, refusal: bool = False) -> None:
        super().__init__(reason)
        self.refusal = refusal


class LLMJudge:
    """Facts from an OpenAI-compatible chat model. See the module docstring for the design."""

    needs_research = True

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
    ) -> None:
        if not components:
            raise ConfigError("the LLM judge needs a component catalogue")
        self.model = model
        self.name = f"llm:{model}"
        self.prompt_version: str | None = prompts.prompt_version(TEMPLATES)
        self.usage = Usage()
        #: usage per trace id, for the per-trace cost in the report
        self.usage_by_trace: dict[str, Usage] = {}
        #: HTTP requests made, including failed ones (usage.calls counts answered ones)
        self.requests = 0
        self.components = components
        self.default_component = (
            default_component if default_component in components else next(iter(components))
        )
        self.partial_is_answer = partial_is_answer
        self.product = product
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self._client = client.with_options(timeout=timeout, max_retries=0)
        self._semaphore = asyncio.Semaphore(concurrency)
        self._fixed = structured != "auto"
        self._mode: Literal["json_schema", "json_object", "none"] = (
            "json_schema" if structured == "auto" else structured
        )
        self._send_temperature = True

    @property
    def structured_mode(self) -> str:
        """The response format in use (after any downgrade)."""
        return self._mode

    # -- the protocol ---------------------------------------------------------------------------

    #: `judge(..., grounding=False)` makes call A only (the cascade uses it)
    can_skip_grounding = True

    async def judge(
        self,
        trace: Trace,
        research: list[Passage] | None,
        comment: str | None,
        base: Facts,
        *,
        grounding: bool = True,
    ) -> Facts:
        """`base` completed with the judged facts. With `grounding=False` (or no search call) call B
        is not made and `answer_grounded`/`answer_declined` stay unestablished."""
        usage = self.usage_by_trace.setdefault(trace.id, Usage())
        findings = prompts.trace_findings(trace, research, comment)
        try:
            # both calls at once (half the latency per trace); one failing cancels the other
            async with asyncio.TaskGroup() as group:
                task_a = group.create_task(self._containment(trace, research, comment, usage))
                task_b = (
                    group.create_task(self._grounding(trace, usage))
                    if base.agent_searched and grounding
                    else None
                )
        except BaseExceptionGroup as group_error:
            raise _first_error(group_error) from None
        containment, r_set, s_set = task_a.result()
        grounded_reply = task_b.result() if task_b else None
        return self._facts(base, containment, r_set, s_set, grounded_reply, findings, research)

    # -- call A ---------------------------------------------------------------------------------

    async def _containment(
        self, trace: Trace, research: list[Passage] | None, comment: str | None, usage: Usage
    ) -> tuple[ContainmentReply, _Set, _Set | None]:
        nonce = prompts.new_nonce()
        r_set = _passage_set("retrieved", "R", trace.passages, nonce)
        s_set = _passage_set("research", "S", research, nonce) if research is not None else None
        asked = [s for s in (r_set, s_set) if s is not None and s.passages]
        catalogue = [
            (name, ", ".join(c.keywords) if c.keywords else "(anything else)")
            for name, c in self.components.items()
        ]
        system = prompts.render(
            "containment_system.j2",
            product=self.product,
            nonce=nonce,
            sets=asked,
            catalogue=catalogue,
            default_component=self.default_component,
        )
        user = prompts.render(
            "containment_user.j2",
            nonce=nonce,
            question=prompts.encode(prompts.clean(trace.question, CAP_QUESTION, nonce)),
            comment=prompts.encode(prompts.clean(comment, CAP_COMMENT, nonce) if comment else None),
            sets=asked,
        )
        schema = containment_schema([s.key for s in asked], list(self.components))

        def verify(reply: ContainmentReply) -> list[str]:
            problems: list[str] = []
            for s in asked:
                verdict: SetVerdict | None = getattr(reply, s.key)
                if verdict is None:
                    problems.append(f'the "{s.key}" verdict is missing')
                    continue
                if verdict.verdict == "no_answer":
                    continue  # evidence for "no answer" is not used, so it cannot reject the reply
                if verdict.verdict == "contains_answer" and not verdict.evidence:
                    problems.append(f'"{s.key}" is contains_answer but cites no passage and quote')
                for n, item in enumerate(verdict.evidence, start=1):
                    block = s.blocks.get(item.passage_id)
                    if block is None:
                        problems.append(
                            f'"{s.key}" evidence {n} cites {_safe_id(item.passage_id)}, '
                            f"which is not a passage of that set (its ids start with {s.prefix})"
                        )
                    elif not any(quote_found(item.quote, t) for t in block.texts):
                        problems.append(
                            f'"{s.key}" evidence {n}: the quote is not an exact substring of {block.id}'
                        )
            if reply.component.name not in self.components:
                problems.append("the component name is not in the catalogue")
            return problems

        reply = await self._ask(
            "containment", system, user, schema, ContainmentReply, verify, usage, trace.id
        )
        return reply, r_set, s_set

    # -- call B ---------------------------------------------------------------------------------

    async def _grounding(self, trace: Trace, usage: Usage) -> tuple[GroundingReply, str]:
        nonce = prompts.new_nonce()
        r_set = _passage_set("retrieved", "R", trace.passages, nonce)
        calls, t_blocks = _tool_blocks(trace, nonce)
        answer = prompts.clean(trace.answer, CAP_ANSWER, nonce)
        system = prompts.render("grounding_system.j2", product=self.product, nonce=nonce)
        user = prompts.render(
            "grounding_user.j2",
            nonce=nonce,
            question=prompts.encode(prompts.clean(trace.question, CAP_QUESTION, nonce)),
            tool_calls=calls,
            passages=r_set.passages,
            answer=prompts.encode(answer),
        )
        blocks = {**r_set.blocks, **t_blocks}

        def verify(reply: GroundingReply) -> list[str]:
            problems: list[str] = []
            for n, claim in enumerate(reply.claims, start=1):
                if claim.status == "unsupported":
                    continue
                block = blocks.get(claim.source_id)
                if block is None:
                    problems.append(
                        f"claim {n} is {claim.status} but cites {_safe_id(claim.source_id)}, which is not a "
                        "passage (R..) or tool call (T..) given"
                    )
                elif not any(quote_found(claim.quote, t) for t in block.texts):
                    problems.append(f"claim {n}: the quote is not an exact substring of {block.id}")
            if reply.declined.verdict == "declined" and not quote_found(reply.declined.quote, answer):
                problems.append('"declined" needs a quote that is an exact substring of the answer')
            return problems

        reply = await self._ask(
            "grounding", system, user, grounding_schema(), GroundingReply, verify, usage, trace.id
        )
        return reply, answer

    # -- facts ----------------------------------------------------------------------------------

    def _maps_to_answer(self, verdict: SetVerdict) -> bool:
        return verdict.verdict == "contains_answer" or (
            verdict.verdict == "partial" and self.partial_is_answer
        )

    def _evidence(self, verdict: SetVerdict) -> Evidence:
        return Evidence(
            passage_ids=list(dict.fromkeys(q.passage_id for q in verdict.evidence)),
            quotes=[q.quote for q in verdict.evidence],
            confidence=verdict.confidence,
            note=f"{verdict.verdict}: {verdict.reasoning}"[:500],
        )

    def _facts(
        self,
        base: Facts,
        containment: ContainmentReply,
        r_set: _Set,
        s_set: _Set | None,
        grounding: tuple[GroundingReply, str] | None,
        findings: list[str],
        research: list[Passage] | None,
    ) -> Facts:
        evidence: dict[str, Evidence] = {}
        searched = set(base.agent_searched_collections)

        def holders(s: _Set, verdict: SetVerdict | None, *, partial_too: bool = False) -> list[_Block]:
            if verdict is None or not (
                self._maps_to_answer(verdict) or (partial_too and verdict.verdict == "partial")
            ):
                return []
            ids = dict.fromkeys(q.passage_id for q in verdict.evidence)
            return [s.blocks[i] for i in ids if i in s.blocks]

        # (a) the agent's passages
        r_verdict = containment.retrieved if r_set.passages else None
        retrieved = bool(r_verdict and self._maps_to_answer(r_verdict))
        if r_verdict:
            evidence["retrieved_has_answer"] = self._evidence(r_verdict)
        else:
            evidence["retrieved_has_answer"] = Evidence(confidence="high", note="no passages were retrieved")

        # (b) the re-searched passages
        s_verdict = containment.research if s_set is not None and s_set.passages else None
        in_index: bool | None
        if s_set is None:
            in_index = None
        elif s_verdict is None:
            in_index = False
            evidence["index_has_answer"] = Evidence(confidence="high", note="the re-search found no passages")
        else:
            in_index = self._maps_to_answer(s_verdict)
            evidence["index_has_answer"] = self._evidence(s_verdict)

        r_holders = holders(r_set, r_verdict)
        s_holders = holders(s_set, s_verdict) if s_set is not None else []
        holding = r_holders if retrieved else s_holders if in_index else []
        if retrieved:
            in_index = True  # the agent's passages came from the index
        # Where the answer is: a collection the agent searched wins (then a miss is retrieval,
        # not routing), else the first cited.
        collections = [b.collection for b in holding if b.collection]
        collection = next((c for c in collections if c in searched), collections[0] if collections else None)
        sources = list(dict.fromkeys(b.source_url for b in holding if b.source_url))

        # component: from the sources holding (or partly holding) the answer, else the model's pick
        hint_urls = sources or [
            b.source_url
            for b in holders(r_set, r_verdict, partial_too=True)
            + (holders(s_set, s_verdict, partial_too=True) if s_set is not None else [])
            if b.source_url
        ]
        component = self._component_from_sources(hint_urls)
        if component is not None:
            evidence["component"] = Evidence(confidence="high", note="from the source URL of the passages")
        else:
            pick = containment.component
            component = pick.name if pick.name in self.components else None
            evidence["component"] = Evidence(note=f"picked by the model: {pick.reasoning}"[:500])

        # (c), (d)
        grounded: bool | None = None
        declined: bool | None = None
        unsupported: list[str] = []
        model_flags = [("call A", containment.injection_suspected, containment.injection_note)]
        if grounding is not None:
            reply, _ = grounding
            bad = [c for c in reply.claims if c.status != "supported"]
            unsupported = [c.claim if c.status == "unsupported" else f"contradicted: {c.claim}" for c in bad]
            # One unsupported claim is enough, whatever the verdict says; a verdict at odds with
            # its own claims is kept but marked low confidence.
            grounded = reply.grounding.verdict != "ungrounded" and not bad
            consistent = (reply.grounding.verdict == "ungrounded") == bool(bad)
            supported = [c for c in reply.claims if c.status == "supported"]
            evidence["answer_grounded"] = Evidence(
                passage_ids=list(
                    dict.fromkeys(c.source_id for c in reply.claims if c.status != "unsupported")
                ),
                quotes=[c.quote for c in reply.claims if c.status != "unsupported"],
                confidence=reply.grounding.confidence if consistent else "low",
                note=(
                    f"{reply.grounding.verdict}: {len(supported)} supported, {len(bad)} not; "
                    f"{reply.grounding.reasoning}"
                )[:500],
            )
            declined = reply.declined.verdict == "declined"
            evidence["answer_declined"] = Evidence(
                quotes=[reply.declined.quote] if declined else [],
                confidence=reply.declined.confidence,
                note=f"{reply.declined.verdict}: {reply.declined.reasoning}"[:500],
            )
            model_flags.append(("call B", reply.injection_suspected, reply.injection_note))

        flagged_by_model = [
            f"{where} (model): {note or 'no note'}"[:200] for where, flag, note in model_flags if flag
        ]
        injection = bool(findings or flagged_by_model)
        if injection:
            evidence["injection_suspected"] = Evidence(
                confidence="high" if findings else "low", note="; ".join(findings + flagged_by_model)[:1000]
            )

        return base.model_copy(
            update={
                "retrieved_has_answer": retrieved,
                "index_has_answer": in_index,
                "answer_collection": collection,
                "answer_grounded": grounded,
                "answer_declined": declined,
                "component": component,
                "evidence": {**base.evidence, **evidence},
                "unsupported_claims": unsupported,
                "injection_suspected": injection or base.injection_suspected,
                "answer_sources": sources,
            }
        )

    def _component_from_sources(self, urls: Sequence[str | None]) -> str | None:
        for url in urls:
            for name, component in self.components.items():
                if url and any(pattern and pattern in url for pattern in component.sources):
                    return name
        return None

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
        problems: list[str] = []
        for round_ in (1, 2):
            raw, reply = await self._complete(call, messages, schema, reply_type, usage)
            problems = verify(reply)
            if not problems:
                return reply
            if round_ == 1:
                # one more try, told which checks failed (ids and check names only: no quoted text)
                retry = prompts.render("verification_retry.j2", problems=problems[:10])
                messages = [
                    *messages,
                    {"role": "assistant", "content": raw},
                    {"role": "user", "content": retry},
                ]
        raise JudgeRejected(
            f"{call} reply for trace {trace_id} failed verification twice: " + "; ".join(problems[:5])
        )

    async def _complete(
        self,
        call: str,
        messages: list[dict[str, str]],
        schema: dict[str, Any],
        reply_type: type[T],
        usage: Usage,
    ) -> tuple[str, T]:
        """One answered, parsed reply, with retries for transport failures and unusable output."""
        attempt = 0
        while True:
            mode = self._mode
            try:
                completion = await self._request(call, messages, schema, mode)
            except openai.BadRequestError as ex:
                if self._downgrade(mode, ex):
                    continue
                raise JudgeError(f"model {self.model} refused the request: {_short(ex)}") from ex
            except (openai.AuthenticationError, openai.PermissionDeniedError) as ex:
                raise ConfigError(f"the judge's model server refused the credentials: {_short(ex)}") from ex
            except openai.NotFoundError as ex:
                raise ConfigError(
                    f"model {self.model!r} not found on the judge's server: {_short(ex)}"
                ) from ex
            except (openai.RateLimitError, openai.InternalServerError, openai.APIConnectionError) as ex:
                # APITimeoutError is an APIConnectionError
                attempt += 1
                if attempt > self.max_retries:
                    raise JudgeError(
                        f"model {self.model} unavailable after {attempt} attempts: {_short(ex)}"
                    ) from ex
                await asyncio.sleep(self._wait(attempt, ex))
                continue
            except openai.APIStatusError as ex:
                if ex.status_code >= 500 or ex.status_code in (408, 409):
                    attempt += 1
                    if attempt <= self.max_retries:
                        await asyncio.sleep(self._wait(attempt, ex))
                        continue
                raise JudgeError(f"model {self.model} failed: {_short(ex)}") from ex
            self._count(completion, usage)
            try:
                raw, reply = self._parse(completion, reply_type, mode)
            except _Unusable as ex:
                attempt += 1
                if attempt > self.max_retries:
                    what = "refused to judge" if ex.refusal else "kept answering unusable output"
                    raise JudgeRejected(f"{call}: model {self.model} {what}: {ex}") from None
                await asyncio.sleep(self._wait(attempt, None))
                continue
            return raw, reply

    async def _request(
        self, call: str, messages: list[dict[str, str]], schema: dict[str, Any], mode: str
    ) -> Any:
        kwargs: dict[str, Any] = {}
        if mode == "json_schema":
            kwargs["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": call, "strict": True, "schema": schema},
            }
        elif mode == "json_object":
            kwargs["response_format"] = {"type": "json_object"}
        if self._send_temperature:
            kwargs["temperature"] = 0
        async with self._semaphore:
            self.requests += 1
            return await self._client.chat.completions.create(model=self.model, messages=messages, **kwargs)  # type: ignore[arg-type]

    def _downgrade(self, mode: str, ex: openai.BadRequestError) -> bool:
        """After a 400: fall back to a format (or no temperature) the server accepts. Sticky."""
        text = _short(ex, 2000).lower()
        if self._send_temperature and "temperature" in text:
            self._send_temperature = False  # reasoning models accept only their default temperature
            return True
        if self._fixed or mode == "none":
            return False
        if not any(
            w in text for w in ("response_format", "json_schema", "json_object", "response format", "schema")
        ):
            return False
        if self._mode == mode:  # concurrent calls may all fail on the same mode: step down once
            self._mode = _MODES[_MODES.index(mode) + 1]
        return True

    def _count(self, completion: Any, usage: Usage) -> None:
        got = Usage(calls=1)
        if completion.usage is not None:
            got.input_tokens = completion.usage.prompt_tokens or 0
            got.output_tokens = completion.usage.completion_tokens or 0
        self.usage.add(got)
        usage.add(got)

    def _parse(self, completion: Any, reply_type: type[T], mode: str) -> tuple[str, T]:
        if not completion.choices:
            raise _Unusable("the reply has no choices")
        choice = completion.choices[0]
        message = choice.message
        refusal = getattr(message, "refusal", None)
        if refusal:
            raise _Unusable(_clip(refusal), refusal=True)
        content = (message.content or "").strip()
        if choice.finish_reason == "length":
            raise _Unusable("the reply was cut off at the token limit")
        if not content:
            raise _Unusable("the reply is empty")
        text = re.sub(r"^```(?:json)?\s*|\s*```$", "", content)  # a fenced block is still JSON
        try:
            data = json.loads(text)
        except ValueError:
            data = None
            if mode == "none" and "{" in text:
                try:
                    data = json.loads(text[text.index("{") : text.rindex("}") + 1])
                except ValueError:
                    data = None
            if data is None:
                refused = bool(
                    re.match(r"(?:I'?m sorry|I am sorry|I can(?:no|')t|I (?:will|won)'?t|Sorry)", text, re.I)
                )
                raise _Unusable(f"not JSON: {_clip(content)}", refusal=refused) from None
        try:
            return content, reply_type.model_validate(data)
        except ValidationError as ex:
            first = ex.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise _Unusable(f"wrong shape at {where or 'top level'}: {first['msg']}") from None

    def _wait(self, attempt: int, ex: Exception | None) -> float:
        retry_after = _retry_after(ex)
        if retry_after is not None:
            return min(retry_after, self.backoff_max)
        delay = min(self.backoff_base * 2 ** (attempt - 1), self.backoff_max)
        return delay * random.uniform(0.5, 1.0)  # jitter so a burst of 429s does not retry in step


def _first_error(group: BaseExceptionGroup) -> BaseException:
    """The error to raise for a failed call pair: a rejection or a config error before the rest."""
    errors = leaves(group)
    for kind in (ConfigError, JudgeRejected, JudgeError):
        for error in errors:
            if isinstance(error, kind):
                return error
    return errors[0]


def _retry_after(ex: Exception | None) -> float | None:
    response = getattr(ex, "response", None)
    if response is None:
        return None
    headers = response.headers
    try:
        if (ms := headers.get("retry-after-ms")) is not None:
            return max(float(ms) / 1000, 0.0)
        if (value := headers.get("retry-after")) is not None:
            try:
                return max(float(value), 0.0)
            except ValueError:
                when = parsedate_to_datetime(value)
                return max((when - datetime.now(when.tzinfo)).total_seconds(), 0.0)
    except (TypeError, ValueError):
        return None
    return None


def _clip(text: str, limit: int = 160) -> str:
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= limit else text[:limit] + "..."


def _short(ex: Exception, limit: int = 300) -> str:
    status = getattr(ex, "status_code", None)
    body = getattr(ex, "body", None)
    message = body.get("message") if isinstance(body, dict) else None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        message = body["error"].get("message")
    text = _clip(str(message or ex), limit)
    return f"HTTP {status}: {text}" if status else text
