"""The ceiling: with a perfect model (tests/doubles/perfect_model.py) behind the `llm` and the
`cascade` judge, the real CLI lands every case of the evaluation set on its layer.

The whole set (262 cases) through `triage feedback` twice, against the perfect model through the
real `openai` client: about 20 s a judge on 2 cores. Skips where ../shared/corpus is absent.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.doubles.perfect_model import PerfectModel
from tests.judges.test_llm_judge import base_for, make_judge
from triage.domain.ports import JudgeRequest
from triage.domain.records import Passage, ToolCall, Trace
from triage.errors import JudgeError
from triage.judges.cascade import CascadeJudge

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT.parent / "shared" / "corpus"
CASES = [
    json.loads(line)
    for line in (ROOT / "evals" / "kubeflow" / "cases.jsonl").read_text().splitlines()
    if line
]

#: cases the job still gets wrong with a perfect model, and why (none since the judge may search)
KNOWN_MISSES: set[str] = set()
#: ... and where the cascade takes a wrong `high` fact of the offline judge. kf-088 ("How do I run
#: PySpark from a Kubeflow notebook against the Spark Operator?", a content gap): an issue thread
#: written blind for kf-275 (PySpark executors OOMKilled) covers 0.74 of the question's weighted
#: words against the agent's 0.24, which the offline judge reads as a clear miss (`high`: the index
#: holds it) as it does for the tool-routing cases beside it (0.62 to 1.00, all right). A lexical
#: trap no word count tells from an answer; found on a dev case by the seventh blind batch
CASCADE_MISSES = {"kf-088": "containment settled"}
#: components the job places otherwise than the label, and why. kf-167 ("Where can I chat with other
#: Spark Operator users on Slack?", no search call): the question's keywords name spark-operator,
#: the label the community pages (`general`); with no source to read, keywords are all there is
COMPONENT_MISSES = {"kf-167"}
#: ... and where the cascade settles a trace without the model, so keywords place it. kf-200 ("Can we
#: run Kubeflow on our Graviton (arm64) EKS node groups?", a declined content gap the heuristic is
#: sure of): no catalogue keyword in the question, so `general`; the model, like the label, reads it
#: as the platform's install (`manifests`), which no keyword rule gets without naming EKS for one case.
#: kf-259 ("an official Terraform module ... to install Kubeflow 1.10, so it fits into our pipeline?"):
#: "install" and "pipeline" tie, and the tie goes to the component listed first (`pipelines`); the
#: model and the label say `manifests`. Breaking ties by the earliest hit instead is a wash on the
#: whole set (234 of 262 components against 235). kf-289 ("Kubeflow sessions never expire ... Where
#: do I set the session timeout?", a content gap the heuristic is sure of): no catalogue keyword,
#: so `general`; the label says `manifests` (oauth2-proxy and Dex, which the question does not name)
CASCADE_COMPONENT_MISSES = {"kf-200", "kf-259", "kf-289"}
#: where the re-search does not show the judge the answer, and the agent's passages lack it too,
#: the model judge's own search in the docs' words (`search.judge_queries`) must. kf-039: the answer
#: ("the pipeline job name", `dsl.PIPELINE_JOB_NAME_PLACEHOLDER`) shares no rare word with the
#: question ("the name of the pipeline run"); the lexical re-search ranks its chunk 160th at best.


@pytest.fixture(scope="module")
def ceiling(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[tuple[str, str], Any], str]:
    """`triage eval` over the whole set, through bench/evalset.py (the one command), as JSON and text."""
    if not (CORPUS / "kubeflow-docs").is_dir():
        pytest.skip(
            f"the shared corpus is not here ({CORPUS}); the evaluation set renders its traces from it"
        )
    out = tmp_path_factory.mktemp("ceiling") / "eval.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "evalset.py"), "--judge", "replay", "--judge", "llm-perfect",
         "--judge", "cascade-perfect", "--json", str(out), "--figures"],
        capture_output=True, text=True, timeout=900, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    runs = {(run["judge"], run["split"]): run for run in json.loads(out.read_text())["runs"]}
    return runs, done.stdout


pytestmark = [pytest.mark.slow, pytest.mark.corpus]


@pytest.mark.parametrize("judge", ["replay", "llm-perfect", "cascade-perfect"])
def test_every_case_lands_on_its_layer_with_a_perfect_model(
    ceiling: tuple[dict[tuple[str, str], Any], str], judge: str
) -> None:
    runs, text = ceiling
    assert "did not know" not in text  # the perfect model recognised every question
    run = runs[judge, "all"]
    expected = set() if judge == "replay" else {f"eval-{c}" for c in KNOWN_MISSES}
    if judge == "cascade-perfect":
        expected |= {f"eval-{c}" for c in CASCADE_MISSES}
    assert run["cases"] == len(CASES) and run["triaged"] == len(CASES)
    assert {m["trace_id"] for m in run["misses"]} == expected
    component_misses = COMPONENT_MISSES | (CASCADE_COMPONENT_MISSES if judge == "cascade-perfect" else set())
    assert {m["trace_id"] for m in run["component_misses"]} == {f"eval-{c}" for c in component_misses}
    assert judge == "replay" or run["judge_calls_per_trace"] <= 2


def test_the_cascade_asks_the_model_less_than_the_llm_judge(ceiling: tuple[dict[tuple[str, str], Any], str]) -> None:
    runs, _ = ceiling
    cascade, llm = runs["cascade-perfect", "all"], runs["llm-perfect", "all"]
    assert cascade["judge_calls_per_trace"] < llm["judge_calls_per_trace"]
    assert cascade["judge_calls_per_trace"] <= 1.3  # the budget (1.16 measured)


def test_every_cascade_shortcut_is_right_wherever_it_fires(ceiling: tuple[dict[tuple[str, str], Any], str]) -> None:
    _, text = ceiling
    lines = text.split("cascade shortcuts on the whole set", 1)[1].strip().splitlines()[1:]
    row = r"^  (.+?): (\d+/\d+ = [\d.]+|never fires)(?:; wrong on (.+))?$"
    figures = re.findall(row, "\n".join(lines), re.MULTILINE)
    assert len(figures) == len(CascadeJudge.SHORTCUTS), lines
    wrong = {case: name for name, _, cases in figures for case in cases.split(", ") if cases}
    assert wrong == CASCADE_MISSES  # each wrong shortcut known, with its reason above
    for name, figure, _ in figures:
        right, fired = (int(n) for n in re.findall(r"\d+", figure)[:2]) if figure != "never fires" else (0, 0)
        assert right == fired - sum(1 for shortcut in CASCADE_MISSES.values() if shortcut == name), figure


def test_the_re_search_and_the_judge_s_own_search_find_the_answer_of_every_case(
    ceiling: tuple[dict[tuple[str, str], Any], str],
) -> None:
    _, text = ceiling
    found = re.search(r"shown to the judge in (\d+) ", text)
    total = re.search(r"on (\d+) index-has-answer cases", text)
    misses = dict(re.findall(r"re-search miss: (kf-\d{3}) .*: (.+)$", text, re.MULTILINE))
    assert found and total and int(found.group(1)) == int(total.group(1)) - len(misses)
    assert "kf-039" in misses  # the vocabulary gap the judge's own search exists for
    for case, why in misses.items():
        assert why in ("the agent's passages hold it", "the judge's own search shows it"), (case, why)


# --- the perfect model is honest: it finds the answer only in what the prompt shows ---------------

CASE = {
    "id": "kf-900",
    "question": "Which port must a custom notebook image listen on?",
    "facts": {"answer_grounded": True, "answer_declined": False},
    "component": "notebooks",
    "needs": ["port `8888`", "NB_PREFIX"],
    "tags": [],
}
ANSWERING = "Images must expose an HTTP interface on port `8888`; Kubeflow sets `NB_PREFIX` at runtime."


def _trace(text: str) -> Trace:
    passage = Passage(id="R1", collection="docs", source_url="https://www.kubeflow.org/docs/components/notebooks/x/",
                      title="Container images", text=text)  # fmt: skip
    call = ToolCall(id="o1", name="search_kubeflow_docs", args={"query": "notebook image port"},
                    output=f"### Result 1\n**Source:** {passage.source_url}\n\n{text}", collection="docs")  # fmt: skip
    answer = "Listen on port `8888` under the `NB_PREFIX` path."
    return Trace(id="t", question=CASE["question"], answer=answer, tool_calls=[call], passages=[passage])


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("text", "holds"),
    [
        (ANSWERING, True),
        ("Images must expose an HTTP interface; Kubeflow sets `NB_PREFIX` at runtime.", False),  # one missing
        ("x " * 3000 + ANSWERING, True),  # deep in a long passage: found because the judge shows it
    ],
)
async def test_the_perfect_model_cites_only_what_it_was_shown(text: str, holds: bool) -> None:
    with PerfectModel([CASE]) as model:
        async with openai.AsyncOpenAI(base_url=model.url, api_key="test") as client:
            trace = _trace(text)
            facts = await make_judge(client).judge(JudgeRequest(trace, [], None, base_for(trace)))
        assert model.unknown == []
    assert facts.retrieved_has_answer is holds
    # grounded as labelled only where the needed strings it cites were shown
    assert facts.answer_grounded is holds
    if holds:
        assert facts.evidence["retrieved_has_answer"].passage_ids == ["R1"]


@pytest.mark.anyio
async def test_the_perfect_model_refuses_a_question_it_does_not_know() -> None:
    with PerfectModel([CASE]) as model:
        async with openai.AsyncOpenAI(base_url=model.url, api_key="test") as client:
            trace = _trace(ANSWERING).model_copy(update={"question": "Something else entirely?"})
            with pytest.raises(JudgeError):  # a 400: the trace is listed, never judged from nothing
                await make_judge(client, max_retries=0).judge(JudgeRequest(trace, [], None, base_for(trace)))
        assert set(model.unknown) == {"Something else entirely?"}
