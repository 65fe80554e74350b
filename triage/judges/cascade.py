"""The cascade judge: the cheap (heuristic) judge first, the model only for what it cannot decide.

What the heuristic decides on its own, and why:

- **no search call**: the layer is `agent_skipped_retrieval` whatever else is true. No model call.
- **grounding**, in two cases only:
  - the answer holds a specific (URL, flag, identifier, setting) that appears nowhere in what the
    agent saw *and* is built of a word the agent never saw (code and markup boilerplate aside):
    `answer_grounded=False` is decided. Then `answer_declined` no longer matters to the rule (an
    ungrounded answer is `generation` or `content_gap_hallucination` either way). A specific made
    only of seen words (`runtimeRef.name` from a `runtimeRef:` block with a `name:` key,
    `ClusterRole/kubeflow-view`, `objectiveMetricName` for "the objective metric name"), a number
    (`0.93`) and any specific of a JSON answer (structured output: its keys and numbers are not
    claims) are rewordings as often as inventions: those go to the model. Measured on the
    evaluation set (bench/evalset.py --figures), the exact-string check alone was wrong on 9 of
    the 38 traces it fired on, grounded answers all; the word check is right on all it fires on.
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

import json
import re
from typing import Any

from triage.domain.ports import Judge
from triage.domain.records import Evidence, Facts, Passage, Trace, Usage, decided_by
from triage.judges.heuristic import specifics

_WORD_PART = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])")
#: words of code and markup that claim nothing on their own: an answer adds them when it formats
#: what it saw (`enabled: true`, `https://`, `pip install`, `name:`)
BOILERPLATE = frozenset(
    """true false null none yes http https www com org html yaml yml json txt name value key spec metadata kind
    type api pip install sudo tar zip""".split()
)


def word_parts(text: str) -> set[str]:
    """The words of `text` and of its identifiers (`earlyStopping` -> early, stopping;
    `max_concurrency` -> max, concurrency), lower case, three letters or more."""
    return {p.lower() for p in _WORD_PART.findall(text) if len(p) >= 3}


def unseen_words(specific: str, seen: set[str]) -> list[str]:
    """The words of an answer's specific that the agent never saw (`seen` from `word_parts` of all
    it saw), leaving out code and markup boilerplate: a specific built only of seen words
    (`runtimeRef.name` from "runtimeRef" and "name") may be a rewording, one with a new word names
    something the agent was never shown."""
    return sorted(w for w in word_parts(specific) - seen if w not in BOILERPLATE)


def seen_texts(trace: Trace) -> list[str]:
    """Everything the agent saw: the question, every tool call's arguments and output, the
    passages and their sources."""
    seen = [trace.question, *(c.output for c in trace.tool_calls), *(p.text for p in trace.passages)]
    seen += [p.source_url or "" for p in trace.passages]
    seen += [json.dumps(c.args, ensure_ascii=False) for c in trace.tool_calls]
    return seen


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
        cheap = decided_by(await self.cheap.judge(trace, research, comment, base), self.cheap.name)
        flagged = cheap  # the cheap judge has already run the injection detector
        if not base.agent_searched:
            self.routes["cheap"] += 1
            return flagged
        settled = self.grounding_decided(trace, cheap)
        if settled is not None and not trace.passages and research == []:
            self.routes["cheap"] += 1
            update: dict[str, Any] = {"retrieved_has_answer": False, "index_has_answer": False}
            update.update(self._decided_grounding(trace, cheap, flagged.evidence, settled, self.cheap.name))
            update["evidence"] = {
                **update["evidence"],
                "retrieved_has_answer": Evidence(
                    confidence="high", note="no passages were retrieved", decided_by=self.cheap.name
                ),
                "index_has_answer": Evidence(
                    confidence="high", note="the re-search found no passages", decided_by=self.cheap.name
                ),
            }
            return flagged.model_copy(update=update)
        if settled is not None and self.model.can_skip_grounding:
            self.routes["containment"] += 1
            judged = await self.model.judge(trace, research, comment, base, grounding=False)
            update = self._decided_grounding(trace, cheap, judged.evidence, settled, self.cheap.name)
            update["injection_suspected"] = judged.injection_suspected or flagged.injection_suspected
            return decided_by(judged.model_copy(update=update), self.model.name)
        self.routes["model"] += 1
        judged = await self.model.judge(trace, research, comment, base)
        return decided_by(judged, self.model.name)  # the model judge runs the same detector

    @staticmethod
    def _decided_grounding(
        trace: Trace, cheap: Facts, evidence: dict[str, Evidence], settled: str, judge: str
    ) -> dict[str, Any]:
        phrase = "a decline phrase" if cheap.answer_declined else "no decline phrase"
        invented = invented_specifics(trace, cheap)
        return {
            "answer_grounded": cheap.answer_grounded,
            "answer_declined": cheap.answer_declined,
            # the specifics with a word never seen first: they are what decided it
            "unsupported_claims": list(dict.fromkeys([*invented, *cheap.unsupported_claims])),
            "evidence": {
                **evidence,
                "answer_grounded": Evidence(
                    confidence="high", note=f"decided by the heuristic: {settled}", decided_by=judge
                ),
                "answer_declined": Evidence(note=f"decided by the heuristic: {phrase}", decided_by=judge),
            },
        }

    #: the cheap checks, by the name `shortcuts` gives them
    SHORTCUTS = (
        "no search call",
        "invented specifics",
        "a decline phrase and no specifics",
        "no passages anywhere",
    )

    @classmethod
    def shortcuts(
        cls, trace: Trace, research: list[Passage] | None, cheap: Facts
    ) -> list[tuple[str, dict[str, bool]]]:
        """Every cheap check that fires on this trace, with the facts it decides (for measuring
        each check's precision against labels: bench/evalset.py --figures). `judge` takes them."""
        if not trace.searched:
            return [("no search call", {"agent_searched": False})]
        fired: list[tuple[str, dict[str, bool]]] = []
        settled = cls.grounding_decided(trace, cheap)
        if settled is not None and cheap.answer_grounded is False:
            fired.append(("invented specifics", {"answer_grounded": False}))
        elif settled is not None:
            fired.append(("a decline phrase and no specifics", {"answer_grounded": True, "answer_declined": True}))
        if fired and not trace.passages and research == []:
            fired.append(("no passages anywhere", {"retrieved_has_answer": False, "index_has_answer": False}))
        return fired

    @staticmethod
    def grounding_decided(trace: Trace, cheap: Facts) -> str | None:
        """Why the cheap facts settle grounding (and declining), or None when they do not."""
        if cheap.answer_grounded is False and cheap.unsupported_claims:
            invented = invented_specifics(trace, cheap)
            if invented:
                return "specifics with words the agent never saw: " + ", ".join(invented[:5])
            return None
        if cheap.answer_declined and cheap.answer_grounded and not specifics(trace.answer):
            return "a decline phrase and no specifics"
        return None


def invented_specifics(trace: Trace, cheap: Facts) -> list[str]:
    """The answer's unsupported specifics that hold a word the agent never saw; none for a JSON
    answer (its keys and values are structure, not claims)."""
    if cheap.answer_grounded is not False or not cheap.unsupported_claims or _is_json(trace.answer):
        return []
    seen = word_parts("\n".join(seen_texts(trace)))
    return [s for s in cheap.unsupported_claims if unseen_words(s, seen)]


def _is_json(text: str) -> bool:
    stripped = text.strip()
    if not stripped.startswith(("{", "[")):
        return False
    try:
        json.loads(stripped)
    except (ValueError, RecursionError):
        return False
    return True
