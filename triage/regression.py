"""What a regression case holds besides the review: the question and its context as the agent
saw them, and what a layer implies a passing answer does (`triage promote`).

Regression cases: reviewed and selected failures become dataset items (`triage promote`).

Which traces:
- every trace a reviewer gave a `negative` verdict with a corrected answer or an expected tool
  behaviour (the relay's scores; end users' verdicts, `user:...`, are votes, not reviews);
- the triaged failures a maintainer selects: by trace id, by failure signature (the trace's
  `triage_signature` score; traces triaged before signatures have none and never match) or by layer.

What an item holds:
- input: the question, the trace's logged input, the session, and the agent's tool calls summarised
  (tool, collection, arguments, whether it failed) with the sources they retrieved;
- expected output: `answer` (the reviewer's correction; the agent's own answer where the triage said
  `ok` or a reviewer found it right), `tool_behavior` (the reviewer's, else what the layer implies:
  the tool and collection that hold the answer), `expectation` (one sentence: what a passing answer
  does), and for a failure selected without a correction what the layer's facts add: `must_cite` (the
  passages that hold the answer), `must_not_claim` (the unsupported claims), `decline` (a content gap:
  the agent must say the documentation does not cover it). A selected trace whose layer is undecided
  and that has no correction is skipped: there is nothing to expect yet;
- metadata: layer, component, owners, signature, the triage's reason, judge and rule version, the
  reviewer, verdict and note, the original answer, and where the expected output came from;
- `sourceTraceId`: the trace.

The id is `regression_item_id(dataset, trace)`. What is there is read first and only new or changed
items are written, so a rerun writes nothing (each Langfuse write would be a new item version).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from triage.domain.config import ReviewNames, TriageConfig, VerdictField
from triage.domain.kernel import Window, clip
from triage.domain.kernel import clip as cut
from triage.domain.ports import ScoreReader, TraceSource
from triage.domain.records import Facts, Layer, StoredScore, Trace, UnreadableTrace
from triage.domain.review import AGENT_RIGHT
from triage.domain.scores import JobScoreNames, JobScores, current_scores, is_end_user, normalise_author
from triage.domain.worklist import (
    DatasetItem,
    DatasetSink,
    PromotedCase,
    PromoteResult,
    regression_item_id,
)
from triage.errors import InputError
from triage.reading.trace import parse_raw, read_trace

#: the trace's logged input is kept when its JSON is at most this long (else the question alone)
MAX_TRACE_INPUT_CHARS = 20_000
MAX_LISTED = 20  # sources, claims, tool calls kept per item
MAX_ARG_CHARS = 500

#: one sentence per layer: what an answer to this question must do to pass
EXPECTATIONS: dict[Layer, str] = {
    Layer.RETRIEVAL: "The agent's search finds the passage that holds the answer, and the answer rests on it.",
    Layer.GENERATION: "The answer says what the retrieved passages say, and nothing they do not support.",
    Layer.TOOL_ROUTING: "The agent searches the collection that holds the answer.",
    Layer.AGENT_SKIPPED_RETRIEVAL: "The agent searches the documentation before it answers.",
    Layer.CONTENT_GAP_HALLUCINATION: (
        "The documentation does not answer this: the agent says so instead of inventing an answer."
    ),
    Layer.CONTENT_GAP_HANDLED: "The documentation does not answer this: the agent says so, as it did.",
    Layer.OK: "The answer was right: it stays right.",
}


def trace_input(observations: Sequence[Any]) -> Any:
    """The root observation's logged input (parsed), when it is small enough to carry."""
    ordered = sorted(observations, key=lambda o: o.start_time)
    roots = [o for o in ordered if o.parent_observation_id is None or o.is_root_observation]
    root = roots[0] if roots else ordered[0]
    value = parse_raw(root.input)
    try:
        size = len(json.dumps(value, ensure_ascii=False, default=str))
    except (TypeError, ValueError, RecursionError):
        return None
    return value if size <= MAX_TRACE_INPUT_CHARS else None


