"""The release watch end to end (#29, items 2 and 3): `triage releases` on the embedded store and on
the Langfuse stand-in (its metrics API, checked against Langfuse's OpenAPI file, and the fallback
when there is none), the gate's exit codes, a release that is not there, the nightly report's
Releases section, and how far the judge has been measured (`triage calibrate --write`).

The statistics themselves are tested on a seeded simulation in tests/domain/test_releases.py."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from tests.doubles.langfuse_server import LangfuseStandIn, iso
from tests.sources.test_langfuse import backend_for
from triage.app import DEMO_DIR, judge_measure_of, record_judge_measures
from triage.cli import cli
from triage.domain.outcome import RunResult
from triage.domain.records import Layer
from triage.domain.review import CALIBRATION_DATASET, JudgeMeasure, measure_item_id
from triage.domain.scores import score_id
from triage.errors import ExitCode
from triage.sinks.report import measured, render_report
from triage.sources.export_file import vote_shift
from triage.sources.store import Store

SPEC = Path(__file__).resolve().parents[3] / "shared" / "langfuse" / "openapi.yml"
NOW = datetime.now(UTC).replace(microsecond=0)
T0 = NOW - timedelta(days=3)  # inside the default window of 7 days
TEAM = "kubeflow/docs-agent"  # the built-in configuration's agent team: owner of the agent layers

#: thumbs-down per layer: the baseline, and a candidate whose retrieval failures rose
BASE = {Layer.RETRIEVAL: 4, Layer.GENERATION: 16, Layer.TOOL_ROUTING: 8, Layer.OK: 12}
RISE = {**BASE, Layer.RETRIEVAL: 24}


# -- the data: two releases of 400 answers each ------------------------------------------------


def answer(trace_id: str, release: str | None, start: datetime, *, session: str | None = None) -> dict[str, Any]:
    root: dict[str, Any] = {
        "id": f"{trace_id}-root",
        "traceId": trace_id,
        "type": "AGENT",
        "name": "docs-agent",
        "parentObservationId": None,
        "startTime": iso(start),
        "endTime": iso(start + timedelta(seconds=5)),
        "input": json.dumps(f"question {trace_id}?"),
        "output": json.dumps(f"answer {trace_id}"),
        "sessionId": session,
        "environment": "production",
    }
    if release is not None:
        root.update(release=release, version=f"v-{release}")
    return {"traceId": trace_id, "observations": [root], "scores": []}


def vote(trace_id: str, value: int, at: datetime) -> dict[str, Any]:
    return {
        "id": f"vote-{trace_id}", "name": "user_feedback", "dataType": "BOOLEAN", "value": value,
        "traceId": trace_id, "timestamp": iso(at), "source": "API", "environment": "production",
    }  # fmt: skip


def verdict(trace_id: str, layer: Layer, at: datetime, *, judge: str = "heuristic") -> list[dict[str, Any]]:
    """The job's stored verdict: its layer and signature scores, timestamped with the trace's start."""
    return [
        {
            "id": score_id(trace_id, "triage_layer", "1"), "name": "triage_layer", "dataType": "CATEGORICAL",
            "value": layer.value, "traceId": trace_id, "timestamp": iso(at), "source": "API",
            "metadata": {"rule_version": "1", "judge": judge, "owners": [TEAM]}, "environment": "production",
        },
        {
            "id": score_id(trace_id, "triage_signature", "1"), "name": "triage_signature",
            "dataType": "CATEGORICAL", "value": f"sig-{layer.value}", "traceId": trace_id, "timestamp": iso(at),
            "source": "API", "metadata": {"rule_version": "1", "layer": layer.value}, "environment": "production",
        },
    ]  # fmt: skip


def release_records(
    release: str, offset: timedelta, down: dict[Layer, int], *, answers: int = 400, up: int = 60,
    session_vote_first: bool = False,
) -> list[dict[str, Any]]:  # fmt: skip
    """`answers` traces of `release`, one every 10 minutes from T0 + `offset`; the first ones
    thumbs-down with the job's verdict (`down`: how many of each layer), the next `up` thumbs-up.
    With `session_vote_first`, the first thumbs-down is a vote on its conversation's turn 0."""
    layers = [layer for layer, n in down.items() for _ in range(n)]
    records = []
    for i in range(answers):
        trace_id, start = f"{release}-t{i:03d}", T0 + offset + timedelta(minutes=10 * i)
        session = f"{release}-s" if session_vote_first and i == 0 else None
        record = answer(trace_id, release, start, session=session)
        if i < len(layers):
            record["scores"] += verdict(trace_id, layers[i], start)
            if session is None:
                record["scores"].append(vote(trace_id, 0, start + timedelta(minutes=1)))
            else:
                record["scores"].append(
                    {"id": f"vote-{trace_id}", "name": "user_feedback", "dataType": "BOOLEAN", "value": 0,
                     "sessionId": session, "metadata": {"turn": 0}, "timestamp": iso(start + timedelta(minutes=1)),
                     "source": "API"}  # fmt: skip
                )
        elif i < len(layers) + up:
            record["scores"].append(vote(trace_id, 1, start + timedelta(minutes=1)))
        records.append(record)
    return records


