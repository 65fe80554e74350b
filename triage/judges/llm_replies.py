"""The replies the LLM judge's model must give: their models and strict schemas, the checks every
reply passes in code, and the facts a verified reply establishes.

The schemas sent as `response_format` are generated from these models (never written twice):
every property required, no extra ones, references inlined, titles and defaults dropped, as
OpenAI's strict structured outputs want. The containment schema is narrowed per call: only the
passage sets asked about, and the component name limited to the catalogue.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from triage.domain.config import Component
from triage.domain.records import Evidence, Facts
from triage.domain.rule import Confidence, component_from_sources
from triage.judges.llm_messages import Block, PassageSet, SetKey, quote_found, safe_id


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
    #: asked for only where the judge may search again (`containment_schema(search_again=True)`)
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


def containment_schema(
    sets: Sequence[SetKey], components: Sequence[str], search_again: bool = False
) -> dict[str, Any]:
    """The containment reply's schema for the sets asked about, the component from the catalogue,
    and (`search_again`) the queries the model would search where no set holds the answer.

    Built once per (sets, catalogue, search_again) and copied per call: building it makes two
    pydantic models (about 3 ms of CPU per trace); a run sees a handful of combinations."""
    return copy.deepcopy(_containment_schema(tuple(sets), tuple(components), search_again))


@functools.lru_cache(maxsize=16)
def _containment_schema(
    sets: tuple[SetKey, ...], components: tuple[str, ...], search_again: bool
) -> dict[str, Any]:
    names: Any = Literal[tuple(components)]  # a Literal built at run time, from the catalogue
    pick = create_model("ComponentPick", __base__=_Reply, reasoning=(str, ...), name=(names, ...))
    fields: dict[str, Any] = {"injection_note": (str, ...), "injection_suspected": (bool, ...)}
    fields.update({key: (SetVerdict, ...) for key in sets})
    fields["component"] = (pick, Field(...))
    if search_again:
        fields["search_again"] = (SearchAgain, ...)
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
