"""Records that cross a boundary: votes, observations, traces, passages, facts, verdicts, scores.

Langfuse payloads may grow, so the models that read them ignore unknown fields; records triage
writes itself (facts, verdicts, scores) forbid them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from triage.domain.kernel import clip

#: a web address, as a tool's argument (no spaces: `https://...`)
_HTTP_URL = re.compile(r"https?://\S+\Z")


#: how sure a judge is of one fact
Confidence = Literal["high", "medium", "low"]


class Layer(StrEnum):
    """Where a thumbs-down answer failed. The order is the report's order."""

    GENERATION = "generation"
    RETRIEVAL = "retrieval"
    TOOL_ROUTING = "tool_routing"
    AGENT_SKIPPED_RETRIEVAL = "agent_skipped_retrieval"
    CONTENT_GAP_HALLUCINATION = "content_gap_hallucination"
    CONTENT_GAP_HANDLED = "content_gap_handled"
    OK = "ok"


AGENT_LAYERS = frozenset(
    {Layer.GENERATION, Layer.RETRIEVAL, Layer.TOOL_ROUTING, Layer.AGENT_SKIPPED_RETRIEVAL}
)
CONTENT_LAYERS = frozenset({Layer.CONTENT_GAP_HANDLED, Layer.CONTENT_GAP_HALLUCINATION})


class _Incoming(BaseModel):
    """A record read from outside: camelCase aliases accepted, unknown fields ignored."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class _Own(BaseModel):
    """A record triage writes: unknown fields are an error."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True, slots=True)
class Vote:
    """A user's vote, as a `user_feedback` score: on a trace, or on a session plus a turn.

    Built by code from rows already read and checked (`wire.to_vote`, the store), never parsed
    from a payload itself, so a plain slotted dataclass: every vote of the window is held until its
    trace is triaged, and a pydantic model of these fields weighed about 1.4 KB (its per-instance
    dict and set of fields given), this about 0.6 KB.
    """

    id: str
    value: float
    timestamp: datetime
    trace_id: str | None = None
    session_id: str | None = None
    turn: int | None = None  # 0-based index of the rated answer
    comment: str | None = None
    user_id: str | None = None
    updated_at: datetime | None = None
    environment: str = "default"

    def __post_init__(self) -> None:
        if self.turn is not None and self.turn < 0:
            raise ValueError(f"vote {self.id}: turn must be 0 or more, not {self.turn}")

    @property
    def is_thumbs_down(self) -> bool:
        return self.value == 0


class Observation(_Incoming):
    """One observation in the ObservationV2 shape of Langfuse's public API.

    `input` and `output` stay raw JSON strings, as the API sends them.
    """

    id: str
    trace_id: str = Field(alias="traceId")
    type: str = "SPAN"
    name: str | None = None
    parent_observation_id: str | None = Field(default=None, alias="parentObservationId")
    start_time: datetime = Field(alias="startTime")
    end_time: datetime | None = Field(default=None, alias="endTime")
    input: str | None = None
    output: str | None = None
    metadata: Any = None
    session_id: str | None = Field(default=None, alias="sessionId")
    user_id: str | None = Field(default=None, alias="userId")
    environment: str | None = None
    is_root_observation: bool | None = Field(default=None, alias="isRootObservation")
    level: str | None = None
    status_message: str | None = Field(default=None, alias="statusMessage")
    updated_at: datetime | None = Field(default=None, alias="updatedAt")


class UnreadableTrace(_Own):
    """A trace whose stored rows cannot be read (one breaks the source's contract): listed as bad
    input, so the traces read with it are still triaged."""

    reason: str


class Passage(_Own):
    """A piece of retrieved text. Ids are stable for a trace: R1.. agent-retrieved, S1.. re-searched."""

    id: str
    source_url: str | None = None
    collection: str | None = None
    text: str
    title: str | None = None
    score: float | None = None


