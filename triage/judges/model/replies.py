"""The replies the LLM judge's model must give: their models and strict schemas, the checks every
reply passes in code, and the facts a verified reply establishes.

The schemas sent as `response_format` are generated from these models (never written twice):
every property required, no extra ones, references inlined, titles and defaults dropped, as
OpenAI's strict structured outputs want. Each is the same for every call of its kind in a run (part
of the prompt's cacheable prefix): the containment schema has both passage sets and the follow-up
queries, each nullable (the user message's first line says which the call asks for), and the
component name limited to the catalogue.

What the LLM judge shows the model: the citable blocks of a prompt, passage sets (R1.., S1..) and
tool calls (T1..), cleaned and capped; and how a quote the model cites is found in its block.

Each block keeps the cleaned text exactly as the model saw it, which is what quotes are checked
against (the quotes section: is what the model cites really in the block it names?).

What does not fit is chosen by relevance to a focus text, never first-N: a passage or tool output
longer than its cap is shown as its parts most relevant to the focus (`triage.reading.passages`),
and a set with more than `MAX_PASSAGES` passages keeps the most relevant ones. The focus is the
question for containment (the answer is never shown there) and the question with the answer for
grounding (the answer's claims are what must be found).
"""

from __future__ import annotations

import copy
import functools
import json
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from triage.domain.config import Component
from triage.domain.kernel import TextMemo
from triage.domain.records import Confidence, Evidence, Facts, Passage, Trace
from triage.domain.rule import component_from_sources
from triage.errors import JudgeError
from triage.judges.model import prompts
from triage.reading.passages import excerpt, most_relevant

# Field caps (characters). They bound the prompt (about 8k tokens for a typical trace) and stop a
# huge tool output from crowding out the rest.
CAP_QUESTION = 2000
CAP_COMMENT = 1000
CAP_ANSWER = 8000
CAP_PASSAGE = 2000
#: a set's passages share this much room: a passage gets at least `CAP_PASSAGE`, and the room short
#: ones leave goes to long ones (one 5 KB page among two short chunks is shown whole), so a small
#: set never loses what a large one must
SET_BUDGET = 12000
CAP_TITLE = 300
CAP_URL = 500
CAP_TOOL_OUTPUT = 3000
CAP_TOOL_ARG = 500
MAX_PASSAGES = 24
MAX_TOOL_CALLS = 12

#: the passage sets a containment call asks about, as the reply names them
SetKey = Literal["retrieved", "research"]


@dataclass
class Block:
    """A citable block as the model saw it: the cleaned text quotes are checked against."""

    id: str
    texts: list[str]
    source_url: str | None = None
    collection: str | None = None

    @cached_property
    def normalised(self) -> list[str]:
        """`texts` through `normalise` (below), once however many quotes cite the block."""
        return [normalise(t) for t in self.texts]

    def holds(self, quote: str) -> bool:
        """Is `quote` an exact substring (after normalisation) of one of the block's texts?"""
        return any(quote_in(quote, t) for t in self.normalised)


@dataclass
class PassageSet:
    key: SetKey
    prefix: str
    passages: list[dict[str, str]] = field(default_factory=list)
    blocks: dict[str, Block] = field(default_factory=dict)

    def joined(self, more: PassageSet) -> PassageSet:
        """This set and a follow-up's passages (ids numbered on, so none is shadowed; one the
        follow-up was shown again is listed once) as one set."""
        added = [p for p in more.passages if p.get("id") not in self.blocks]
        return PassageSet(self.key, self.prefix, [*self.passages, *added], {**self.blocks, **more.blocks})