def case_input(trace: Trace, trace_input: Any) -> dict[str, Any]:
    """The question and its context: the logged input, the session, the tool calls summarised."""
    calls = []
    for call in trace.tool_calls[:MAX_LISTED]:
        args = {k: clip(v, MAX_ARG_CHARS) if isinstance(v, str) else v for k, v in call.args.items()}
        if len(json.dumps(args, ensure_ascii=False, default=str)) > 4 * MAX_ARG_CHARS:
            args = {"truncated": True}
        calls.append({"tool": call.name, "collection": call.collection, "args": args, "error": call.error})
    sources = list(dict.fromkeys(p.source_url for p in trace.passages if p.source_url))[:MAX_LISTED]
    return {
        "question": trace.question,
        "trace_input": trace_input,
        "session_id": trace.session_id,
        "tool_calls": calls,
        "retrieved_sources": sources,
    }


def _tool_for(collection: str | None, config: TriageConfig) -> str | None:
    if collection is None:
        return None
    return next((tool for tool, coll in config.tools.items() if coll == collection), None)


def layer_expectation(layer: Layer, facts: Facts | None, trace: Trace, config: TriageConfig) -> dict[str, Any]:
    """The expected output of a failure selected without a correction: what its layer implies."""
    out: dict[str, Any] = {"answer": None, "tool_behavior": None, "expectation": EXPECTATIONS[layer]}
    collection = facts.answer_collection if facts else None
    tool = _tool_for(collection, config)
    if layer in (Layer.TOOL_ROUTING, Layer.RETRIEVAL, Layer.AGENT_SKIPPED_RETRIEVAL):
        if tool is not None:
            out["tool_behavior"] = f"call {tool} (the {collection} collection)"
        elif layer is Layer.AGENT_SKIPPED_RETRIEVAL:
            out["tool_behavior"] = "call a search tool before answering"
    if layer in (Layer.RETRIEVAL, Layer.GENERATION, Layer.TOOL_ROUTING, Layer.OK) and facts and facts.answer_sources:
        out["must_cite"] = facts.answer_sources[:MAX_LISTED]
    if layer in (Layer.GENERATION, Layer.CONTENT_GAP_HALLUCINATION) and facts and facts.unsupported_claims:
        out["must_not_claim"] = facts.unsupported_claims[:MAX_LISTED]
    if layer in (Layer.CONTENT_GAP_HALLUCINATION, Layer.CONTENT_GAP_HANDLED):
        out["decline"] = True
    if layer is Layer.OK:
        out["answer"] = trace.answer
    return out


DEFAULT_DATASET = "triage-regressions"
MAX_ANSWER_CHARS = 4_000
#: how far before the window the job's triage scores are read (as `triage calibrate` does)
TRIAGE_LOOKBACK = timedelta(days=30)

@dataclass(frozen=True)
class PromoteOptions:
    dataset: str = DEFAULT_DATASET
    traces: tuple[str, ...] = ()
    signatures: tuple[str, ...] = ()
    layers: tuple[str, ...] = ()
    #: also promote every reviewer's negative verdict with a correction (not only the selection)
    corrections: bool = True
    since_hours: float = 24 * 30
    dry_run: bool = False
    now: datetime = field(default_factory=lambda: datetime.now(UTC))


@dataclass
class _Review:
    reviewer: str
    verdict: str | None = None
    correction: str | None = None
    expected_tool_behavior: str | None = None
    note: str | None = None
    newest: datetime | None = None


#: the verdict's fields promote reads (`domain.config.VERDICT_FIELD_SPECS`, each a score of the same
#: name), to the `_Review` attribute that holds it
_REVIEWED: dict[VerdictField, str] = {
    "corrected_answer": "correction",
    "expected_tool_behavior": "expected_tool_behavior",
    "note": "note",
}