class ToolCall(_Own):
    """One tool call the agent made."""

    id: str
    name: str
    args: dict[str, Any] = Field(default_factory=dict)
    output: str = ""
    collection: str | None = Field(default=None, description="set when the tool is a configured search")
    error: bool = False

    @property
    def is_search(self) -> bool:
        return self.collection is not None

    @property
    def urls(self) -> list[str]:
        """The web addresses among its arguments (`fetch_url(url=...)`): the pages it asked for."""
        return [v.strip() for v in self.args.values() if isinstance(v, str) and _HTTP_URL.match(v.strip())]


class Trace(_Own):
    """A trace as the job sees it."""

    id: str
    question: str
    answer: str
    tool_calls: list[ToolCall] = Field(default_factory=list)
    passages: list[Passage] = Field(default_factory=list)
    session_id: str | None = None
    start_time: datetime | None = None
    environment: str = "default"
    url: str | None = None

    @property
    def searched(self) -> bool:
        return any(call.is_search for call in self.tool_calls)

    @property
    def searched_collections(self) -> set[str]:
        return {call.collection for call in self.tool_calls if call.collection}


class Evidence(_Own):
    """What one fact rests on: passage ids, short exact quotes, and how sure the judge is."""

    passage_ids: list[str] = Field(default_factory=list)
    quotes: list[str] = Field(default_factory=list)
    confidence: Confidence | None = None
    note: str | None = None
    #: which judge established the fact (`heuristic`, `llm:<model>`, `replay:<file>`, `trace`)
    decided_by: str | None = None


class Facts(_Own):
    """What is known about one rated trace. The layer is derived from these by `rule.decide`.

    `agent_searched` and `agent_searched_collections` are proven by the trace itself; the rest
    come from a judge. `None` means the fact could not be established.
    """

    agent_searched: bool
    agent_searched_collections: list[str] = Field(default_factory=list)
    retrieved_has_answer: bool | None = None
    index_has_answer: bool | None = None
    answer_collection: str | None = None
    answer_grounded: bool | None = None
    answer_declined: bool | None = None
    component: str | None = None
    evidence: dict[str, Evidence] = Field(default_factory=dict)
    unsupported_claims: list[str] = Field(default_factory=list)
    injection_suspected: bool = False
    answer_sources: list[str] = Field(default_factory=list, description="URLs of passages holding the answer")


# What a verdict stores is bounded, whatever the judge found: an answer with 60,000 invented
# specifics must not make a 1 MB score (Langfuse answers 413, and the trace never gets written).
MAX_ITEMS = 20
MAX_ITEM_CHARS = 300
MAX_NOTE_CHARS = 1000


def _items(values: list[str], more: str = "more") -> list[str]:
    kept = [clip(v, MAX_ITEM_CHARS) for v in values[:MAX_ITEMS]]
    if len(values) > MAX_ITEMS:
        kept.append(f"... and {len(values) - MAX_ITEMS} {more}")
    return kept


JUDGED_FACTS = ("retrieved_has_answer", "index_has_answer", "answer_grounded", "answer_declined")


def decided_by(facts: Facts, judge: str) -> Facts:
    """`facts` with every judged fact that names no judge credited to `judge`."""
    evidence = dict(facts.evidence)
    for name in JUDGED_FACTS:
        if getattr(facts, name) is None:
            continue
        held = evidence.get(name)
        if held is None:
            evidence[name] = Evidence(decided_by=judge)
        elif held.decided_by is None:
            evidence[name] = held.model_copy(update={"decided_by": judge})
    return facts.model_copy(update={"evidence": evidence})


def bounded(facts: Facts) -> Facts:
    """`facts` with every list and text cut to what a score's metadata can carry; the decision
    fields are untouched, so the layer is the same."""
    evidence = {
        name: item.model_copy(
            update={
                "passage_ids": item.passage_ids[:MAX_ITEMS],
                "quotes": [clip(q, MAX_ITEM_CHARS) for q in item.quotes[:MAX_ITEMS]],
                "note": clip(item.note, MAX_NOTE_CHARS) if item.note else item.note,
            }
        )
        for name, item in list(facts.evidence.items())[:MAX_ITEMS]
    }
    return facts.model_copy(
        update={
            "unsupported_claims": _items(facts.unsupported_claims),
            "answer_sources": [clip(s, MAX_ITEM_CHARS) for s in facts.answer_sources[:MAX_ITEMS]],
            "evidence": evidence,
        }
    )


