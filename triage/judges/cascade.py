"""The cascade judge: the cheap (heuristic) judge first, the model only for what it cannot decide.

What the heuristic decides on its own, and why:

- **no search call**: the layer is `agent_skipped_retrieval` whatever else is true. No model call.
- **grounding**, in two cases only:
  - the answer holds specifics (URLs, flags, identifiers, versions) that appear nowhere in what the
    agent saw: `answer_grounded=False` is decided. Then `answer_declined` no longer matters to the
    rule (an ungrounded answer is `generation` or `content_gap_hallucination` either way).
  - a decline phrase and no specifics at all: declined and grounded (nothing was invented).
  In both cases the model is asked for containment only (call A), which saves call B.
- **containment** is never decided by key-term coverage: shared keywords do not prove a passage
  holds the answer (the weakest judge task, per ../shared/notes/judging.md). The one unambiguous
  case is no passage at all, retrieved or re-searched: nothing can hold the answer, so when
  grounding is decided too, no model call is made.

Everything else goes to the model in full. The deterministic injection detector runs on every
trace, so a trace settled without the model is still flagged.
"""

from __future__ import annotations

from typing import Any

from triage.domain.ports import Judge
from triage.domain.records import Evidence, Facts, Passage, Trace, Usage
from triage.judges.heuristic import specifics


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
        #: how traces were settled: "cheap" (no model call), "containment" (call A only), "model"
        self.routes: dict[str, int] = {"cheap": 0, "containment": 0, "model": 0}

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
    ) -> Facts:
        cheap = await self.cheap.judge(trace, research, comment, base)
        flagged = cheap  # the cheap judge has already run the injection detector
        if not base.agent_searched:
            self.routes["cheap"] += 1
            return flagged
        settled = self.grounding_decided(trace, cheap)
        if settled is not None and not trace.passages and research == []:
            self.routes["cheap"] += 1
            update: dict[str, Any] = {"retrieved_has_answer": False, "index_has_answer": False}
            update["evidence"] = {
                **flagged.evidence,
                "retrieved_has_answer": Evidence(confidence="high", note="no passages were retrieved"),
                "index_has_answer": Evidence(confidence="high", note="the re-search found no passages"),
            }
            return flagged.model_copy(update=update)
        if settled is not None and self.model.can_skip_grounding:
            self.routes["containment"] += 1
            judged = await self.model.judge(trace, research, comment, base, grounding=False)
            phrase = "a decline phrase" if cheap.answer_declined else "no decline phrase"
            evidence = {
                **judged.evidence,
                "answer_grounded": Evidence(confidence="high", note=f"decided by the heuristic: {settled}"),
                "answer_declined": Evidence(note=f"decided by the heuristic: {phrase}"),
            }
            return judged.model_copy(
                update={
                    "answer_grounded": cheap.answer_grounded,
                    "answer_declined": cheap.answer_declined,
                    "unsupported_claims": cheap.unsupported_claims,
                    "evidence": evidence,
                    "injection_suspected": judged.injection_suspected or flagged.injection_suspected,
                }
            )
        self.routes["model"] += 1
        judged = await self.model.judge(trace, research, comment, base)
        return judged  # the model judge runs the same detector

    @staticmethod
    def grounding_decided(trace: Trace, cheap: Facts) -> str | None:
        """Why the cheap facts settle grounding (and declining), or None when they do not."""
        if cheap.answer_grounded is False and cheap.unsupported_claims:
            return "specifics seen nowhere by the agent: " + ", ".join(cheap.unsupported_claims[:5])
        if cheap.answer_declined and cheap.answer_grounded and not specifics(trace.answer):
            return "a decline phrase and no specifics"
        return None