def _text(value: Any) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def _gather(
    scores: Sequence[StoredScore], config: TriageConfig, names: ReviewNames
) -> tuple[dict[str, JobScores], dict[str, list[_Review]]]:
    """Per trace: the job's layer and component scores; every reviewer's latest review scores."""
    names_ = config.scores
    jobs = JobScoreNames(layer=names_.layer, component=names_.component, signature=names_.signature)
    triage = current_scores(scores, jobs, config.rule_version)
    reviews: dict[tuple[str, str], _Review] = {}
    for score in sorted(scores, key=lambda s: (s.timestamp, s.id)):
        if score.trace_id is None or score.name in (names_.layer, names_.component, names_.signature):
            continue
        review_field = {names.verdict: "verdict", **_REVIEWED}.get(score.name)
        if review_field is None or score.author is None or is_end_user(score.author):
            continue
        reviewer = normalise_author(score.author)
        review = reviews.setdefault((score.trace_id, reviewer), _Review(reviewer=reviewer))
        setattr(review, review_field, _text(score.value))  # scores are in time order: the newest wins
        review.newest = score.timestamp
    by_trace: dict[str, list[_Review]] = defaultdict(list)
    for (trace_id, _), review in reviews.items():
        by_trace[trace_id].append(review)
    for group in by_trace.values():
        group.sort(key=lambda r: (r.newest or datetime.min.replace(tzinfo=UTC), r.reviewer), reverse=True)
    return dict(triage), dict(by_trace)


def _corrective(reviews: Sequence[_Review]) -> _Review | None:
    """The newest review that says the answer was wrong and what was expected instead."""
    for review in reviews:
        if review.verdict == "negative" and (review.correction or review.expected_tool_behavior):
            return review
    return None


def _approving(reviews: Sequence[_Review]) -> _Review | None:
    """The newest review that found the answer right (a false alarm, or positive), when no one disagrees."""
    verdicts = {r.verdict for r in reviews if r.verdict}
    if "negative" in verdicts:
        return None
    return next((r for r in reviews if r.verdict in AGENT_RIGHT), None)


def _signature(score: StoredScore | None) -> str | None:
    """The failure signature: the value of the trace's `triage_signature` score."""
    value = score.value if score is not None else None
    return value if isinstance(value, str) and value else None


def _selected(trace_id: str, triage: JobScores | None, options: PromoteOptions) -> bool:
    if trace_id in options.traces:
        return True
    layer = triage.layer_value if triage else None
    if layer is not None and layer.value in options.layers:
        return True
    signature = _signature(triage.signature if triage else None)
    return signature is not None and signature in options.signatures