def passage_set(
    key: SetKey, prefix: str, passages: Sequence[Passage], nonce: str, focus: str = ""
) -> PassageSet:
    """The set as the prompt shows it: each passage once, the `MAX_PASSAGES` most relevant to
    `focus` when there are more, each text cut to its parts most relevant to `focus`."""
    out = PassageSet(key=key, prefix=prefix)
    seen: set[str] = set()
    candidates: list[tuple[Passage, str]] = []
    for passage in passages:
        if not BLOCK_ID.match(passage.id):
            raise JudgeError(f"passage id {passage.id[:20]!r} is not a short id like R1 or S1")
        text = prompts.clean(passage.text, len(passage.text), nonce)
        same = normalise(text)
        if same in seen:  # the same chunk found by two queries: send it once
            continue
        seen.add(same)
        candidates.append((passage, text))
    keep = most_relevant([f"{p.title or ''}\n{text}" for p, text in candidates], focus, MAX_PASSAGES)
    caps = shared_caps([len(candidates[i][1]) for i in keep], SET_BUDGET, CAP_PASSAGE)
    for (passage, full), cap in zip((candidates[i] for i in keep), caps, strict=True):
        text = excerpt(full, focus, cap)
        title = prompts.clean(passage.title or "", CAP_TITLE, nonce)
        data = {
            "title": title,
            "source": prompts.clean(passage.source_url or "", CAP_URL, nonce),
            "collection": prompts.clean(passage.collection or "", 40, nonce),
            "text": text,
        }
        out.passages.append({"id": passage.id, "data": prompts.encode(data)})
        out.blocks[passage.id] = Block(passage.id, [text, title], passage.source_url, passage.collection)
    return out


def shared_caps(lengths: Sequence[int], budget: int, floor: int) -> list[int]:
    """Each length's cap when `budget` is shared by water-filling: every one gets what it needs up
    to a common level, the level as high as the budget allows, and never below `floor`."""
    if not lengths:
        return []
    if sum(lengths) <= budget:
        return list(lengths)
    left, level = budget, floor
    for n, length in enumerate(sorted(lengths)):
        share = left // (len(lengths) - n)
        if length > share:
            level = max(floor, share)
            break
        left -= length
    return [min(length, level) for length in lengths]


def tool_blocks(trace: Trace, nonce: str, focus: str = "") -> tuple[list[dict[str, str]], dict[str, Block]]:
    """Tool calls as T1..; a search output whose results are already listed as passages is not sent
    twice (it is the same text, and it would double the prompt); a long output is cut to its parts
    most relevant to `focus`."""
    shown = [normalise(p.text)[:80] for p in trace.passages if p.text.strip()]
    calls: list[dict[str, str]] = []
    blocks: dict[str, Block] = {}
    for number, call in enumerate(trace.tool_calls[:MAX_TOOL_CALLS], start=1):
        tid = f"T{number}"
        output_norm = normalise(call.output)
        if call.is_search and not call.error and shown and any(s in output_norm for s in shown):
            output = "[the results of this search are listed as passages in the retrieved set]"
        else:
            output = excerpt(prompts.clean(call.output, len(call.output), nonce), focus, CAP_TOOL_OUTPUT)
        args = prompts.clean_value(call.args, CAP_TOOL_ARG, nonce)
        data = {
            "tool": prompts.clean(call.name, 100, nonce),
            "arguments": args,
            "error": call.error,
            "output": output,
        }
        calls.append({"id": tid, "data": prompts.encode(data)})
        blocks[tid] = Block(tid, [output, prompts.encode(args)])
    return calls, blocks


# -- quotes ------------------------------------------------------------------------------------------

MIN_QUOTE_CHARS = 8

#: a block id as the prompts give them: R1 (retrieved), S1 (re-searched), T1 (tool call)
BLOCK_ID = re.compile(r"^[A-Za-z]{1,4}\d{1,4}$")

_QUOTE_CHARS = str.maketrans(
    {"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2013": "-", "\u2014": "-", "\u00a0": " "}
)


def _normalise(text: str) -> str:
    """Whitespace runs become one space; typographic quotes and dashes become ASCII (models
    re-type them); nothing else changes."""
    text = unicodedata.normalize("NFC", text).translate(_QUOTE_CHARS)
    return _SPACES.sub(" ", text).strip()


