"""`triage queue`: a sample of the job's verdicts into a Langfuse annotation queue, for people to label.

What goes in, from the verdicts (`triage_layer` scores of this rule version) in the window:

- per layer, the first `per_layer` traces in a stable hash order of their ids (the same traces on
  every rerun); a trace of that layer already in the queue counts toward its share, so a rerun, or
  the next night's overlapping window, does not top a layer up twice;
- plus every verdict of low confidence (`domain.rule.verdict_confidence`; facts that cannot
  be read count as low) and every one flagged as a suspected injection;
- suggestions first: the items are added (and Langfuse lists them) with the verdicts that are
  suggestions (`RulePath.sure` false: some fact the layer rests on is not `high`) before the sure
  ones, each group in trace id order, so people spend their first minutes where the judge is unsure.

Idempotent: the queue's items are read first and a trace already there (pending or completed) is
never added again; Langfuse itself does not de-duplicate items. The score configs (the layer as a
CATEGORICAL score with the seven layers, one BOOLEAN per judged fact) and the queue are created
when missing, found by name otherwise. Never pre-filled: an item is the trace alone (`objectType`
TRACE and its id), no score is written, and neither the queue nor the configs name any verdict, so
nothing anchors the reviewer to the judge's answer.

The review view (`triage votes`): conversations of a window with their votes, filtered.

Read through the ports: the window's votes (`VoteSource.votes`), its traces (`TraceSource.root_traces`),
the traces of each session (`session_traces`); a vote on a trace that started before the window
is placed by reading that trace's observations (its root's session).
"""

from __future__ import annotations

import hashlib
import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from triage.calibration.calibrate import decisions_from_scores
from triage.domain.config import CalibrationConfig, ReviewNames, TriageConfig
from triage.domain.kernel import Window
from triage.domain.ports import ScoreReader, TraceSource, VoteSource
from triage.domain.records import Layer
from triage.domain.review import (
    AnnotationPort,
    Category,
    Decision,
    ReviewQueue,
    ScoreConfigSpec,
    config_name_problem,
    ensure_configs,
)
from triage.domain.rule import verdict_confidence, walk
from triage.domain.votes import FILTERS, ConversationList, TraceRef, group_conversations
from triage.errors import ConfigError, UsageError

log = logging.getLogger("triage")

#: fixed: changing it would reshuffle which traces every later run samples
SAMPLE_SALT = "triage-queue:1"

Reason = Literal["sample", "low_confidence", "injection"]

QUEUE_DESCRIPTION = (
    "Thumbs-down answers of the agent, for people to label: where did each answer fail? "
    "Judge from the trace alone."
)
LAYER_DESCRIPTION = (
    "Where the answer failed: retrieval, generation, tool_routing, agent_skipped_retrieval, "
    "content_gap_hallucination, content_gap_handled, or ok (the answer was right)."
)
FACT_DESCRIPTIONS = {
    "retrieved_has_answer": "The passages the agent retrieved hold the answer.",
    "index_has_answer": "Some collection of the index holds the answer, found by the agent or not.",
    "answer_grounded": "Every factual claim of the answer is supported by the retrieved passages.",
    "answer_declined": "The answer declines, or says it does not know.",
}


def sample_key(trace_id: str) -> str:
    """A trace's place in the sampling order: stable across runs, machines and Python versions."""
    return hashlib.sha256(f"{SAMPLE_SALT}:{trace_id}".encode()).hexdigest()


@dataclass(frozen=True)
class QueueOptions:
    since_hours: float = 24.0
    per_layer: int = 10
    dry_run: bool = False
    now: datetime = field(default_factory=lambda: datetime.now(UTC))


@dataclass(frozen=True)
class Pick:
    """A trace chosen for review, and why (kept out of Langfuse: the item is the trace alone)."""

    trace_id: str
    layer: Layer
    reasons: tuple[Reason, ...]
    #: the verdict is sure (`RulePath.sure` on its facts); suggestions are queued first
    sure: bool = False