class Verdict(_Own):
    """The triage of one trace."""

    trace_id: str
    layer: Layer
    component: str
    owners: list[str]
    reason: str
    facts: Facts
    rule_version: str
    judge: str
    prompt_version: str | None = None
    #: which source decided the component: the answer's sources, the judge, keywords, the default
    component_from: Literal["sources", "judge", "keywords", "default"] = "default"


UndecidedKind = Literal["unavailable", "rejected", "bad_input", "pending", "not_written", "error"]


class Undecided(_Own):
    """A thumbs-down that was not triaged (or not written), with the reason. Never dropped."""

    vote_ids: list[str]
    trace_id: str | None = None
    kind: UndecidedKind
    reason: str


class WriteOutcome(_Own):
    """What a batch of score writes became: confirmed by reading back, or failed with a reason."""

    confirmed: list[str] = Field(default_factory=list)
    failed: dict[str, str] = Field(default_factory=dict)
    #: the failed ids whose failure may pass (Langfuse down, slow, rate-limiting), and the longest
    #: Retry-After it asked for
    retryable: list[str] = Field(default_factory=list)
    wait: float | None = None


#: what a batch API charges: this share of the direct price, input and output alike (OpenAI,
#: Anthropic and Gemini all charge half; ../shared/notes/cost.md)
BATCH_DISCOUNT = 0.5