def rise() -> list[dict[str, Any]]:
    return [
        *release_records("r1", timedelta(0), BASE),
        *release_records("r2", timedelta(minutes=5), RISE, session_vote_first=True),
        answer("no-release", None, T0 + timedelta(hours=2)),
    ]


def equal() -> list[dict[str, Any]]:
    return [*release_records("r1", timedelta(0), BASE), *release_records("r2", timedelta(minutes=5), BASE)]


def stored(records: Sequence[dict[str, Any]], path: Path) -> Path:
    with Store(path) as store:
        store.import_lines([json.dumps(r) for r in records], "test")
    return path


def run(args: Sequence[str], env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def as_json(result: Result) -> dict[str, Any]:
    assert result.exit_code in (0, 7), result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


# -- the embedded store --------------------------------------------------------------------------


def test_a_retrieval_rise_is_flagged_naming_its_owners(tmp_path: Path) -> None:
    env = {"TRIAGE_STORE": str(stored(rise(), tmp_path / "s.sqlite"))}
    data = as_json(run(["releases", "--format", "json"], env))
    r1, r2 = data["watch"]["releases"]
    assert (r1["release"], r1["answers"], r1["votes"], r1["thumbs_down"]) == ("r1", 400, 100, 40)
    # the session vote counts for the turn it rates, as the job places it
    assert (r2["release"], r2["version"], r2["answers"], r2["votes"], r2["thumbs_down"]) == ("r2", "v-r2", 400, 120, 60)
    assert {lr["layer"]: lr["rate"]["count"] for lr in r2["layers"]} == {
        "generation": 16, "retrieval": 24, "tool_routing": 8, "ok": 12
    }  # fmt: skip
    assert r2["signatures"][0] == {"signature": "sig-retrieval", "count": 24}
    assert data["unreleased"] == 1 and data["counted_by"] == "the embedded store"
    (comparison,) = data["watch"]["comparisons"]
    assert comparison["candidate"] == "r2" and comparison["baseline"] == "r1"
    assert comparison["flagged_layers"] == ["retrieval"] and comparison["owners"] == [TEAM]
    assert data["watch"]["flagged"] == ["r2"]

    page = run(["releases"], env)
    assert page.exit_code == 0
    assert "**`r2` is worse than `r1`** beyond chance: " in page.stdout
    assert "retrieval 24/400 = 6.0% against 4/400 = 1.0%" in page.stdout and f"owners: {TEAM}" in page.stdout


def test_two_equal_releases_are_not_flagged(tmp_path: Path) -> None:
    env = {"TRIAGE_STORE": str(stored(equal(), tmp_path / "s.sqlite"))}
    data = as_json(run(["releases", "--format", "json"], env))
    assert data["watch"]["flagged"] == [] and data["watch"]["comparisons"][0]["worse"] is False
    assert "not worse beyond chance" in run(["releases"], env).stdout


def test_the_gate_exits_7_when_the_candidate_is_worse_and_0_otherwise(tmp_path: Path) -> None:
    env = {"TRIAGE_STORE": str(stored(rise(), tmp_path / "rise.sqlite"))}
    worse = run(["releases", "--candidate", "r2", "--baseline", "r1"], env)
    assert worse.exit_code == ExitCode.REGRESSED == 7
    assert "## Gate: `r2` against `r1`: **fails**" in worse.stdout  # the report is still printed
    assert run(["releases", "--candidate", "r1", "--baseline", "r2"], env).exit_code == 0
    env = {"TRIAGE_STORE": str(stored(equal(), tmp_path / "equal.sqlite"))}
    same = run(["releases", "--candidate", "r2", "--baseline", "r1", "--format", "json"], env)
    assert same.exit_code == 0 and json.loads(same.stdout)["gate"]["worse"] is False


def test_a_release_not_in_the_window_is_a_usage_error_naming_those_that_are(tmp_path: Path) -> None:
    env = {"TRIAGE_STORE": str(stored(rise(), tmp_path / "s.sqlite"))}
    result = CliRunner().invoke(cli, ["releases", "--candidate", "r3", "--baseline", "r1"], env=env)
    assert result.exit_code == ExitCode.USAGE
    assert "release 'r3' has no answer started between" in result.output and "r1, r2" in result.output
    # older than the window: not there either
    result = CliRunner().invoke(cli, ["releases", "--candidate", "r2", "--baseline", "r1", "--since-hours", "1"],
                                env=env)  # fmt: skip
    assert result.exit_code == ExitCode.USAGE and "the releases of that window: none" in result.output
    half = CliRunner().invoke(cli, ["releases", "--candidate", "r2"], env=env)
    assert half.exit_code == ExitCode.USAGE and "needs both --candidate and --baseline" in half.output


def test_a_store_made_before_releases_gets_the_columns(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:  # the observations table as it was
        db.execute(
            "CREATE TABLE observations (id TEXT PRIMARY KEY, traceId TEXT NOT NULL, type TEXT, name TEXT, "
            "parentObservationId TEXT, startTime TEXT NOT NULL, endTime TEXT, input TEXT, output TEXT, "
            "metadata TEXT, sessionId TEXT, userId TEXT, environment TEXT, level TEXT, statusMessage TEXT, "
            "updatedAt TEXT)"
        )
        db.execute("INSERT INTO observations (id, traceId, startTime) VALUES ('o', 'old', ?)", (iso(T0),))
    stored(rise(), path)
    with Store(path) as store:
        counted = store.release_answers(T0 - timedelta(hours=1), NOW)
    assert [(r.release, r.answers) for r in counted.releases] == [("r1", 400), ("r2", 400)]
    assert counted.unreleased == 2  # the old row and the trace without a release


def test_on_embedded_defaults_it_watches_the_bundled_demo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRIAGE_STORE")
    monkeypatch.setenv("HOME", str(tmp_path))  # no store at the default path either
    result = run(["releases", "--candidate", "2026.12.0", "--baseline", "2026.11.2"])
    assert result.exit_code == ExitCode.REGRESSED
    assert "counted by the bundled demo's embedded store" in result.stdout
    assert not (tmp_path / ".local").exists()  # nothing left behind


# -- the nightly report ----------------------------------------------------------------------


def test_the_demo_report_flags_the_release_with_the_retrieval_failures() -> None:
    out = run(["demo"]).stdout
    section = out[out.index("## Releases") : out.index("## kubeflow/docs-agent")]
    assert "| `2026.11.2` | `1.8.2` |" in section and "| `2026.12.0` | `1.9.0` |" in section
    assert "**`2026.12.0` is worse than `2026.11.2`** beyond chance: retrieval 4/16" in section
    assert "owners: kubeflow/docs-agent" in section


def test_no_releases_section_when_the_traces_carry_none(tmp_path: Path) -> None:
    lines = []
    for line in (DEMO_DIR / "traces.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        for obs in record["observations"]:
            obs.pop("release"), obs.pop("version")
        lines.append(json.dumps(record))
    traces = tmp_path / "traces.jsonl"
    traces.write_text("\n".join(lines) + "\n", encoding="utf-8")
    store = tmp_path / "s.sqlite"
    with Store(store) as db:  # stamped relative to now, as the demo is
        db.import_file(traces, shift=vote_shift(traces, NOW))
    report = run(["feedback", "--report"], {"TRIAGE_STORE": str(store)})
    assert report.exit_code == 0 and "# Triage of thumbs-down answers" in report.stdout
    assert "## Releases" not in report.stdout


# -- Langfuse: the metrics API, checked against the OpenAPI file ---------------------------------


@pytest.fixture(scope="module")
def openapi() -> Any:
    if not SPEC.is_file():
        pytest.skip(f"the Langfuse OpenAPI file is not here ({SPEC}); it ships in ../shared")
    from openapi_core import Config, OpenAPI

    return OpenAPI.from_file_path(str(SPEC), config=Config(spec_validator_cls=None))


def langfuse_json(srv: LangfuseStandIn, *args: str) -> tuple[dict[str, Any], str]:
    """`triage releases --format json` on the stand-in: the JSON, and the log."""
    result = run(["releases", "--format", "json", *args], srv.env)
    return as_json(result), result.stderr


def test_langfuse_counts_answers_with_one_metrics_request_validated_against_the_spec(
    tmp_path: Path, openapi: Any
) -> None:
    from tests.sources.test_langfuse_spec import validate

    records = rise()
    with LangfuseStandIn(records=records) as srv:
        data, logged = langfuse_json(srv)
        log = list(srv.log)
    metrics = [e for e in log if "metrics" in e.path]
    assert [(e.path, e.status) for e in metrics] == [("/api/public/v2/metrics", 200)]
    query = json.loads(metrics[0].query["query"][0])
    assert query["view"] == "observations" and query["dimensions"] == [{"field": "release"}, {"field": "version"}]
    assert {"column": "isRootObservation", "operator": "=", "value": True, "type": "boolean"} in query["filters"]
    # no page of the window's traces: only where the voted and triaged ones belong (100 a request)
    # and the conversation a session vote is on
    observations = [json.loads(e.query["filter"][0])[0]["column"] for e in log if "observations" in e.path]
    assert sorted(observations) == ["sessionId", "traceId", "traceId", "traceId"]
    # the night's whole cost: 800 answers, 220 votes, 100 verdicts, and the signatures' states (one
    # read: where each signature began, and what a check found fixed)
    assert len(log) == 14
    checked = {validate(openapi, entry) for entry in log}
    assert "GET /api/public/v2/metrics 200" in checked and "unvalidated" not in checked
    assert "counted by Langfuse's metrics API (v2)" in logged
    # the same figures as the embedded store's; its times are hour buckets, refined by the votes
    env = {"TRIAGE_STORE": str(stored(records, tmp_path / "s.sqlite"))}
    store = as_json(run(["releases", "--format", "json"], env))["watch"]
    assert data["watch"]["comparisons"] == store["comparisons"] and data["watch"]["flagged"] == ["r2"]
    for ours, theirs in zip(data["watch"]["releases"], store["releases"], strict=True):
        assert ours["first_seen"] == theirs["first_seen"]  # its first answer is voted on
        same = {k: v for k, v in theirs.items() if k != "last_seen"}
        assert {k: v for k, v in ours.items() if k != "last_seen"} == same


def test_a_bad_metrics_query_is_refused_by_the_stand_in(openapi: Any) -> None:
    """The stand-in checks the query as the spec describes it: the client's is not accepted blindly."""
    import httpx

    from tests.sources.test_langfuse_spec import validate

    with LangfuseStandIn(records=equal()) as srv:
        auth = (srv.public_key, srv.secret_key)
        grouped_by_trace = {"view": "observations", "dimensions": [{"field": "traceId"}],
                            "metrics": [{"measure": "count", "aggregation": "count"}],
                            "fromTimestamp": iso(T0), "toTimestamp": iso(NOW)}  # fmt: skip
        refused = httpx.get(f"{srv.url}/api/public/v2/metrics", params={"query": json.dumps(grouped_by_trace)},
                            auth=auth)  # fmt: skip
        bare = json.dumps({"view": "observations"})
        no_metrics = httpx.get(f"{srv.url}/api/public/v2/metrics", params={"query": bare}, auth=auth)
        log = list(srv.log)
    assert refused.status_code == 400 and "high cardinality" in refused.json()["message"]
    assert no_metrics.status_code == 400 and "at least one metric" in no_metrics.json()["message"]
    assert {validate(openapi, entry) for entry in log} == {"GET /api/public/v2/metrics 400"}


@pytest.mark.parametrize(
    ("metrics_api", "legacy", "counted_by"),
    [
        (("v1",), False, "Langfuse's metrics API (v1)"),
        ((), False, "paging Langfuse's root observations (GET /api/public/v2/metrics answers HTTP 404; "
                    "GET /api/public/metrics answers HTTP 404)"),
        ((), True, "paging Langfuse's traces (legacy API)"),
    ],
    ids=["v1 only", "no metrics: pages the traces", "v3 server: pages the legacy trace list"],
)
def test_without_the_metrics_api_the_traces_are_paged(
    metrics_api: tuple[str, ...], legacy: bool, counted_by: str, tmp_path: Path, openapi: Any
) -> None:
    from tests.sources.test_langfuse_spec import validate

    records = rise()
    with LangfuseStandIn(records=records, metrics_api=metrics_api, legacy=legacy) as srv:
        data, logged = langfuse_json(srv)
        log = list(srv.log)
    assert data["counted_by"].startswith(counted_by)
    assert f"counted by {counted_by}" in logged  # the log says which way was used
    env = {"TRIAGE_STORE": str(stored(records, tmp_path / "s.sqlite"))}
    store = as_json(run(["releases", "--format", "json"], env))
    for ours, theirs in zip(data["watch"]["releases"], store["watch"]["releases"], strict=True):
        assert {k: v for k, v in ours.items() if k not in ("first_seen", "last_seen")} == {
            k: v for k, v in theirs.items() if k not in ("first_seen", "last_seen")
        }
    assert data["watch"]["flagged"] == ["r2"] and data["unreleased"] == 1
    if not metrics_api:  # paged: the 801 traces of the window in a request or a few, not one each
        pages = [e for e in log if e.path in ("/api/public/v2/observations", "/api/public/traces")]
        assert len(pages) <= (12 if legacy else 3)  # legacy: 9 pages of 100, and the 404s that say so
    checked = {validate(openapi, entry) for entry in log}
    assert "unvalidated" not in checked


# -- how far the judge has been measured (item 3) -------------------------------------------------


def labels_file(tmp_path: Path, wrong: int = 2) -> Path:
    """People's layer labels for the demo traces: its expected layers, `wrong` of them changed."""
    rows = [json.loads(line) for line in (DEMO_DIR / "expected.jsonl").read_text().splitlines() if line.strip()]
    for row in rows[:wrong]:
        row["layer"] = "generation" if row["layer"] != "generation" else "retrieval"
    path = tmp_path / "labels.jsonl"
    path.write_text("".join(json.dumps({"trace_id": r["trace_id"], "reviewer": "ana", "layer": r["layer"]}) + "\n"
                            for r in rows))  # fmt: skip
    return path


def test_the_report_and_the_drafts_say_how_far_the_judge_was_measured(tmp_path: Path) -> None:
    store = tmp_path / "demo.sqlite"
    env = {"TRIAGE_STORE": str(store)}
    assert run(["demo", "--store", str(store), "--write"]).exit_code == 0
    before = run(["feedback", "--report", "--force", "--issues-dir", str(tmp_path / "before")], env)
    assert "Judge `heuristic`: unmeasured" in before.stdout
    assert "unmeasured" in (tmp_path / "before" / "owner-kubeflow-docs-agent.md").read_text()

    calibrated = run(["calibrate", "--labels-file", str(labels_file(tmp_path)), "--write", "--format", "json"], env)
    assert calibrated.exit_code == 0, calibrated.output
    layer = json.loads(calibrated.stdout)["judges"]["heuristic"]
    assert layer["n"] == 29 and layer["agreed"] == 27

    after = run(["feedback", "--report", "--force", "--issues-dir", str(tmp_path / "after")], env)
    sentence = (
        f"Judge `heuristic`: layer kappa {layer['kappa']:.2f} (95% interval {layer['kappa_low']:.2f} to "
        f"{layer['kappa_high']:.2f}) against people on 29 labels, measured {NOW:%Y-%m-%d}"
    )
    assert sentence in after.stdout
    drafts = sorted((tmp_path / "after").glob("*.md"))
    assert drafts and all(sentence in draft.read_text() for draft in drafts)


def test_a_measurement_is_for_its_judge_only_and_a_rerun_replaces_it(tmp_path: Path) -> None:
    measure = JudgeMeasure(judge="llm:gpt-4o-mini", kappa=0.71, kappa_low=0.58, kappa_high=0.84, accuracy=0.8,
                           labels=120, measured_at=NOW, since_hours=720, rule_version="1")  # fmt: skip
    with Store(tmp_path / "s.sqlite") as store:
        record_judge_measures(store, [measure])
        record_judge_measures(store, [measure.model_copy(update={"kappa": 0.65})])
        assert judge_measure_of(store, "heuristic") is None  # another judge: unmeasured
        found = judge_measure_of(store, "llm:gpt-4o-mini")
        assert list(store.dataset_items(CALIBRATION_DATASET)) == [measure_item_id("llm:gpt-4o-mini")]
    assert found is not None and found.kappa == 0.65
    result = RunResult(start=NOW - timedelta(days=1), end=NOW, judge="llm:gpt-4o-mini", judge_measure=found)
    assert ("Judge `llm:gpt-4o-mini`: layer kappa 0.65 (95% interval 0.58 to 0.84) against people on 120 labels"
            in render_report(result))  # fmt: skip
    assert "unmeasured" in measured(None, "heuristic")


def test_langfuse_keeps_the_measurement_in_a_dataset(openapi: Any) -> None:
    from tests.sources.test_langfuse_spec import validate

    measure = JudgeMeasure(judge="cascade", kappa=None, kappa_low=None, kappa_high=None, accuracy=1.0,
                           labels=3, measured_at=NOW, since_hours=24, rule_version="1")  # fmt: skip
    with LangfuseStandIn() as srv:
        with backend_for(srv) as backend:
            assert judge_measure_of(backend, "cascade") is None  # no dataset yet: unmeasured, no error
            record_judge_measures(backend, [measure])
        with backend_for(srv) as backend:  # another night, another process
            assert judge_measure_of(backend, "cascade") == measure
        (item,) = srv.dataset_items_of(CALIBRATION_DATASET)
        log = list(srv.log)
    assert item["input"] == {"judge": "cascade"} and item["metadata"]["labels"] == 3
    assert "unvalidated" not in {validate(openapi, entry) for entry in log}
