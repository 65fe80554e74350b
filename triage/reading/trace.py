"""Reading a trace from Langfuse-shaped observations.

Agents log their inputs and outputs in many shapes; this module turns them into one `Trace`:
the question and answer from the root observation, the tool calls (TOOL observations, spans named
after a configured tool, or OpenAI-style tool-call messages), and the passages their outputs hold.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from triage.domain.records import Observation, Passage, ToolCall, Trace
from triage.errors import InputError
from triage.reading.passages import is_error_text, json_hits, passages_from_output

_TEXT_KEYS = ("content", "text", "output", "input", "answer", "question", "query", "message", "result")


#: deeper JSON than this is read as plain text: real tool outputs and messages nest a few levels,
#: and walking (or even decoding) a pathological value must not cost the run its stack
MAX_JSON_DEPTH = 64


def depth_exceeds(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether a decoded JSON value nests deeper than `limit` (iteratively: no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping | list):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, Mapping) else item
            stack.extend((child, depth + 1) for child in children)
    return False


def parse_raw(raw: Any) -> Any:
    """Langfuse sends input/output as JSON-encoded strings; a string that is not JSON stays text, and
    so does JSON nested deeper than `MAX_JSON_DEPTH`."""
    if isinstance(raw, str):
        try:
            value = json.loads(raw)
        except (ValueError, RecursionError):
            return raw
        return raw if depth_exceeds(value) else value
    if depth_exceeds(raw):
        raise InputError(f"a logged value nests deeper than {MAX_JSON_DEPTH} levels")
    return raw


def _parts_text(content: Any) -> str | None:
    """Text of a chat message's content: a string, or a list of {"type": "text", "text"} parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [
            part.get("text") if isinstance(part, Mapping) else part if isinstance(part, str) else None
            for part in content
        ]
        joined = "\n".join(t for t in texts if isinstance(t, str) and t)
        return joined or None
    return None


def _is_message_list(value: Any) -> bool:
    return (
        isinstance(value, list) and bool(value) and all(isinstance(m, Mapping) and "role" in m for m in value)
    )


def _last_message(messages: Sequence[Mapping[str, Any]], roles: tuple[str, ...]) -> str | None:
    for message in reversed(messages):
        if message.get("role") in roles:
            text = _parts_text(message.get("content"))
            if text:
                return text
    return None


def extract_text(value: Any, role: str) -> str | None:
    """The text a logged input (`role="user"`) or output (`role="assistant"`) carries."""
    value = parse_raw(value)
    if value is None:
        return None
    if isinstance(value, str):
        return value.strip() or None
    if _is_message_list(value):
        return _last_message(value, (role,))
    if isinstance(value, Mapping):
        if _is_message_list(value.get("messages")):
            return _last_message(value["messages"], (role,))
        if value.get("role") and "content" in value:
            return _parts_text(value["content"])
        if isinstance(value.get("choices"), list) and value["choices"]:
            return extract_text(value["choices"][0].get("message"), role)
        for key in _TEXT_KEYS:
            if key in value:
                found = extract_text(value[key], role)
                if found:
                    return found
        return None
    if isinstance(value, list):
        # a list of content parts, or of strings
        return _parts_text(value)
    return str(value)


def _logged(raw: Any) -> bool:
    """Whether an output was logged at all (an empty or whitespace string counts; null does not)."""
    value = parse_raw(raw)
    return value is not None and (not isinstance(value, Mapping | list) or bool(value))


def _tool_output(value: Any) -> tuple[str, list[Mapping[str, Any]], bool]:
    """(text, structured citations, is_error) of a logged tool output."""
    value = parse_raw(value)
    citations: list[Mapping[str, Any]] = []
    is_error = False
    if json_hits(value) is not None:
        # a retriever's hits logged as JSON (`[{"page_content", "metadata"}]`, `{"results": [...]}`):
        # the passage parser reads them from the JSON text
        return json.dumps(value), citations, False
    if isinstance(value, Mapping):
        structured = value.get("structuredContent") or value.get("structured_content") or {}
        if isinstance(structured, Mapping) and isinstance(structured.get("citations"), list):
            citations = [c for c in structured["citations"] if isinstance(c, Mapping)]
        elif isinstance(value.get("citations"), list):
            citations = [c for c in value["citations"] if isinstance(c, Mapping)]
        is_error = bool(value.get("isError") or value.get("is_error"))
        text = _parts_text(value.get("content")) if isinstance(value.get("content"), list) else None
        if text is None:
            text = extract_text(value, "assistant") or ""
        if not text and isinstance(structured, Mapping) and isinstance(structured.get("result"), str):
            text = structured["result"]
    elif isinstance(value, list):
        text = _parts_text(value) or ""
    else:
        text = "" if value is None else str(value)
    if is_error_text(text):
        is_error = True
    return text, citations, is_error


