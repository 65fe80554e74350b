"""Reading traces from each input/output shape real agents log."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from triage.domain.records import Observation
from triage.errors import InputError
from triage.reading.trace import extract_text, read_trace

TOOLS = {"search_kubeflow_docs": "docs", "search_github_issues": "issues", "search_kubeflow_code": "code"}
T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def obs(
    oid: str,
    *,
    parent: str | None = "root",
    type: str = "SPAN",
    name: str | None = None,
    input: Any = None,
    output: Any = None,
    at: int = 0,
) -> Observation:
    return Observation.model_validate(
        {
            "id": oid,
            "traceId": "t1",
            "type": type,
            "name": name,
            "parentObservationId": parent,
            "startTime": (T0 + timedelta(seconds=at)).isoformat(),
            "input": None if input is None else json.dumps(input),
            "output": None if output is None else json.dumps(output),
        }
    )


@pytest.mark.parametrize(
    ("value", "role", "want"),
    [
        ("How do I install KFP?", "user", "How do I install KFP?"),
        ({"content": "plain content"}, "user", "plain content"),
        ({"input": "wrapped input"}, "user", "wrapped input"),
        ({"output": {"content": "nested output"}}, "assistant", "nested output"),
        ({"question": "q?"}, "user", "q?"),
        (
            [
                {"role": "system", "content": "You are helpful."},
                {"role": "user", "content": "first"},
                {"role": "assistant", "content": "reply"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "second, "}, {"type": "text", "text": "parts"}],
                },
            ],
            "user",
            "second, \nparts",
        ),
        (
            {"messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a1"}]},
            "assistant",
            "a1",
        ),
        ({"role": "assistant", "content": "single message"}, "assistant", "single message"),
        (
            {"choices": [{"message": {"role": "assistant", "content": "openai completion"}}]},
            "assistant",
            "openai completion",
        ),
    ],
)
def test_extract_text_shapes(value: Any, role: str, want: str) -> None:
    assert extract_text(json.dumps(value), role) == want


def test_raw_text_that_is_not_json_stays_text() -> None:
    assert extract_text("just words, not JSON", "user") == "just words, not JSON"


MARKDOWN_RESULT = (
    "### Result 1 (score: 0.91)\n**Source:** https://www.kubeflow.org/docs/components/katib/early-stopping/\n\n"
    "Set earlyStopping.algorithmName to medianstop.\n---\n"
    "### Result 2 (score: 0.55)\n**Source:** https://www.kubeflow.org/docs/components/katib/overview/\n\n"
    "Katib is a hyperparameter tuning system."
)


def test_tool_observations_with_markdown_passages() -> None:
    trace = read_trace(
        "t1",
        [
            obs(
                "root", parent=None, input="How do I stop trials early?", output={"output": "Use medianstop."}
            ),
            obs(
                "tool1",
                type="TOOL",
                name="search_kubeflow_docs",
                input={"query": "early stopping"},
                output=MARKDOWN_RESULT,
                at=1,
            ),
        ],
        TOOLS,
    )
    assert trace.question == "How do I stop trials early?"
    assert trace.answer == "Use medianstop."
    assert [c.name for c in trace.tool_calls] == ["search_kubeflow_docs"]
    assert trace.tool_calls[0].args == {"query": "early stopping"}
    assert trace.searched and trace.searched_collections == {"docs"}
    assert [(p.id, p.collection) for p in trace.passages] == [("R1", "docs"), ("R2", "docs")]
    assert trace.passages[0].source_url.endswith("/katib/early-stopping/")
    assert trace.passages[0].text == "Set earlyStopping.algorithmName to medianstop."


@pytest.mark.parametrize(
    "output",
    [
        # a retriever's documents logged as an object, or as JSON text inside an MCP content part
        [{"page_content": "Set earlyStopping.", "metadata": {"source": "https://k/early/"}}],
        {"content": [{"type": "text", "text": json.dumps({"results": [{"text": "Set earlyStopping.", "url": "https://k/early/"}]})}]},
    ],
)
def test_json_search_hits_in_a_tool_output_are_passages(output: Any) -> None:
    trace = read_trace(
        "t1",
        [
            obs("root", parent=None, input="How do I stop trials early?", output={"output": "Use medianstop."}),
            obs("tool1", type="TOOL", name="search_kubeflow_docs", input={"query": "early"}, output=output, at=1),
        ],
        TOOLS,
    )
    assert [(p.id, p.source_url, p.text) for p in trace.passages] == [("R1", "https://k/early/", "Set earlyStopping.")]


def test_mcp_result_with_citations_and_span_named_after_tool() -> None:
    result = {
        "content": [{"type": "text", "text": "1. Katib issue about metrics"}],
        "structuredContent": {
            "citations": [
                {
                    "id": "c1",
                    "url": "https://github.com/kubeflow/katib/issues/2201",
                    "text": "Use the file collector.",
                    "title": "Metrics not collected",
                    "score": 0.8,
                },
            ]
        },
        "isError": False,
    }
    trace = read_trace(
        "t1",
        [
            obs(
                "root",
                parent=None,
                input={"content": "Why are metrics missing?"},
                output="Use the file collector.",
            ),
            obs("s1", type="SPAN", name="search_github_issues", input="metrics missing", output=result, at=1),
            obs("other", type="SPAN", name="format_answer", input="x", output="y", at=2),
        ],
        TOOLS,
    )
    assert [c.name for c in trace.tool_calls] == ["search_github_issues"]
    assert trace.tool_calls[0].args == {"query": "metrics missing"}
    assert trace.passages[0].source_url == "https://github.com/kubeflow/katib/issues/2201"
    assert trace.passages[0].text == "Use the file collector."
    assert trace.searched_collections == {"issues"}


def test_search_failed_output_is_an_error_call_without_passages() -> None:
    trace = read_trace(
        "t1",
        [
            obs("root", parent=None, input="q?", output="a."),
            obs(
                "tool1",
                type="TOOL",
                name="search_kubeflow_docs",
                input={"query": "q"},
                output="Search failed: milvus unreachable",
                at=1,
            ),
        ],
        TOOLS,
    )
    assert trace.tool_calls[0].error
    assert trace.passages == []
    assert trace.searched  # the agent did try to search


def test_openai_tool_call_messages_inside_a_generation() -> None:
    messages = [
        {"role": "system", "content": "Answer from the docs."},
        {"role": "user", "content": "How do I compile a pipeline?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {
                        "name": "search_kubeflow_docs",
                        "arguments": json.dumps({"query": "compile", "top_k": 3}),
                    },
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": MARKDOWN_RESULT},
    ]
    trace = read_trace(
        "t1",
        [
            obs(
                "root",
                parent=None,
                type="AGENT",
                input=messages[:2],
                output={"role": "assistant", "content": "Run kfp."},
            ),
            obs(
                "gen",
                type="GENERATION",
                name="llm",
                input=messages,
                output={"role": "assistant", "content": "Run kfp."},
                at=1,
            ),
        ],
        TOOLS,
    )
    assert trace.question == "How do I compile a pipeline?"
    assert [(c.id, c.name, c.args) for c in trace.tool_calls] == [
        ("call_1", "search_kubeflow_docs", {"query": "compile", "top_k": 3})
    ]
    assert len(trace.passages) == 2


def test_no_tool_calls_means_no_search() -> None:
    trace = read_trace("t1", [obs("root", parent=None, input="q?", output="a.")], TOOLS)
    assert not trace.searched and trace.tool_calls == [] and trace.passages == []


def test_answer_falls_back_to_last_generation() -> None:
    trace = read_trace(
        "t1",
        [
            obs("root", parent=None, input="q?"),
            obs("g", type="GENERATION", input="q?", output="from the model", at=1),
        ],
        TOOLS,
    )
    assert trace.answer == "from the model"


@pytest.mark.parametrize(
    ("observations", "message"),
    [
        ([], "has no observations"),
        ([obs("root", parent=None, output="a.")], "no question"),
        ([obs("root", parent=None, input="q?")], "no answer"),
    ],
)
def test_unreadable_traces_say_why(observations: list[Observation], message: str) -> None:
    with pytest.raises(InputError, match=message):
        read_trace("t1", observations, TOOLS)
