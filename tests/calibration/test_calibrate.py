"""`triage calibrate`: agreement figures checked by hand and against scikit-learn and statsmodels,
bad labels listed, the trust gate's exit code, and the real CLI against the Langfuse stand-in."""

from __future__ import annotations

import json
import random
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.doubles.langfuse_server import LangfuseStandIn
from tests.factories import katib_traces
from tests.sources.test_langfuse_spec import openapi, validate  # noqa: F401 - `openapi` is a fixture
from triage.calibration.calibrate import (
    agreement,
    calibrate,
    decisions_from_facts_file,
    decisions_from_scores,
    labels_from_file,
    labels_from_scores,
)
from triage.cli import cli
from triage.domain.config import CalibrationConfig
from triage.domain.records import Facts, Layer, StoredScore
from triage.domain.review import Decision, Label
from triage.domain.scores import score_id
from triage.domain.stats import cohen_kappa
from triage.errors import ExitCode
from triage.sinks.report import render_calibration

LAYERS = [layer.value for layer in Layer]


# -- the figures -----------------------------------------------------------------------------


def test_kappa_and_its_interval_equal_a_hand_computation() -> None:
    # people: 25 ok, 25 failed; judge: 30 ok, 20 failed; 35 of 50 agree
    # po = 0.7, pe = 0.5*0.6 + 0.5*0.4 = 0.5, kappa = (0.7 - 0.5) / 0.5 = 0.4
    # Fleiss-Cohen-Everitt: A = .4*(1-1.1*.6)^2 + .3*(1-.9*.6)^2 = .10972
    #   B = .6^2 * (.1*(.6+.5)^2 + .2*(.4+.5)^2) = .10188, C = (.4 - .5*.6)^2 = .01
    #   var = (A + B - C) / (.5^2 * 50) = .016128, se = .126996, 95%: .4 -/+ 1.959964 * se
    kappa, low, high = cohen_kappa([[20, 5], [10, 15]])
    assert kappa == pytest.approx(0.4)
    assert low == pytest.approx(0.4 - 1.959964 * 0.126996, abs=1e-5)
    assert high == pytest.approx(0.4 + 1.959964 * 0.126996, abs=1e-5)
    figures = agreement([("ok", "ok")] * 20 + [("ok", "x")] * 5 + [("x", "ok")] * 10 + [("x", "x")] * 15, ["ok", "x"])
    assert (figures.n, figures.agreed, figures.accuracy) == (50, 35, 0.7)
    ok = figures.per_class[0]
    assert (ok.support, ok.predicted) == (25, 30)
    assert ok.precision == pytest.approx(20 / 30) and ok.recall == pytest.approx(20 / 25)
    assert ok.f1 == pytest.approx(2 * (20 / 30) * (20 / 25) / (20 / 30 + 20 / 25))


@pytest.mark.parametrize("seed", range(8))
def test_figures_match_scikit_learn_and_statsmodels(seed: int) -> None:
    np = pytest.importorskip("numpy")
    metrics = pytest.importorskip("sklearn.metrics")
    inter_rater = pytest.importorskip("statsmodels.stats.inter_rater")
    rng = random.Random(seed)
    classes = LAYERS[: rng.randint(2, 7)]
    people = [rng.choice(classes) for _ in range(rng.randint(20, 120))]
    judge = [p if rng.random() < rng.uniform(0.3, 0.9) else rng.choice(classes) for p in people]
    figures = agreement(list(zip(people, judge, strict=True)), classes)
    assert figures.kappa == pytest.approx(metrics.cohen_kappa_score(people, judge))
    reference = inter_rater.cohens_kappa(np.array(figures.confusion))
    assert figures.kappa_low == pytest.approx(max(-1.0, reference.kappa_low))
    assert figures.kappa_high == pytest.approx(min(1.0, reference.kappa_upp))
    assert figures.confusion == metrics.confusion_matrix(people, judge, labels=classes).tolist()
    precision, recall, f1, support = metrics.precision_recall_fscore_support(
        people, judge, labels=classes, zero_division=np.nan
    )
    for i, scores in enumerate(figures.per_class):
        assert scores.support == support[i]
        for ours, theirs in ((scores.precision, precision[i]), (scores.recall, recall[i]), (scores.f1, f1[i])):
            if np.isnan(theirs):
                assert ours is None or ours == 0.0  # undefined: sklearn's nan, ours None (or 0 for F1)
            else:
                assert ours == pytest.approx(theirs)