@dataclass
class LayerCount:
    verdicts: int = 0
    in_queue: int = 0  # before this run
    added: int = 0


@dataclass
class QueueResult:
    start: datetime
    end: datetime
    queue_name: str
    dry_run: bool = False
    queue_id: str | None = None
    queue_created: bool = False
    configs_created: list[str] = field(default_factory=list)
    verdicts: int = 0
    unreadable_facts: int = 0
    layers: dict[Layer, LayerCount] = field(default_factory=lambda: {layer: LayerCount() for layer in Layer})
    added: list[Pick] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    requests: int = 0

    def lines(self) -> list[str]:
        """The plain-text summary `triage queue` prints."""
        verb = "would add" if self.dry_run else "added"
        state = "created" if self.queue_created else "to be created" if self.queue_id is None else "found"
        out = [
            f"annotation queue {self.queue_name!r}: {state}"
            + (f" (id {self.queue_id})" if self.queue_id else ""),
            "score configs: "
            + (
                ("would create " if self.dry_run else "created ") + ", ".join(self.configs_created)
                if self.configs_created
                else "all present"
            ),
            f"window {self.start.isoformat(timespec='minutes')} .. {self.end.isoformat(timespec='minutes')}: "
            f"{self.verdicts} verdicts"
            + (
                f" ({self.unreadable_facts} with unreadable facts, counted as low confidence)"
                if self.unreadable_facts
                else ""
            ),
            "",
            "| layer | verdicts | in the queue before | " + verb + " |",
            "|---|---|---|---|",
        ]
        for layer, count in self.layers.items():
            out.append(f"| {layer.value} | {count.verdicts} | {count.in_queue} | {count.added} |")
        reasons: dict[Reason, int] = defaultdict(int)
        for pick in self.added:
            for reason in pick.reasons:
                reasons[reason] += 1
        suggestions = sum(1 for pick in self.added if not pick.sure)
        out += [
            "",
            f"{verb} {len(self.added)} traces (sampled {reasons['sample']}, low confidence "
            f"{reasons['low_confidence']}, injection suspected {reasons['injection']}); "
            f"suggestions first: {suggestions} suggestions, {len(self.added) - suggestions} sure",
        ]
        # the trace ids and why, in queue order, but not their layers: whoever reads this may be
        # the reviewer
        out += [
            f"- {pick.trace_id}: {', '.join(pick.reasons)}{'' if pick.sure else ' (suggestion)'}"
            for pick in queue_order(self.added)
        ]
        out += [f"note: {note}" for note in self.notes]
        if self.requests:
            out.append(f"backend requests {self.requests}")
        return out


def score_config_specs(calibration: CalibrationConfig) -> list[ScoreConfigSpec]:
    """The configs a reviewer scores with: the layer (CATEGORICAL, the seven layers), then one
    BOOLEAN per judged fact. Raises ConfigError for a name Langfuse would refuse."""
    reviewer = ReviewNames.of(calibration)
    specs = [
        ScoreConfigSpec(
            name=reviewer.layer,
            data_type="CATEGORICAL",
            categories=[Category(label=layer.value, value=float(i)) for i, layer in enumerate(Layer)],
            description=LAYER_DESCRIPTION,
        )
    ]
    for fact, name in reviewer.facts.items():
        specs.append(
            ScoreConfigSpec(
                name=name,
                data_type="BOOLEAN",
                description=FACT_DESCRIPTIONS.get(fact, f"The fact {fact!r} holds for this trace."),
            )
        )
    names = [spec.name for spec in specs]
    problems = [problem for name in names if (problem := config_name_problem(name))]
    if len(set(names)) < len(names):
        problems.append(f"the calibration score names repeat one another: {', '.join(names)}")
    if problems:
        raise ConfigError("calibration: " + "; ".join(problems))
    return specs