class Usage(_Own):
    """Model calls and tokens spent by a judge.

    `cached_input_tokens`: the part of `input_tokens` the server had cached (a prompt-cache hit, as
    its reply's `usage.prompt_tokens_details.cached_tokens` says). `batch_*`: the part of each
    figure answered through a batch API (`triage feedback --batch`); the rest went directly."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    batch_calls: int = 0
    batch_input_tokens: int = 0
    batch_cached_input_tokens: int = 0
    batch_output_tokens: int = 0

    def add(self, other: Usage) -> None:
        self.calls += other.calls
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cached_input_tokens += other.cached_input_tokens
        self.batch_calls += other.batch_calls
        self.batch_input_tokens += other.batch_input_tokens
        self.batch_cached_input_tokens += other.batch_cached_input_tokens
        self.batch_output_tokens += other.batch_output_tokens

    def cost(self, input_price: float, output_price: float, cached_input_price: float | None = None) -> float:
        """US dollars at these prices (per million tokens), as billed: the calls answered in
        batches at `BATCH_DISCOUNT` of them, cached input tokens at `cached_input_price` (None: at
        the input price)."""
        cached_price = input_price if cached_input_price is None else cached_input_price

        def priced(tokens_in: int, cached: int, tokens_out: int) -> float:
            cached = min(max(cached, 0), tokens_in)
            return ((tokens_in - cached) * input_price + cached * cached_price + tokens_out * output_price) / 1e6

        direct = priced(
            self.input_tokens - self.batch_input_tokens,
            self.cached_input_tokens - self.batch_cached_input_tokens,
            self.output_tokens - self.batch_output_tokens,
        )
        batch = priced(self.batch_input_tokens, self.batch_cached_input_tokens, self.batch_output_tokens)
        return direct + batch * BATCH_DISCOUNT


class StoredScore(_Own):
    """A score as read back from a store (Langfuse or the embedded one), whoever wrote it.

    Calibration reads people's labels and the job's decisions through this one shape. BOOLEAN
    values are 0.0/1.0, CATEGORICAL ones text; `author` is the reviewer who wrote an annotation
    (Langfuse's `authorUserId`, else `metadata.reviewer`, else the store's `userId`).
    """

    id: str
    name: str
    trace_id: str | None = None
    data_type: str | None = None
    value: float | str | None = None
    comment: str | None = None
    metadata: Any = None
    author: str | None = None
    source: str | None = None
    timestamp: datetime


def is_the_jobs(score: StoredScore) -> bool:
    """The job's own score, not a person's annotation under the same name (Langfuse's `source`)."""
    return (score.source or "API").upper() != "ANNOTATION"


@dataclass(frozen=True)
class Tokens:
    """Tokens of one or more calls; `cached_prompt` is the part of `prompt` the server had cached."""

    prompt: int = 0
    cached_prompt: int = 0
    completion: int = 0

    def __add__(self, other: Tokens) -> Tokens:
        return Tokens(
            self.prompt + other.prompt,
            self.cached_prompt + other.cached_prompt,
            self.completion + other.completion,
        )


@dataclass(frozen=True)
class Price:
    """US dollars per million tokens at a provider's standard (direct) rate."""

    input: float
    output: float
    #: a cached input token (a prompt-cache hit)
    cached_input: float


@dataclass(frozen=True)
class Cost:
    """One amount of tokens priced four ways, in US dollars."""

    direct: float
    batch: float
    direct_cached: float
    batch_cached: float


#: Figures from ../shared/notes/cost.md ("A night, costed"; gathered 2026-12 from the providers'
#: public pages; prices change often, so check before quoting them): a large judge at $3 / $15 per
#: M tokens with cached input at 0.1x (the note's night is costed so: batch with a cached prefix
#: about $0.0145 a trace), and a small model at $0.15 / $0.60 with cached input at 0.5x (the note:
#: "0.25-0.5x on older models"). The note gives the price points, not the model names: the names
#: below are the models sold at those prices as far as this module's author knows (unchecked here).
PRICES: Mapping[str, Price] = {
    "gpt-4o-mini": Price(input=0.15, output=0.60, cached_input=0.075),
    "claude-sonnet-4": Price(input=3.00, output=15.00, cached_input=0.30),
    "claude-sonnet-4-5": Price(input=3.00, output=15.00, cached_input=0.30),
}


_SNAPSHOT = re.compile(r"-(?:\d{4}-\d{2}-\d{2}|\d{8})$")


def price_of(model: str, prices: Mapping[str, Price] = PRICES) -> Price | None:
    """The price of `model`: by its name, without a provider prefix (`openai/`) or a dated snapshot
    suffix (`-2024-07-18`, `-20250514`); None when unknown."""
    name = model.rsplit("/", 1)[-1]
    return prices.get(name) or prices.get(_SNAPSHOT.sub("", name))


#: a cached input token's share of the input price where the model's own is unknown: the careful end
#: of ../shared/notes/cost.md's range (0.25-0.5x on older models, 0.1x on the gpt-5 family)
CACHED_SHARE = 0.5


def cached_input_price(model: str | None, input_price: float, prices: Mapping[str, Price] = PRICES) -> float:
    """What a cached input token costs where an input token costs `input_price` (the configured
    price, per M tokens): the model's own cached share where its price is known, else `CACHED_SHARE`."""
    price = price_of(model, prices) if model else None
    share = price.cached_input / price.input if price is not None and price.input > 0 else CACHED_SHARE
    return input_price * share


def cost(model: str, tokens: Tokens, prices: Mapping[str, Price] = PRICES) -> Cost | None:
    """What `tokens` cost on `model` directly and in a batch, without and with the cached-input
    price for `tokens.cached_prompt`; None for a model with no known price."""
    price = price_of(model, prices)
    if price is None:
        return None
    cached = min(max(tokens.cached_prompt, 0), tokens.prompt)
    output = tokens.completion * price.output
    plain = (tokens.prompt * price.input + output) / 1e6
    with_cache = ((tokens.prompt - cached) * price.input + cached * price.cached_input + output) / 1e6
    if not (math.isfinite(plain) and math.isfinite(with_cache)):
        return None
    return Cost(
        direct=plain,
        batch=plain * BATCH_DISCOUNT,
        direct_cached=with_cache,
        batch_cached=with_cache * BATCH_DISCOUNT,
    )