def test_kappa_is_undefined_without_items_or_with_one_class_only() -> None:
    assert cohen_kappa([[0, 0], [0, 0]]) == (None, None, None)
    assert agreement([("ok", "ok")] * 5).kappa is None
    perfect = agreement([("ok", "ok"), ("retrieval", "retrieval")])
    assert (perfect.kappa, perfect.kappa_low, perfect.kappa_high) == (1.0, 1.0, 1.0)


# -- labels and decisions ----------------------------------------------------------------------


def _write(path: Path, lines: list[Any]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines), encoding="utf-8")
    return path


def test_bad_labels_are_listed_with_their_reason_never_a_crash(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "labels.jsonl",
        [
            {"trace_id": "t1", "reviewer": "ana", "layer": "ok"},
            {"trace_id": "t1", "reviewer": "ana", "layer": "retrieval"},  # twice from ana
            {"trace_id": "t2", "layer": "nonsense"},
            {"trace_id": "t3", "facts": {"answer_grounded": "maybe"}},
            {"reviewer": "bo", "layer": "ok"},
            {"trace_id": "t4", "reviewer": "bo"},
            "{not json",
            {"trace_id": "t5", "reviewer": "bo", "layer": "generation", "facts": {"component": "katib"}},
        ],
    )
    labels, bad = labels_from_file(path)
    assert [(label.trace_id, label.reviewer, label.layer) for label in labels] == [("t5", "bo", Layer.GENERATION)]
    reasons = {b.where: b.reason for b in bad}
    assert "labels from one reviewer for one trace" in reasons["labels.jsonl:1, labels.jsonl:2"]
    assert reasons["labels.jsonl:3"].startswith('unknown layer "nonsense"')
    assert "answer_grounded" in reasons["labels.jsonl:4"]
    assert reasons["labels.jsonl:5"] == "no trace_id"
    assert reasons["labels.jsonl:6"] == "no layer, facts or verdict"
    assert reasons["labels.jsonl:7"].startswith("not a JSON object")


def _score(sid: str, trace: str, name: str, value: Any, author: str | None = "ana") -> StoredScore:
    return StoredScore(
        id=sid, name=name, trace_id=trace, value=value, author=author, timestamp=datetime(2026, 11, 30, tzinfo=UTC)
    )


def test_scores_make_one_label_per_reviewer_and_trace() -> None:
    names = CalibrationConfig()
    labels, bad = labels_from_scores(
        [
            _score("a", "t1", "human_layer", "retrieval"),
            _score("b", "t1", "human_retrieved_has_answer", 0.0),
            _score("c", "t1", "human_layer", "ok", author="bo"),
            _score("d", "t2", "human_layer", "ok"),
            _score("e", "t2", "human_layer", "generation"),  # ana twice on t2
            _score("f", "t3", "verdict", "false_alarm", author="lead"),
            _score("g", "t3", "verdict", "negative", author="user:alice"),  # an end user: a vote, not a label
            _score("h", "t4", "human_layer", "sideways", author="bo"),
            _score("i", "t5", "human_layer", "ok", author=None),
        ],
        names,
    )
    got = {(lab.trace_id, lab.reviewer): (lab.layer, lab.facts, lab.verdict) for lab in labels}
    assert got == {
        ("t1", "ana"): (Layer.RETRIEVAL, {"retrieved_has_answer": False}, None),
        ("t1", "bo"): (Layer.OK, {}, None),
        ("t3", "lead"): (None, {}, "false_alarm"),
    }
    reasons = sorted(b.reason for b in bad)
    assert any("two human_layer scores" in r for r in reasons)
    assert any(r.startswith('unknown layer "sideways"') for r in reasons)
    assert any("names no reviewer" in r for r in reasons)


def test_decisions_prefer_the_current_rule_version_and_read_facts_from_metadata(tmp_path: Path) -> None:
    facts = Facts(agent_searched=True, retrieved_has_answer=False, index_has_answer=True, answer_collection="docs")
    rows = [
        StoredScore(
            id="old", name="triage_layer", trace_id="t1", value="ok", timestamp=datetime(2026, 12, 1, tzinfo=UTC),
            metadata={"rule_version": "0", "facts": {"agent_searched": False}},
        ),
        StoredScore(
            id="new", name="triage_layer", trace_id="t1", value="retrieval",
            timestamp=datetime(2026, 11, 1, tzinfo=UTC),
            metadata={"rule_version": "1", "facts": facts.model_dump(mode="json"), "judge": "heuristic"},
        ),
    ]  # fmt: skip
    decisions = decisions_from_scores(rows, "triage_layer", "1")
    assert decisions["t1"].layer is Layer.RETRIEVAL and decisions["t1"].facts == facts
    assert decisions["t1"].judge == "heuristic" and decisions["t1"].confidence == "low"
    path = _write(tmp_path / "facts.jsonl", [{"trace_id": "t2", **facts.model_dump(mode="json")}, "oops"])
    from_file, bad = decisions_from_facts_file(path)
    assert from_file["t2"].layer is Layer.RETRIEVAL and len(bad) == 1