def promote_from(
    source: ScoreReader,
    traces: TraceSource,
    sink: DatasetSink,
    config: TriageConfig,
    options: PromoteOptions,
    *,
    window: Window,
    target: str,
    names: ReviewNames | None = None,
    link: Callable[[str], str | None] | None = None,
) -> PromoteResult:
    """Read the scores and traces, build the cases, write the new and changed ones."""
    names = names or ReviewNames.of(config.calibration)
    link = link or traces.trace_url
    start, end = window.start, window.end
    reviewed = [names.verdict, *_REVIEWED]
    # a triage score is stamped with its trace's start, which may be well before the review
    judged_names = [config.scores.layer, config.scores.component, config.scores.signature]
    judged = source.scores(judged_names, start - TRIAGE_LOOKBACK, end)
    triage, reviews = _gather([*judged, *source.scores(reviewed, start, end)], config, names)

    candidates = set(options.traces)
    if options.corrections:
        candidates |= {t for t, group in reviews.items() if _corrective(group)}
    if options.layers or options.signatures:
        candidates |= {t for t, held in triage.items() if _selected(t, held, options)}
    result = PromoteResult(dataset=options.dataset, target=target, dry_run=options.dry_run)
    if not candidates:
        return result

    ordered = sorted(candidates)
    rows = traces.observations(ordered)
    items: dict[str, DatasetItem] = {}
    cases: dict[str, PromotedCase] = {}
    for trace_id in ordered:
        held = triage.get(trace_id, JobScores())
        layer = held.layer_value
        case = PromotedCase(
            trace_id=trace_id,
            item_id=regression_item_id(options.dataset, trace_id),
            action="skipped",
            layer=layer.value if layer else None,
            signature=_signature(held.signature),
            url=link(trace_id),
        )
        cases[trace_id] = case
        observations = rows.get(trace_id) or []
        if isinstance(observations, UnreadableTrace):
            case.reason = f"the trace cannot be read: {observations.reason}"
            continue
        try:
            trace = read_trace(trace_id, observations, config.tools, case.url)
        except InputError as ex:
            case.reason = str(ex)
            continue
        group = reviews.get(trace_id, [])
        review = _corrective(group)
        approving = None if review else _approving(group)
        facts = held.verdict.facts
        if review is not None:
            case.expected_from = "correction" if review.correction else "expected_tool_behavior"
            expectation = (
                "The reviewer's corrected answer."
                if review.correction
                else "The reviewer's expected tool behaviour."
            )
            expected: dict[str, Any] = {
                "answer": review.correction,
                "tool_behavior": review.expected_tool_behavior,
                "expectation": expectation,
            }
        elif approving is not None:
            case.expected_from = "review"
            expected = {
                "answer": trace.answer,
                "tool_behavior": approving.expected_tool_behavior,
                "expectation": f"A reviewer found this answer right ({approving.verdict}): it stays right.",
            }
            review = approving
        elif layer is not None:
            case.expected_from = "layer"
            expected = layer_expectation(layer, facts, trace, config)
            # no review corrected or approved it (those came first): the newest note still tells
            # whoever reads the case what a reviewer saw
            review = next((r for r in group if r.note), None)
        else:
            case.reason = (
                "no triage_layer score in the window"
                if held.layer is None
                else f"the triaged layer is undecided ({held.layer.value!r})"
            ) + " and no reviewer's correction: nothing to expect yet"
            continue
        verdict = held.verdict
        metadata = {
            "layer": case.layer,
            "component": held.component_value,
            "owners": verdict.owners,
            "signature": case.signature,
            "reason": held.layer.comment if held.layer else None,
            "judge": verdict.judge,
            "rule_version": verdict.rule_version,
            "expected_from": case.expected_from,
            "reviewer": review.reviewer if review else None,
            "verdict": review.verdict if review else None,
            "note": review.note if review else None,
            "original_answer": cut(trace.answer, MAX_ANSWER_CHARS),
            "environment": trace.environment,
            "promoted_by": "triage promote",
        }
        items[trace_id] = DatasetItem(
            id=case.item_id,
            dataset_name=options.dataset,
            input=case_input(trace, trace_input(observations)),
            expected_output=expected,
            metadata=metadata,
            source_trace_id=trace_id,
        )

    if options.dry_run:
        existing = sink.dataset_items(options.dataset)
    else:
        result.dataset_created = sink.ensure_dataset(
            options.dataset,
            "Regression cases from triaged thumbs-down answers (triage promote)",
            {"created_by": "triage promote"},
        )
        existing = {} if result.dataset_created else sink.dataset_items(options.dataset)
    to_write = _diff(items, existing, cases)
    if to_write and not options.dry_run:
        outcome = sink.upsert_dataset_items([items[t] for t in to_write])
        for trace_id in to_write:
            reason = outcome.failed.get(items[trace_id].id)
            if reason is not None or items[trace_id].id not in outcome.written:
                cases[trace_id].action = "failed"
                cases[trace_id].reason = reason or "not written"
    result.cases = [cases[t] for t in ordered]
    return result


def _diff(
    items: Mapping[str, DatasetItem], existing: Mapping[str, DatasetItem], cases: Mapping[str, PromotedCase]
) -> list[str]:
    """Mark each case created, updated or unchanged; the traces whose items need a write."""
    to_write = []
    for trace_id, item in items.items():
        held = existing.get(item.id)
        case = cases[trace_id]
        if held is None:
            case.action = "created"
        elif held.content() != item.content():
            case.action = "updated"
        else:
            case.action = "unchanged"
            continue
        to_write.append(trace_id)
    return to_write
