"""The cascade judge: the cheap (heuristic) judge first, the model only for the facts it is not sure of.

The heuristic states a confidence for every fact. A fact it calls `high` is settled: on the
evaluation set every `high` fact of the heuristic is right (bench/heuristic_eval.py), and
`bench/evalset.py --figures` checks each settled group on the whole set. Everything else goes to
the model, by call:

- **containment** (call A: `retrieved_has_answer`, `index_has_answer`, the collection) is asked
  unless every containment fact the rule reads on the heuristic's path is `high`;
- **grounding** (call B: `answer_grounded`, `answer_declined`) is asked unless both are `high`, or
  the path is settled and reads neither (a retrieval or routing miss);
- **no search call**: the trace proves the layer (`agent_skipped_retrieval`); no model call.

So a trace costs 0, 1 or 2 model calls, and a fact is never decided by a cheap guess the
heuristic itself doubts. The deterministic injection detector runs on every trace, so a trace
settled without the model is still flagged. Each fact records who decided it (`decided_by`).
"""

from __future__ import annotations

from triage.domain.confidence import facts_used
from triage.domain.ports import Judge
from triage.domain.records import Facts, Passage, Trace, Usage, decided_by

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

    async def judge(
        self,
        trace: Trace,
        research: list[Passage] | None,
        comment: str | None,
        base: Facts,
        *,
        grounding: bool = True,
        containment: bool = True,
    ) -> Facts:
        cheap = decided_by(await self.cheap.judge(trace, research, comment, base), self.cheap.name)
        if not base.agent_searched:
            self.routes["cheap"] += 1
            return cheap  # the cheap judge has already run the injection detector
        need_a, need_b = self.escalation(cheap)
        if not (need_a or need_b):
            self.routes["cheap"] += 1
            return cheap
        if not (need_a and need_b) and not self.model.can_skip_grounding:
            need_a = need_b = True  # a model judge that makes both calls or none
        self.routes["model" if need_a and need_b else "containment" if need_a else "grounding"] += 1
        # the model starts from what the trace proves plus the cheap facts it is not asked about
        kept = _GROUNDING_KEPT if need_a else _CONTAINMENT_KEPT
        start = base.model_copy(
            update={
                **{name: getattr(cheap, name) for name in kept},
                "evidence": {name: held for name, held in cheap.evidence.items() if name in kept},
            }
        )
        judged = await self.model.judge(trace, research, comment, start, grounding=need_b, containment=need_a)
        injection = judged.injection_suspected or cheap.injection_suspected
        return decided_by(judged.model_copy(update={"injection_suspected": injection}), self.model.name)

    @staticmethod
    def escalation(cheap: Facts, issues_collection: str = "issues") -> tuple[bool, bool]:
        """Which calls the model must make: (containment, grounding), from the cheap confidences."""

        def sure(name: str) -> bool:
            held = cheap.evidence.get(name)
            return getattr(cheap, name) is not None and held is not None and held.confidence == "high"

        path = facts_used(cheap, issues_collection)
        need_a = not all(sure(f) for f in path if f in _CONTAINMENT and f != "answer_collection")
        if need_a:
            # the model may take another branch: every branch but a miss reads both grounding facts
            need_b = not (sure("answer_grounded") and sure("answer_declined"))
        else:
            need_b = not all(sure(f) for f in path if f in _GROUNDING)
        return need_a, need_b

    #: what `settled` reports, for measuring each group's precision (bench/evalset.py --figures)
    SHORTCUTS = ("no search call", "containment settled", "grounding settled")

    @classmethod
    def settled(cls, trace: Trace, cheap: Facts) -> list[tuple[str, dict[str, bool]]]:
        """The groups of facts the cascade takes from the cheap judge on this trace, with their values."""
        if not trace.searched:
            return [("no search call", {"agent_searched": False})]
        need_a, need_b = cls.escalation(cheap)
        out: list[tuple[str, dict[str, bool]]] = []
        groups = (("containment settled", need_a, _CONTAINMENT), ("grounding settled", need_b, _GROUNDING))
        for group, needed, names in groups:
            values = {n: v for n in names if isinstance(v := getattr(cheap, n), bool)}
            if not needed and values:
                out.append((group, values))
        return out