def test_a_persons_annotation_is_no_decision_and_current_only_reads_this_rule_versions_scores() -> None:
    """One reader for calibrate, eval and queue: a reviewer's `triage_layer` annotation is a label,
    not the job's decision; the queue reads only this rule version's scores, by the job's score id."""
    when = datetime(2026, 12, 1, tzinfo=UTC)
    rows = [
        StoredScore(id="h", name="triage_layer", trace_id="t1", value="ok", timestamp=when, source="ANNOTATION"),
        StoredScore(id=score_id("t2", "triage_layer", "0"), name="triage_layer", trace_id="t2", value="ok",
                    timestamp=when, metadata={"rule_version": "0"}),
        StoredScore(id=score_id("t3", "triage_layer", "1"), name="triage_layer", trace_id="t3",
                    value="retrieval", timestamp=when, metadata={"rule_version": "1"}),
        StoredScore(id=score_id("t4", "triage_layer", "1"), name="triage_layer", trace_id="t4",
                    value="sideways", timestamp=when, metadata={"rule_version": "1"}),
    ]  # fmt: skip
    assert set(decisions_from_scores(rows, "triage_layer", "1")) == {"t2", "t3", "t4"}
    current = decisions_from_scores(rows, "triage_layer", "1", current_only=True)
    assert set(current) == {"t3"} and current["t3"].timestamp == when


def _decision(trace: str, layer: Layer | None, confidence: str = "high", **facts: Any) -> Decision:
    return Decision(
        trace_id=trace,
        layer=layer,
        facts=Facts(agent_searched=True, **facts),
        confidence=confidence,  # type: ignore[arg-type]
    )


def test_calibrate_lists_disagreements_people_and_coverage() -> None:
    decisions = {
        "t1": _decision("t1", Layer.OK, retrieved_has_answer=True, answer_grounded=True, answer_declined=False),
        "t2": _decision("t2", Layer.RETRIEVAL, "low", retrieved_has_answer=False, index_has_answer=True),
        "t3": _decision("t3", None),
    }
    labels = [
        Label(trace_id="t1", reviewer="ana", layer=Layer.OK, facts={"retrieved_has_answer": True}),
        Label(trace_id="t1", reviewer="bo", layer=Layer.GENERATION),
        Label(trace_id="t2", reviewer="ana", layer=Layer.GENERATION, facts={"retrieved_has_answer": True}),
        Label(trace_id="t3", reviewer="ana", layer=Layer.CONTENT_GAP_HANDLED),
        Label(trace_id="t9", reviewer="ana", layer=Layer.OK, origin="file:9"),
    ]
    report = calibrate(labels, decisions, link=lambda t: f"https://lf.example/trace/{t}", min_kappa=0.5)
    assert (report.matched, report.layer.n, report.layer.agreed) == (4, 4, 1)
    assert "undecided" in report.layer.classes  # the rule's undecided trace counts as a miss
    assert [(d.trace_id, d.reviewer, d.human, d.judge) for d in report.disagreements] == [
        ("t1", "bo", "generation", "ok"),
        ("t2", "ana", "generation", "retrieval"),
        ("t3", "ana", "content_gap_handled", "undecided"),
    ]
    assert report.disagreements[1].facts == ["retrieved_has_answer: true/false"]
    assert report.disagreements[1].url == "https://lf.example/trace/t2"
    assert report.facts["retrieved_has_answer"].n == 2 and report.facts["retrieved_has_answer"].agreed == 1
    assert report.people is not None and (report.people.n, report.people.agreed) == (1, 0)
    assert [(p.keep, p.n) for p in report.coverage] == [("all", 4), ("medium or high", 3), ("high", 3)]
    assert [b.reason for b in report.bad_labels] == ["the trace was never triaged (no triage decision for it)"]
    assert report.gate_passed is False


def test_the_markdown_escapes_what_people_and_traces_wrote() -> None:
    hostile = "[click](http://evil.example) `x` | <b>"
    ok = _decision("t|1", Layer.OK, retrieved_has_answer=True, answer_grounded=True, answer_declined=False)
    decisions = {"t|1": ok}
    labels = [Label(trace_id="t|1", reviewer=hostile, layer=Layer.RETRIEVAL)]
    text = render_calibration(calibrate(labels, decisions))
    assert not re.search(r"(?<!\\)\]\(", text)  # no link: every bracket escaped
    assert "<b>" not in text and "http://evil" not in text
    line = next(line for line in text.splitlines() if line.startswith("- trace"))
    assert "\\[click\\]" in line and "&lt;b&gt;" in line


