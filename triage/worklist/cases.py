"""What a regression case holds besides the review: the question and its context as the agent
saw them, and what a layer implies a passing answer does (`triage promote`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from triage.domain.config import TriageConfig
from triage.domain.kernel import clip
from triage.domain.records import Facts, Layer, Trace
from triage.reading.trace import parse_raw

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
    if layer in (Layer.RETRIEVAL, Layer.GENERATION, Layer.TOOL_ROUTING) and facts and facts.answer_sources:
        out["must_cite"] = facts.answer_sources[:MAX_LISTED]
    if layer in (Layer.GENERATION, Layer.CONTENT_GAP_HALLUCINATION) and facts and facts.unsupported_claims:
        out["must_not_claim"] = facts.unsupported_claims[:MAX_LISTED]
    if layer in (Layer.CONTENT_GAP_HALLUCINATION, Layer.CONTENT_GAP_HANDLED):
        out["decline"] = True
    if layer is Layer.OK:
        out["answer"] = trace.answer
    return out