_SPACES = re.compile(r"\s+")
#: a passage is normalised for each call that shows it, and a model's every quote checked against it
normalise = TextMemo(_normalise, size=2048, max_chars=8_000)


def quote_found(quote: str, text: str) -> bool:
    """Is `quote` an exact substring of `text`, after whitespace normalisation?

    An ellipsis in the quote may skip text, but each piece must appear, in order. The model saw
    the text JSON-encoded, so a quote copied with JSON escapes (`\\"`, `\\n`) is decoded first.
    """
    return quote_in(quote, normalise(text))


def quote_in(quote: str, haystack: str) -> bool:
    """`quote_found` against a text already through `normalise` (a block's, normalised once for
    all the quotes that cite it)."""
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


def safe_id(value: str) -> str:
    """An id from the model, shown in a retry message only when it looks like a block id."""
    return value if BLOCK_ID.match(value) else "an id that is not a block id"


class _Reply(BaseModel):
    model_config = ConfigDict(extra="forbid")


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


class SearchAgain(_Reply):
    reasoning: str
    queries: list[str]


class ContainmentReply(_Reply):
    injection_note: str
    injection_suspected: bool
    retrieved: SetVerdict | None = None
    research: SetVerdict | None = None
    component: ComponentPick
    #: read only where the call allows queries (null, or ignored, elsewhere)
    search_again: SearchAgain | None = None


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