# -- the command -----------------------------------------------------------------------------


def _files(tmp_path: Path) -> tuple[Path, Path]:
    facts = [
        {"trace_id": f"t{i}", "agent_searched": True, "retrieved_has_answer": False, "index_has_answer": False,
         "answer_declined": True, "answer_grounded": True,
         "evidence": {"retrieved_has_answer": {"confidence": "high"}}}
        for i in range(6)
    ]  # fmt: skip
    labels = [{"trace_id": f"t{i}", "reviewer": "ana", "layer": "content_gap_handled"} for i in range(5)]
    labels.append({"trace_id": "t5", "reviewer": "ana", "layer": "retrieval"})
    return _write(tmp_path / "labels.jsonl", labels), _write(tmp_path / "facts.jsonl", facts)


def test_the_gate_exits_6_below_min_kappa_and_0_without_a_gate(tmp_path: Path) -> None:
    labels, facts = _files(tmp_path)
    base = ["calibrate", "--labels-file", str(labels), "--facts-file", str(facts)]
    env = {"TRIAGE_STORE": str(tmp_path / "never-opened" / "s.sqlite")}  # files only: no store is read
    plain = CliRunner().invoke(cli, base, env=env)
    assert plain.exit_code == 0, plain.output
    assert "| 6 | 0.83 |" in plain.output  # 5 of 6 agree; the judge gave one class only: kappa 0
    gated = CliRunner().invoke(cli, [*base, "--min-kappa", "0.2", "--format", "json"], env=env)
    assert gated.exit_code == ExitCode.BELOW_GATE == 6
    report = json.loads(gated.output)
    assert report["gate_passed"] is False and report["layer"]["accuracy"] == pytest.approx(5 / 6)
    out = tmp_path / "report.md"
    written = CliRunner().invoke(cli, [*base, "--output", str(out)], env=env)
    assert written.exit_code == 0 and out.read_text(encoding="utf-8").startswith("# Calibration")
    missing = CliRunner().invoke(cli, [*base, "--output", str(tmp_path / "nope" / "r.md")], env=env)
    assert missing.exit_code == ExitCode.USAGE


@pytest.mark.slow
def test_calibrate_reads_annotation_scores_from_langfuse_end_to_end(openapi: Any) -> None:  # noqa: F811
    now = datetime.now(UTC)
    records = katib_traces("c", 4, now - timedelta(hours=3))
    with LangfuseStandIn(records=records) as server:
        env = server.env
        ran = CliRunner().invoke(
            cli, ["feedback", "--since-hours", "24", "--write", "--judge", "heuristic"], env=env
        )
        assert ran.exit_code == 0, ran.output
        judged = {row["traceId"]: row["stringValue"] for row in server.score_rows() if row["name"] == "triage_layer"}
        assert len(judged) == 4
        # two reviewers annotate in the Langfuse UI: ana agrees on c0-c2 and disagrees on c3; bo labels c0
        def other(trace: str) -> str:
            return next(layer for layer in LAYERS if layer != judged[trace])

        annotations = [("ana", f"c{i}", judged[f"c{i}"]) for i in range(3)]
        annotations += [("ana", "c3", other("c3")), ("bo", "c0", other("c0"))]
        for score in [
                {
                    "id": f"ann-{who}-{trace}",
                    "name": "human_layer",
                    "dataType": "CATEGORICAL",
                    "value": layer,
                    "traceId": trace,
                    "source": "ANNOTATION",
                    "authorUserId": who,
                    "timestamp": now.isoformat(),
                }
                for who, trace, layer in annotations
            ]:
            server.add_score_row(score)
        done = CliRunner().invoke(cli, ["calibrate", "--format", "json", "--min-kappa", "-1"], env=env)
        assert done.exit_code == 0, done.output
        report = json.loads(done.output)
        assert (report["matched"], report["layer"]["n"], report["layer"]["agreed"]) == (5, 5, 3)
        assert {(d["trace_id"], d["reviewer"]) for d in report["disagreements"]} == {("c3", "ana"), ("c0", "bo")}
        assert report["disagreements"][0]["url"].startswith(server.url)
        assert report["people"]["n"] == 1 and report["people"]["agreed"] == 0
        assert all(validate(openapi, entry) != "unvalidated" for entry in server.log)
