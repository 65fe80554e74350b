"""Replaying recorded facts: same layers and components, no model, clear errors."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.doubles.openai_server import OpenAIServer
from tests.judges.test_llm_judge import ANSWER, KATIB_TEXT, base_for, honest, make_judge, make_trace, research
from triage.domain.ports import JudgeRequest
from triage.domain.records import Facts, Layer, Passage, Trace
from triage.domain.rule import decide
from triage.errors import InputError, JudgeError, JudgeRejected
from triage.judges.replay import ReplayJudge
from triage.sinks.exports import write_facts_line


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer(responder=honest) as srv:
        yield srv


@pytest.fixture
async def client(server: OpenAIServer) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="test") as c:
        yield c


OTHER = [
    Passage(
        id="R1",
        collection="docs",
        source_url="https://www.kubeflow.org/docs/started/",
        title="Intro",
        text="Kubeflow is a community of tools for ML.",
    )
]
ISSUE_ONLY = [research()[0], research()[2]]


def cases() -> list[tuple[str, Trace, list[Passage] | None, Layer]]:
    """One trace per layer; the honest model knows the answer is `parallelTrialCount`."""
    invented = "Set `maxParallel` in the Experiment spec."
    decline = "I couldn't find that in the docs."
    return [
        ("ok", make_trace(), research(), Layer.OK),
        ("generation", make_trace(answer=invented), research(), Layer.GENERATION),
        ("retrieval", make_trace(passages=OTHER, answer=decline), research(), Layer.RETRIEVAL),
        ("routing", make_trace(passages=OTHER, answer=decline), ISSUE_ONLY, Layer.TOOL_ROUTING),
        (
            "gap-handled",
            make_trace(passages=OTHER, answer=decline),
            research()[2:],
            Layer.CONTENT_GAP_HANDLED,
        ),
        ("gap-invented", make_trace(passages=OTHER, answer=invented), [], Layer.CONTENT_GAP_HALLUCINATION),
        ("skipped", make_trace(searched=False, answer=ANSWER), research(), Layer.AGENT_SKIPPED_RETRIEVAL),
    ]


@pytest.mark.anyio
async def test_recorded_llm_facts_replay_to_the_same_layers_and_components(
    server: OpenAIServer, client: openai.AsyncOpenAI, tmp_path: Path
) -> None:
    judge = make_judge(client)
    lines, first = [], {}
    for name, trace, res, expected in cases():
        trace = trace.model_copy(update={"id": name})
        facts = await judge.judge(JudgeRequest(trace, res, "not helpful", base_for(trace)))
        assert decide(facts) is expected, name  # the cases really cover every layer
        first[name] = facts
        lines.append(write_facts_line(name, facts, judge=judge.name, prompt_version=judge.prompt_version))
    calls = judge.usage.calls
    path = tmp_path / "facts.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")

    replay = ReplayJudge(path)
    assert replay.needs_research is False
    assert replay.name == "replay:facts.jsonl"
    assert replay.prompt_version == judge.prompt_version
    for name, trace, _, _ in cases():
        trace = trace.model_copy(update={"id": name})
        again = await replay.judge(JudgeRequest(trace, None, None, base_for(trace)))
        assert again == first[name]
        assert decide(again) is decide(first[name])
        assert again.component == first[name].component
    assert replay.usage.calls == 0
    assert judge.usage.calls == calls  # replaying made no model call
    assert len(server.requests) == calls


@pytest.mark.anyio
async def test_the_pipelines_run_file_format_replays(tmp_path: Path) -> None:
    facts = Facts(
        agent_searched=True,
        agent_searched_collections=["docs"],
        retrieved_has_answer=False,
        index_has_answer=True,
        answer_collection="issues",
        answer_grounded=True,
        answer_declined=True,
        component="katib",
    )
    path = tmp_path / "run.jsonl"
    path.write_text(json.dumps({"trace_id": "t1", **facts.model_dump(mode="json")}) + "\n", encoding="utf-8")
    trace = make_trace()
    got = await ReplayJudge(path).judge(
        JudgeRequest(trace.model_copy(update={"id": "t1"}), None, None, base_for(trace))
    )
    assert got == facts
    assert decide(got) is Layer.TOOL_ROUTING


def write(tmp_path: Path, *records: Any) -> Path:
    path = tmp_path / "facts.jsonl"
    path.write_text(
        "\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n", encoding="utf-8"
    )
    return path


async def replayed(path: Path, trace_id: str = "t1", base: Facts | None = None, **kw: Any) -> Facts:
    trace = make_trace().model_copy(update={"id": trace_id})
    return await ReplayJudge(path, **kw).judge(JudgeRequest(trace, None, None, base or base_for(trace)))


@pytest.mark.anyio
async def test_richer_values(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {
            "trace_id": "t1",
            "retrieved_has_answer": "no_answer",
            "index_has_answer": "contains_answer",
            "answer_grounded": "no_factual_claims",
            "answer_declined": "yes",
            "answer_collection": "docs",
            "component": "pipelines",
        },
    )
    facts = await replayed(path)
    assert (
        facts.retrieved_has_answer,
        facts.index_has_answer,
        facts.answer_grounded,
        facts.answer_declined,
    ) == (False, True, True, True)
    assert facts.component == "pipelines" and facts.answer_collection == "docs"
    assert decide(facts) is Layer.RETRIEVAL


@pytest.mark.anyio
@pytest.mark.parametrize(("partial_is_answer", "expected"), [(False, Layer.RETRIEVAL), (True, Layer.OK)])
async def test_partial(tmp_path: Path, partial_is_answer: bool, expected: Layer) -> None:
    path = write(
        tmp_path,
        {
            "trace_id": "t1",
            "retrieved_has_answer": "partial",
            "index_has_answer": True,
            "answer_grounded": "grounded",
            "answer_declined": "not_declined",
        },
    )
    assert decide(await replayed(path, partial_is_answer=partial_is_answer)) is expected


@pytest.mark.anyio
async def test_missing_facts_stay_unestablished(tmp_path: Path) -> None:
    path = write(tmp_path, {"trace_id": "t1", "retrieved_has_answer": False, "index_has_answer": None})
    facts = await replayed(path)
    assert facts.index_has_answer is None and facts.answer_grounded is None


@pytest.mark.anyio
async def test_facts_the_trace_proves_come_from_the_trace(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {
            "trace_id": "t1",
            "agent_searched": False,
            "agent_searched_collections": [],
            "retrieved_has_answer": True,
            "answer_grounded": True,
            "answer_declined": False,
        },
    )
    base = Facts(agent_searched=True, agent_searched_collections=["docs", "issues"])
    facts = await replayed(path, base=base)
    assert facts.agent_searched is True and facts.agent_searched_collections == ["docs", "issues"]
    assert decide(facts) is Layer.OK


@pytest.mark.anyio
async def test_trace_not_in_file_is_undecided(tmp_path: Path) -> None:
    path = write(tmp_path, {"trace_id": "t1", "retrieved_has_answer": True})
    with pytest.raises(JudgeError, match="no recorded facts for trace t2") as info:
        await replayed(path, "t2")
    assert not isinstance(info.value, JudgeRejected)


@pytest.mark.anyio
async def test_last_line_wins_and_blank_lines_are_skipped(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {"trace_id": "t1", "retrieved_has_answer": True},
        "",
        {"trace_id": "t1", "retrieved_has_answer": False},
    )
    assert (await replayed(path)).retrieved_has_answer is False
    assert len(ReplayJudge(path)) == 1


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", r"facts\.jsonl:2: Expecting property name"),
        ("[1, 2]", r":2: a line must be a JSON object"),
        ('{"retrieved_has_answer": true}', r":2: trace_id is missing"),
        (
            '{"trace_id": "t2", "retrieved_has_answer": "maybe"}',
            r":2: retrieved_has_answer must be .* not 'maybe'",
        ),
        ('{"trace_id": "t2", "retreived_has_answer": true}', r":2: unknown field\(s\): retreived_has_answer"),
        (
            '{"trace_id": "t2", "answer_collection": "a b"}',
            r":2: answer_collection must be a collection name",
        ),
        ('{"trace_id": "t2", "injection_suspected": "yes"}', r":2: injection_suspected must be a boolean"),
        ('{"trace_id": "t2", "evidence": {"x": {"confidence": "sure"}}}', r":2: evidence: "),
    ],
)
def test_malformed_line_names_the_line(tmp_path: Path, line: str, message: str) -> None:
    path = write(tmp_path, {"trace_id": "t1", "retrieved_has_answer": True}, line)
    with pytest.raises(InputError, match=message):
        ReplayJudge(path)


def test_configured_collections_restrict_answer_collection(tmp_path: Path) -> None:
    path = write(tmp_path, {"trace_id": "t1", "answer_collection": "wiki"})
    assert "t1" in ReplayJudge(path)
    with pytest.raises(
        InputError, match=r":1: answer_collection must be one of \['code', 'docs', 'issues'\]"
    ):
        ReplayJudge(path, collections=["docs", "issues", "code"])


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="facts file not found"):
        ReplayJudge(tmp_path / "nope.jsonl")


def test_write_facts_line_is_one_line() -> None:
    facts = Facts(
        agent_searched=True,
        retrieved_has_answer=True,
        unsupported_claims=["a\nb"],
        evidence={"retrieved_has_answer": {"passage_ids": ["R1"], "quotes": [KATIB_TEXT[:30]]}},
    )
    line = write_facts_line("t\n1", facts)
    assert "\n" not in line
    assert json.loads(line)["trace_id"] == "t\n1"