def strict_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema in the strict structured-output form."""
    schema = model.model_json_schema()
    definitions = schema.pop("$defs", {})

    def strict(node: Any) -> Any:
        if isinstance(node, list):
            return [strict(item) for item in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            return strict(definitions[node["$ref"].rsplit("/", 1)[-1]])
        out = {k: strict(v) for k, v in node.items() if k not in {"title", "default", "description"}}
        if "const" in out and "enum" not in out:  # a one-name catalogue: enum is what servers know
            out["enum"] = [out.pop("const")]
        if out.get("type") == "object":
            out["required"] = list(out.get("properties", {}))
            out["additionalProperties"] = False
        return out

    result = strict(schema)
    assert isinstance(result, dict)
    return result


def containment_schema(components: Sequence[str]) -> dict[str, Any]:
    """The containment reply's schema: a verdict (or null) for each passage set, the component from
    the catalogue, and the queries the model would search where no set holds the answer (or null).
    The same for every call with this catalogue: which sets a call asks about, and whether it allows
    queries, its user message says, so the schema stays part of the prompt's cacheable prefix.

    Built once per catalogue and copied per call: building it makes two pydantic models (about 3 ms
    of CPU)."""
    return copy.deepcopy(_containment_schema(tuple(components)))


@functools.lru_cache(maxsize=16)
def _containment_schema(components: tuple[str, ...]) -> dict[str, Any]:
    names: Any = Literal[tuple(components)]  # a Literal built at run time, from the catalogue
    pick = create_model("ComponentPick", __base__=_Reply, reasoning=(str, ...), name=(names, ...))
    fields: dict[str, Any] = {
        "injection_note": (str, ...),
        "injection_suspected": (bool, ...),
        "retrieved": (SetVerdict | None, ...),
        "research": (SetVerdict | None, ...),
        "component": (pick, Field(...)),
        "search_again": (SearchAgain | None, ...),
    }
    return strict_schema(create_model("ContainmentReply", __base__=_Reply, **fields))


def grounding_schema() -> dict[str, Any]:
    return copy.deepcopy(_grounding_schema())


@functools.cache
def _grounding_schema() -> dict[str, Any]:
    return strict_schema(GroundingReply)


# -- checks ------------------------------------------------------------------------------------------
#
# Checks in code after every reply: cited ids exist in the right set, quotes are exact substrings
# of the block they cite, `contains_answer` carries a quote.
#
# Each check returns the problems found (ids and check names only, never quoted text): an empty
# list accepts the reply; otherwise the model is told them and asked once more.
#
# The component the model picks is not checked here: a name outside the catalogue is no reason to
# retry or reject a reply whose containment verdicts are sound. `FactMaker` (below) discards such a
# pick (the engine then decides the component by keywords or the default) and the judge logs it.


def containment_problems(reply: ContainmentReply, asked: Sequence[PassageSet]) -> list[str]:
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
                    f'"{s.key}" evidence {n} cites {safe_id(item.passage_id)}, '
                    f"which is not a passage of that set (its ids start with {s.prefix})"
                )
            elif not block.holds(item.quote):
                problems.append(f'"{s.key}" evidence {n}: the quote is not an exact substring of {block.id}')
    return problems


def grounding_problems(reply: GroundingReply, blocks: Mapping[str, Block], answer: str) -> list[str]:
    problems: list[str] = []
    for n, claim in enumerate(reply.claims, start=1):
        if claim.status == "unsupported":
            continue
        block = blocks.get(claim.source_id)
        if block is None:
            problems.append(
                f"claim {n} is {claim.status} but cites {safe_id(claim.source_id)}, which is not a "
                "passage (R..) or tool call (T..) given"
            )
        elif not block.holds(claim.quote):
            problems.append(f"claim {n}: the quote is not an exact substring of {block.id}")
    if reply.declined.verdict == "declined" and not quote_found(reply.declined.quote, answer):
        problems.append('"declined" needs a quote that is an exact substring of the answer')
    return problems


# -- replies to facts --------------------------------------------------------------------------------
#
# From verified replies to facts: containment per set, where the answer is, grounding, declining.
#
# `partial` maps to "does not contain the answer" by default (`partial_is_answer=False`): a set that
# only partly answers is a retrieval miss when the index holds the whole answer, and a content gap
# when it does not. The raw verdict is kept in the evidence note, so a replay can remap it.


@dataclass(frozen=True)
class FactMaker:
    components: Mapping[str, Component]
    partial_is_answer: bool = False

    def maps_to_answer(self, verdict: SetVerdict) -> bool:
        return verdict.verdict == "contains_answer" or (
            verdict.verdict == "partial" and self.partial_is_answer
        )

    def holders(self, s: PassageSet | None, verdict: SetVerdict | None, *, partial_too: bool = False) -> list[Block]:
        """The blocks cited as holding the answer (or, with `partial_too`, part of it)."""
        if s is None or verdict is None:
            return []
        if not (self.maps_to_answer(verdict) or (partial_too and verdict.verdict == "partial")):
            return []
        ids = dict.fromkeys(q.passage_id for q in verdict.evidence)
        return [s.blocks[i] for i in ids if i in s.blocks]

    def facts(
        self,
        base: Facts,
        findings: list[str],
        *,
        grounding: GroundingReply | None,
        containment: tuple[ContainmentReply, PassageSet, PassageSet | None] | None = None,
    ) -> Facts:
        """`base` completed with what the replies establish: call A's (`containment`: the reply and
        the R and S sets it was asked about) and call B's. Without call B the grounding facts stay
        as `base` has them (unestablished, or settled by a cascade); without call A, so do the
        containment facts."""
        evidence: dict[str, Evidence] = {}
        update: dict[str, Any] = {}
        replies: list[tuple[str, ContainmentReply | GroundingReply]] = []
        if containment is not None:
            reply, r_set, s_set = containment
            update.update(self._containment(base, reply, r_set, s_set, evidence))
            replies.append(("call A", reply))
        if grounding is not None:
            update.update(self._grounding(grounding, evidence))
            replies.append(("call B", grounding))
        flagged_by_model = [
            f"{where} (model): {r.injection_note or 'no note'}"[:200] for where, r in replies if r.injection_suspected
        ]
        injection = bool(findings or flagged_by_model)
        if injection:
            evidence["injection_suspected"] = Evidence(
                confidence="high" if findings else "low", note="; ".join(findings + flagged_by_model)[:1000]
            )
        update["evidence"] = {**base.evidence, **evidence}
        update["injection_suspected"] = injection or base.injection_suspected
        return base.model_copy(update=update)

    def _containment(
        self,
        base: Facts,
        containment: ContainmentReply,
        r_set: PassageSet,
        s_set: PassageSet | None,
        evidence: dict[str, Evidence],
    ) -> dict[str, Any]:
        # (a) the agent's passages
        r_verdict = containment.retrieved if r_set.passages else None
        retrieved = bool(r_verdict and self.maps_to_answer(r_verdict))
        if r_verdict:
            evidence["retrieved_has_answer"] = _evidence(r_verdict)
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
            in_index = self.maps_to_answer(s_verdict)
            evidence["index_has_answer"] = _evidence(s_verdict)

        r_holders = self.holders(r_set, r_verdict)
        s_holders = self.holders(s_set, s_verdict)
        holding = r_holders if retrieved else s_holders if in_index else []
        if retrieved:
            in_index = True  # the agent's passages came from the index
        # Where the answer is: a collection the agent searched wins (then a miss is retrieval,
        # not routing), else the first cited.
        searched = set(base.agent_searched_collections)
        collections = [b.collection for b in holding if b.collection]
        collection = next((c for c in collections if c in searched), collections[0] if collections else None)
        sources = list(dict.fromkeys(b.source_url for b in holding if b.source_url))

        # component: from the sources holding (or partly holding) the answer, else the model's pick
        hint_urls = sources or [
            b.source_url
            for b in self.holders(r_set, r_verdict, partial_too=True)
            + self.holders(s_set, s_verdict, partial_too=True)
            if b.source_url
        ]
        component = component_from_sources(hint_urls, self.components)
        if component is not None:
            evidence["component"] = Evidence(confidence="high", note="from the source URL of the passages")
        else:
            pick = containment.component
            if pick.name in self.components:
                component = pick.name
                evidence["component"] = Evidence(note=f"picked by the model: {pick.reasoning}"[:500])
            else:  # discarded, not a reason to reject the reply: keywords or the default decide
                component = None
                evidence["component"] = Evidence(
                    confidence="low",
                    note=f"the model's pick {pick.name[:60]!r} is not in the catalogue; discarded",
                )
        return {
            "retrieved_has_answer": retrieved,
            "index_has_answer": in_index,
            "answer_collection": collection,
            "component": component,
            "answer_sources": sources,
        }

    @staticmethod
    def _grounding(reply: GroundingReply, evidence: dict[str, Evidence]) -> dict[str, Any]:
        bad = [c for c in reply.claims if c.status != "supported"]
        unsupported = [c.claim if c.status == "unsupported" else f"contradicted: {c.claim}" for c in bad]
        # One unsupported claim is enough, whatever the verdict says; a verdict at odds with its
        # own claims is kept but marked low confidence.
        grounded = reply.grounding.verdict != "ungrounded" and not bad
        consistent = (reply.grounding.verdict == "ungrounded") == bool(bad)
        supported = [c for c in reply.claims if c.status == "supported"]
        evidence["answer_grounded"] = Evidence(
            passage_ids=list(dict.fromkeys(c.source_id for c in reply.claims if c.status != "unsupported")),
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
        return {"answer_grounded": grounded, "answer_declined": declined, "unsupported_claims": unsupported}


def _evidence(verdict: SetVerdict) -> Evidence:
    return Evidence(
        passage_ids=list(dict.fromkeys(q.passage_id for q in verdict.evidence)),
        quotes=[q.quote for q in verdict.evidence],
        confidence=verdict.confidence,
        note=f"{verdict.verdict}: {verdict.reasoning}"[:500],
    )