def reviewer_configs(
    port: AnnotationPort, specs: list[ScoreConfigSpec], dry_run: bool
) -> tuple[list[str], list[str]]:
    """The ids of the reviewers' configs (`domain.review.ensure_configs`) and the names created.
    An existing config that does not fit is a ConfigError: archive it in Langfuse or name another
    in the configuration's `[calibration]`."""
    found = ensure_configs(port, specs, dry_run=dry_run, strict=True)
    for name, problem in found.misfits.items():
        raise ConfigError(
            f"Langfuse's score config {name!r} ({problem}) cannot take the reviewers' labels; "
            "archive it in Langfuse, or name another score in the configuration's [calibration]"
        )
    for name in found.created:
        if name in found.ids:
            log.info("created score config %s (%s)", name, found.ids[name], extra={"event": "score_config_created"})
    return [found.ids[s.name] for s in specs if s.name in found.ids], found.created


def ensure_queue(
    port: AnnotationPort, name: str, config_ids: list[str], dry_run: bool
) -> tuple[ReviewQueue | None, bool, list[str]]:
    """The queue of that name (created when missing, with the configs), whether it was created,
    and notes (a queue that does not show some of the configs)."""
    queue = next((q for q in port.queues() if q.name == name), None)
    if queue is None:
        if dry_run:
            return None, False, []
        queue = port.create_queue(name, QUEUE_DESCRIPTION, config_ids)
        log.info("created annotation queue %s (%s)", queue.name, queue.id, extra={"event": "queue_created"})
        return queue, True, []
    missing = [cid for cid in config_ids if cid not in queue.score_config_ids]
    notes = (
        [
            f"the queue {name!r} does not show {len(missing)} of the score configs ({', '.join(missing)}); "
            "add them to it in the Langfuse UI (the API cannot change a queue)"
        ]
        if missing
        else []
    )
    return queue, False, notes


def choose(
    decisions: Iterable[Decision],
    queued: set[str],
    per_layer: int,
    issues_collection: str = "issues",
) -> tuple[list[Pick], dict[Layer, LayerCount], int]:
    """The traces to add (none already `queued`), the counts per layer, and how many verdicts'
    facts could not be read. Pure and deterministic."""
    by_layer: dict[Layer, list[Decision]] = {layer: [] for layer in Layer}
    for decision in decisions:
        if decision.layer is not None:  # the queue reads only verdicts with a layer
            by_layer[decision.layer].append(decision)
    counts = {layer: LayerCount() for layer in Layer}
    picks: list[Pick] = []
    unreadable = 0
    for layer, group in by_layer.items():
        count = counts[layer]
        count.verdicts = len(group)
        count.in_queue = sum(1 for d in group if d.trace_id in queued)
        share = max(0, per_layer - count.in_queue)
        ordered = sorted((d for d in group if d.trace_id not in queued), key=lambda d: sample_key(d.trace_id))
        sampled = {d.trace_id for d in ordered[:share]}
        for decision in ordered:
            reasons: list[Reason] = []
            if decision.trace_id in sampled:
                reasons.append("sample")
            facts = decision.facts
            if facts is None or verdict_confidence(facts, issues_collection) == "low":
                reasons.append("low_confidence")
            if facts is not None and facts.injection_suspected:
                reasons.append("injection")
            if reasons:
                sure = facts is not None and walk(facts, issues_collection).sure
                picks.append(Pick(decision.trace_id, layer, tuple(reasons), sure))
                count.added += 1
        unreadable += sum(1 for d in group if d.facts is None)
    return queue_order(picks), counts, unreadable


def queue_order(picks: Iterable[Pick]) -> list[Pick]:
    """Suggestions first, then the sure verdicts; each in trace id order (stable across runs)."""
    return sorted(picks, key=lambda p: (p.sure, p.trace_id))