def _tool_args(value: Any) -> dict[str, Any]:
    value = parse_raw(value)
    if isinstance(value, Mapping):
        if isinstance(value.get("arguments"), (Mapping, str)):
            inner = parse_raw(value["arguments"])
            if isinstance(inner, Mapping):
                return dict(inner)
        return dict(value)
    if value is None:
        return {}
    return {"query": value if isinstance(value, str) else json.dumps(value)}


def _calls_from_messages(
    observations: Sequence[Observation], tools: Mapping[str, str]
) -> list[tuple[ToolCall, list[Mapping[str, Any]]]]:
    """Tool calls logged as OpenAI-style messages in the input of the last generation that has them."""
    for obs in sorted(observations, key=lambda o: o.start_time, reverse=True):
        if obs.type != "GENERATION":
            continue
        value = parse_raw(obs.input)
        messages = value.get("messages") if isinstance(value, Mapping) else value
        if not _is_message_list(messages):
            continue
        assert isinstance(messages, list)  # for the type checker: _is_message_list said so
        results = {m.get("tool_call_id"): m.get("content") for m in messages if m.get("role") == "tool"}
        calls: list[tuple[ToolCall, list[Mapping[str, Any]]]] = []
        for message in messages:
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                name = function.get("name") or ""
                text, citations, error = _tool_output(results.get(call.get("id")))
                calls.append(
                    (
                        ToolCall(
                            id=str(call.get("id") or f"{obs.id}:{len(calls)}"),
                            name=name,
                            args=_tool_args(function.get("arguments")),
                            output=text,
                            collection=tools.get(name),
                            error=error,
                        ),
                        citations,
                    )
                )
        if calls:
            return calls
    return []


def read_trace(
    trace_id: str, observations: Sequence[Observation], tools: Mapping[str, str], url: str | None = None
) -> Trace:
    """Build a `Trace` from its observations. `tools` maps search tool names to collections."""
    if not observations:
        raise InputError(f"trace {trace_id} has no observations (not ingested yet, or deleted)")
    ordered = sorted(observations, key=lambda o: o.start_time)
    roots = [o for o in ordered if o.parent_observation_id is None or o.is_root_observation]
    root = roots[0] if roots else ordered[0]
    question = extract_text(root.input, "user")
    answer = extract_text(root.output, "assistant")
    if answer is None:
        generations = [o for o in ordered if o.type == "GENERATION" and o.output]
        if generations:
            answer = extract_text(generations[-1].output, "assistant")
    if question is None:
        raise InputError(f"trace {trace_id}: no question found in the root observation's input")
    if answer is None and _logged(root.output):
        # the agent answered with nothing ("the bot returned nothing"): a failure to triage, not bad input
        answer = ""
    if answer is None:
        raise InputError(f"trace {trace_id}: no answer found in the root observation's output")

    raw_calls: list[tuple[ToolCall, list[Mapping[str, Any]]]] = []
    for obs in ordered:
        if obs is root or not (obs.type == "TOOL" or (obs.name or "") in tools):
            continue
        text, citations, error = _tool_output(obs.output)
        name = obs.name or "tool"
        raw_calls.append(
            (
                ToolCall(
                    id=obs.id,
                    name=name,
                    args=_tool_args(obs.input),
                    output=text,
                    collection=tools.get(name),
                    error=error or obs.level == "ERROR",
                ),
                citations,
            )
        )
    if not raw_calls:
        raw_calls = _calls_from_messages(ordered, tools)

    passages: list[Passage] = []
    for call, citations in raw_calls:
        if call.is_search and not call.error:
            structured = {"citations": citations} if citations else None
            for passage in passages_from_output(call.output, structured, call.collection):
                passages.append(passage.model_copy(update={"id": f"R{len(passages) + 1}"}))
    return Trace(
        id=trace_id,
        question=question,
        answer=answer,
        tool_calls=[call for call, _ in raw_calls],
        passages=passages,
        session_id=root.session_id,
        start_time=root.start_time,
        environment=root.environment or "default",
        url=url,
    )
