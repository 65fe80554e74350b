"""From verified replies to facts: containment per set, where the answer is, grounding, declining.

`partial` maps to "does not contain the answer" by default (`partial_is_answer=False`): a set that
only partly answers is a retrieval miss when the index holds the whole answer, and a content gap
when it does not. The raw verdict is kept in the evidence note, so a replay can remap it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from triage.domain.config import Component
from triage.domain.records import Evidence, Facts
from triage.judges.llm.blocks import Block, PassageSet
from triage.judges.llm.replies import ContainmentReply, GroundingReply, SetVerdict


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

    def component_from_sources(self, urls: Sequence[str | None]) -> str | None:
        for url in urls:
            for name, component in self.components.items():
                if url and any(pattern and pattern in url for pattern in component.sources):
                    return name
        return None

    def facts(
        self,
        base: Facts,
        containment: ContainmentReply,
        r_set: PassageSet,
        s_set: PassageSet | None,
        grounding: GroundingReply | None,
        findings: list[str],
    ) -> Facts:
        """`base` completed with what the replies establish."""
        evidence: dict[str, Evidence] = {}
        update: dict[str, Any] = {}
        update.update(self._containment(base, containment, r_set, s_set, evidence))
        model_flags = [("call A", containment.injection_suspected, containment.injection_note)]
        if grounding is not None:
            update.update(self._grounding(grounding, evidence))
            model_flags.append(("call B", grounding.injection_suspected, grounding.injection_note))
        # without call B the grounding facts stay as `base` has them: unestablished, or settled by a cascade
        flagged_by_model = [
            f"{where} (model): {note or 'no note'}"[:200] for where, flag, note in model_flags if flag
        ]
        injection = bool(findings or flagged_by_model)
        if injection:
            evidence["injection_suspected"] = Evidence(
                confidence="high" if findings else "low", note="; ".join(findings + flagged_by_model)[:1000]
            )
        update["evidence"] = {**base.evidence, **evidence}
        update["injection_suspected"] = injection or base.injection_suspected
        return base.model_copy(update=update)

    def grounding_only(self, base: Facts, grounding: GroundingReply | None, findings: list[str]) -> Facts:
        """`base` (its containment facts settled elsewhere) completed with call B's facts."""
        evidence: dict[str, Evidence] = {}
        update: dict[str, Any] = {}
        flags: list[str] = []
        if grounding is not None:
            update.update(self._grounding(grounding, evidence))
            if grounding.injection_suspected:
                flags.append(f"call B (model): {grounding.injection_note or 'no note'}"[:200])
        injection = bool(findings or flags)
        if injection:
            evidence["injection_suspected"] = Evidence(
                confidence="high" if findings else "low", note="; ".join(findings + flags)[:1000]
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
        component = self.component_from_sources(hint_urls)
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