def run_queue(
    *,
    port: AnnotationPort,
    scores: ScoreReader,
    config: TriageConfig,
    options: QueueOptions,
    window: Window,
) -> QueueResult:
    """Fill the review queue from the window's verdicts. The one core call behind `triage queue`.

    Raises ConfigError (a config name Langfuse would refuse, an existing config that does not fit,
    refused credentials) or LangfuseError. Items already added stay added when a later one fails;
    a rerun adds the rest and never repeats one."""
    calibration = config.calibration
    specs = score_config_specs(calibration)
    start, end = window.start, window.end
    result = QueueResult(start=start, end=end, queue_name=calibration.queue, dry_run=options.dry_run)
    config_ids, result.configs_created = reviewer_configs(port, specs, options.dry_run)
    queue, result.queue_created, result.notes = ensure_queue(
        port, calibration.queue, config_ids, options.dry_run
    )
    result.queue_id = queue.id if queue else None

    layer_score = config.scores.layer
    read = decisions_from_scores(
        scores.scores([layer_score], start, end),
        layer_score,
        config.rule_version,
        config.agent.issues_collection,
        current_only=True,
    )
    found = [read[trace_id] for trace_id in sorted(read)]
    result.verdicts = len(found)
    queued: set[str] = set()
    if queue is not None:
        queued = {item.object_id for item in port.queue_items(queue.id) if item.object_type == "TRACE"}
    picks, result.layers, result.unreadable_facts = choose(
        found, queued, options.per_layer, config.agent.issues_collection
    )
    log.info(
        "%d verdicts in the window, %d of them already in the queue, %d to add",
        len(found),
        sum(c.in_queue for c in result.layers.values()),
        len(picks),
        extra={"event": "queue_plan", "to_add": len(picks)},
    )
    if queue is None or options.dry_run:
        result.added = picks
        return result
    for pick in picks:
        port.add_item(queue.id, pick.trace_id, "TRACE")
        result.added.append(pick)
        log.debug("queued trace %s", pick.trace_id, extra={"event": "queued"})
    return result


log = logging.getLogger("triage")


@dataclass(frozen=True)
class VotesOptions:
    since_hours: float = 24 * 7
    filter: str = "any"
    now: datetime = field(default_factory=lambda: datetime.now(UTC))


def list_conversations(
    votes_source: VoteSource,
    traces: TraceSource,
    vote_score: str,
    options: VotesOptions,
    window: Window,
) -> ConversationList:
    if options.filter not in FILTERS:
        raise UsageError(f"unknown filter {options.filter!r}: one of {', '.join(FILTERS)}")
    start, end = window.start, window.end
    read = votes_source.votes(vote_score, start, end)
    votes = read.votes
    for bad in read.bad:
        log.warning("vote %s cannot be read: %s", bad.id or "(no id)", bad.reason, extra={"event": "bad_vote"})
    refs = {ref.trace_id: ref for ref in traces.root_traces(start, end)}
    outside = sorted({v.trace_id for v in votes if v.trace_id and v.trace_id not in refs})
    if outside:
        for trace_id, found in traces.observations(outside).items():
            if isinstance(found, list) and found:
                roots = [o for o in found if o.parent_observation_id is None or o.is_root_observation]
                root = min(roots or found, key=lambda o: o.start_time)
                refs[trace_id] = TraceRef(trace_id=trace_id, session_id=root.session_id, start_time=root.start_time)
            else:
                refs[trace_id] = TraceRef(trace_id=trace_id)  # not readable (yet): its own conversation
    sessions = sorted(
        {r.session_id for r in refs.values() if r.session_id}
        | {v.session_id for v in votes if v.session_id and not v.trace_id}
    )
    session_traces = traces.session_traces(sessions) if sessions else {}
    rows = group_conversations(refs.values(), votes, session_traces)
    kept = [c for c in rows if FILTERS[options.filter](c)]
    for conversation in kept:
        if conversation.first_trace:
            conversation.url = traces.trace_url(conversation.first_trace)
    return ConversationList(
        start=start, end=end, filter=options.filter, total=len(rows), conversations=kept, bad_votes=read.bad
    )
