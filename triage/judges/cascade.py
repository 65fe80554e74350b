"""The cascade judge: the cheap (heuristic) judge first, the model only for the facts it is not sure of.

The heuristic states a confidence for every fact. A fact it calls `high` is settled: on the
evaluation set every `high` fact of the heuristic is right (bench/heuristic_eval.py), and
`bench/evalset.py --figures` checks each settled group on the whole set. Everything else goes to
the model, by call:

- **containment** (call A: `retrieved_has_answer`, `index_has_answer`, the collection) is asked
  unless every containment fact the rule reads on the heuristic's path is `high`;
- **grounding** (call B: `answer_grounded`, `answer_declined`) is asked only once the containment
  facts are known (the heuristic's settled ones, or call A's reply) and only if the rule's path
  through them reads a grounding fact that is not `high` (a retrieval or routing miss reads none);
- **no search call**: the trace proves the layer (`agent_skipped_retrieval`); no model call.

So a trace costs 0, 1 or 2 model calls, and a fact is never decided by a cheap guess the
heuristic itself doubts. Call B waits for call A where both may be needed: a trace that needs both
takes two round trips in series instead of one, which the night's concurrency hides, and a miss
saves the call. A model judge that cannot make one call without the other (`can_skip_grounding`
false) is asked for both at once. The deterministic injection detector runs on every trace, so a
trace settled without the model is still flagged. Each fact records who decided it (`decided_by`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from triage.domain.ports import Judge, JudgeRequest
from triage.domain.records import JUDGED_FACTS, Facts, Trace, Usage, decided_by
from triage.domain.rule import walk

_CONTAINMENT = ("retrieved_has_answer", "index_has_answer", "answer_collection")
_GROUNDING = ("answer_grounded", "answer_declined")
#: what a settled group carries with it into the model's facts
_CONTAINMENT_KEPT = (*_CONTAINMENT, "component", "answer_sources")
_GROUNDING_KEPT = (*_GROUNDING, "unsupported_claims")

class CascadeJudge:
    """`cheap` first; `model` only where the cheap facts do not decide the layer."""

    needs_research = True
    #: the cascade decides itself which calls its model judge makes
    can_skip_grounding = False

    def __init__(self, cheap: Judge, model: Judge) -> None:
        self.cheap = cheap
        self.model = model
        self.name = f"cascade:{cheap.name}+{model.name}"
        self.prompt_version: str | None = f"{cheap.prompt_version}+{model.prompt_version}"
        #: how traces were settled: "cheap" (no model call), "containment" (call A only),
        #: "grounding" (call B only), "model" (both)
        self.routes: dict[str, int] = {"cheap": 0, "containment": 0, "grounding": 0, "model": 0}

    @property
    def usage(self) -> Usage:
        return self.model.usage  # the cheap judge spends nothing

    async def aclose(self) -> None:
        await self.cheap.aclose()
        await self.model.aclose()

    async def judge(self, request: JudgeRequest) -> Facts:
        base = request.base
        cheap = decided_by(await self.cheap.judge(request), self.cheap.name)
        if not base.agent_searched:
            self.routes["cheap"] += 1
            return cheap  # the cheap judge has already run the injection detector
        need_a, need_b = self.escalation(cheap)
        if not (need_a or need_b):
            self.routes["cheap"] += 1
            return self._unsure_dropped(cheap, cheap)
        if not self.model.can_skip_grounding:
            # a model judge that makes both calls or none
            self.routes["model"] += 1
            judged = await self.model.judge(replace(request, grounding=True, containment=True))
            return self._merged(judged, cheap)
        if not need_a:
            self.routes["grounding"] += 1
            start = self._keeping(base, cheap, _CONTAINMENT_KEPT)
            judged = await self.model.judge(self._grounding_call(request, start))
            return self._merged(judged, cheap)
        start = self._keeping(base, cheap, _GROUNDING_KEPT)
        judged = await self.model.judge(replace(request, base=start, grounding=False, containment=True))
        if not self.grounding_needed(judged, cheap):
            self.routes["containment"] += 1
            return self._merged(judged, cheap)
        self.routes["model"] += 1
        judged = await self.model.judge(self._grounding_call(request, judged))
        return self._merged(judged, cheap)

    @staticmethod
    def _grounding_call(request: JudgeRequest, base: Facts) -> JudgeRequest:
        """Call B alone, on `base`'s containment facts (a grounding call makes no search)."""
        return replace(request, base=base, grounding=True, containment=False, search_more=None)

    @staticmethod
    def _keeping(base: Facts, cheap: Facts, kept: tuple[str, ...]) -> Facts:
        """What the trace proves plus the cheap facts the model is not asked about."""
        return base.model_copy(
            update={
                **{name: getattr(cheap, name) for name in kept},
                "evidence": {name: held for name, held in cheap.evidence.items() if name in kept},
            }
        )

    def _merged(self, judged: Facts, cheap: Facts) -> Facts:
        injection = judged.injection_suspected or cheap.injection_suspected
        merged = decided_by(judged.model_copy(update={"injection_suspected": injection}), self.model.name)
        return self._unsure_dropped(merged, cheap)

    def _unsure_dropped(self, facts: Facts, cheap: Facts) -> Facts:
        """`facts` without the cheap guesses nobody checked: a fact the cheap judge decided, is not
        sure of, and the rule does not read (so no call asked about it) is left unestablished
        instead of written as if it were known."""
        dropped = [
            name
            for name in JUDGED_FACTS
            if getattr(facts, name) is not None
            and (held := facts.evidence.get(name)) is not None
            and held.decided_by == self.cheap.name
            and not self._sure(cheap, name)
        ]
        if not dropped:
            return facts
        update: dict[str, Any] = dict.fromkeys(dropped, None)
        if "answer_grounded" in dropped:
            update["unsupported_claims"] = []
        if "index_has_answer" in dropped:
            update["answer_collection"] = None
        update["evidence"] = {k: v for k, v in facts.evidence.items() if k not in dropped}
        return facts.model_copy(update=update)

    @staticmethod
    def _sure(cheap: Facts, name: str) -> bool:
        held = cheap.evidence.get(name)
        return getattr(cheap, name) is not None and held is not None and held.confidence == "high"

    @classmethod
    def grounding_needed(cls, facts: Facts, cheap: Facts, issues_collection: str = "issues") -> bool:
        """Whether call B must be made: the rule's path through `facts` (their containment facts
        settled) reads a grounding fact the cheap judge is not sure of. A path that stops at a
        containment fact nobody established reads none: no grounding fact can decide that trace."""
        path = walk(facts, issues_collection).judged
        return not all(cls._sure(cheap, f) for f in path if f in _GROUNDING)

    @classmethod
    def escalation(cls, cheap: Facts, issues_collection: str = "issues") -> tuple[bool, bool]:
        """Which calls the cheap facts alone ask for: (containment, grounding). Where containment is
        asked, whether grounding is too waits for call A's reply (`grounding_needed`)."""
        path = walk(cheap, issues_collection).judged
        need_a = not all(cls._sure(cheap, f) for f in path if f in _CONTAINMENT)
        return need_a, cls.grounding_needed(cheap, cheap, issues_collection)

    #: what `settled` reports, for measuring each group's precision (bench/evalset.py --figures)
    SHORTCUTS = ("no search call", "containment settled", "grounding settled")

    @classmethod
    def settled(
        cls, trace: Trace, cheap: Facts, model: Facts | None = None
    ) -> list[tuple[str, dict[str, bool]]]:
        """The groups of facts the cascade takes from the cheap judge on this trace, with their
        values. `model`: the containment facts call A would return, where it is asked (the labels,
        for a perfect model); without it a grounding fact counts as settled only if `high`."""
        if not trace.searched:
            return [("no search call", {"agent_searched": False})]
        need_a, need_b = cls.escalation(cheap)
        if need_a and model is not None:
            # call A's reply carries the cheap grounding facts it was given (`_keeping`)
            model = model.model_copy(update={name: getattr(cheap, name) for name in _GROUNDING_KEPT})
            need_b = cls.grounding_needed(model, cheap)
        elif need_a:
            need_b = True
        out: list[tuple[str, dict[str, bool]]] = []
        if not need_a:
            values = {n: v for n in _CONTAINMENT if isinstance(v := getattr(cheap, n), bool)}
            if values:
                out.append(("containment settled", values))
        if not need_b:
            path = walk(model if need_a and model is not None else cheap).judged
            values = {n: v for n in _GROUNDING if n in path and isinstance(v := getattr(cheap, n), bool)}
            if values:
                out.append(("grounding settled", values))
        return out
