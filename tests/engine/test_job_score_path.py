"""The nightly job's side of the score path: three defects, each pinned by tests that fail on the
code before the fix.

1. A vote changed after its first write keeps its first timestamp (Langfuse upserts only on the same
   id and timestamp), so a window on timestamps alone never saw it: a thumbs-up turned down, or a
   vote retracted and cast again, was triaged on no night.
2. One vote row that cannot be read (a turn of "²", a value that is no number, a time that is no
   time, no id) made `triage feedback` and `triage votes` exit 1 with no report.
3. `triage promote --jsonl` wrote U+2028 raw and read its file back with `splitlines()`: one pasted
   line separator, and every rerun exited 1. The same for every JSONL reader; a line nested too
   deeply crashed them.

`triage feedback` and `triage votes` run for real (the CLI) on the embedded store and on the
Langfuse stand-in, whose exchanges are validated against ../shared/langfuse/openapi.yml.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result

from tests.doubles.clock import VirtualClock
from tests.doubles.langfuse_server import LangfuseStandIn, iso
from tests.doubles.langfuse_transport import (
    BASE_URL,
    SCORES_V3,
    Router,
    on_session,
    on_trace,
    reply,
    score_v3,
    scores_page,
)
from tests.factories import trace_line
from tests.regression.test_promote import DATASET, record, review, store_env, triaged
from tests.sources.test_langfuse_spec import openapi, validate  # noqa: F401 - `openapi` is a fixture
from triage.calibration.calibrate import decisions_from_facts_file, labels_from_file
from triage.cli import cli
from triage.domain.config import IndexFolder
from triage.domain.records import Facts
from triage.domain.scores import ScoreBody
from triage.domain.worklist import regression_item_id
from triage.errors import ConfigError, InputError
from triage.judges.replay import ReplayJudge
from triage.search.index import Index
from triage.sinks.exports import DatasetFile, write_facts_line
from triage.sources.export_file import vote_span
from triage.sources.langfuse.backend import LangfuseBackend
from triage.sources.store import Store

NOW = datetime.now(UTC).replace(microsecond=0)
MONDAY = NOW - timedelta(days=3)  # a vote's first write, two nights before tonight's window
KATIB = "https://www.kubeflow.org/docs/components/katib/experiment/"
#: the window ends now, not 15 minutes ago: the votes these tests change are seconds old
NO_LAG = "[window]\nlag_minutes = 0\n"


def answered(trace_id: str, *, vote: float | None, at: datetime) -> dict[str, Any]:
    """A trace (its root and one search) with its vote, `at` its start; the vote a minute later."""
    return trace_line(
        trace_id,
        f"How do I configure a katib experiment trial ({trace_id})?",
        "Use the trial template in the experiment spec.",
        [("search_kubeflow_docs", KATIB, "A katib experiment configures each trial with a trial template.")],
        vote=vote,
        at=at,
    )


def vote_body(trace_id: str, value: int, first: datetime) -> ScoreBody:
    """The relay's write of a changed vote: the same id, the first write's timestamp (so Langfuse
    overwrites the row instead of adding one), the new value."""
    return ScoreBody(
        id=f"vote-{trace_id}", name="user_feedback", value=value, data_type="BOOLEAN", timestamp=first,
        trace_id=trace_id, comment="changed my mind",
    )  # fmt: skip


def history() -> list[dict[str, Any]]:
    return [
        answered("t-flip", vote=1, at=MONDAY),  # up on Monday; turned down tonight (below)
        answered("t-again", vote=1, at=MONDAY),  # up on Monday; retracted, then down tonight (below)
        answered("t-new", vote=0, at=NOW - timedelta(hours=3)),  # down tonight, first write
        answered("t-old", vote=0, at=MONDAY),  # down on Monday, unchanged: Monday night's
    ]


def feedback(env: dict[str, str], tmp_path: Path, *args: str) -> tuple[Result, dict[str, Any]]:
    config = tmp_path / "now.toml"
    config.write_text(NO_LAG, encoding="utf-8")
    summary = tmp_path / "summary.json"
    result = CliRunner().invoke(
        cli,
        ["feedback", "--since-hours", "24", "--judge", "heuristic", "--report", "--config", str(config),
         "--summary-file", str(summary), *args],
        env=env,
        catch_exceptions=False,
    )  # fmt: skip
    return result, (json.loads(summary.read_text(encoding="utf-8")) if summary.exists() else {})


def votes_view(env: dict[str, str]) -> tuple[Result, dict[str, Any]]:
    result = CliRunner().invoke(
        cli,
        ["votes", "--since-hours", "24", "--filter", "all", "--format", "json"],
        env=env,
        catch_exceptions=False,
    )
    return result, (json.loads(result.stdout) if result.exit_code == 0 else {})


def triaged_traces(result: Result) -> set[str]:
    """The traces the report triaged (each entry names its trace)."""
    report = result.stdout.split("## Not triaged")[0]
    return {t for t in ("t-flip", "t-again", "t-new", "t-old", "t-good") if f"trace `{t}`" in report}


def down_counts(listing: dict[str, Any]) -> dict[str, int]:
    return {c["id"]: c["down"] for c in listing["conversations"] if c["down"]}


# -- 1: a vote cast or changed in the window is the window's, whatever its first timestamp --------


def test_a_vote_changed_or_cast_again_is_triaged_the_night_it_changed_from_the_embedded_store(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store.sqlite"
    with Store(path) as store:
        store.import_lines([json.dumps(r) for r in history()], "history")
        # the relay's writes, through its own write path: a change, and a retraction then a new vote
        store.put_scores([vote_body("t-flip", 0, MONDAY + timedelta(minutes=1))])
        store.delete_scores(["vote-t-again"])
        store.put_scores([vote_body("t-again", 0, MONDAY + timedelta(minutes=1))])
    env = store_env(path)

    assert_the_changed_votes_are_tonights(env, tmp_path)
    with sqlite3.connect(path) as db:  # overwritten in place: one row per vote
        rows = db.execute(
            "SELECT id, timestamp FROM scores WHERE name = 'user_feedback' ORDER BY id"
        ).fetchall()
    assert [r[0] for r in rows] == ["vote-t-again", "vote-t-flip", "vote-t-new", "vote-t-old"]


def assert_the_changed_votes_are_tonights(env: dict[str, str], tmp_path: Path) -> None:
    """`triage feedback` triages, and `triage votes` counts, the flipped, the re-cast and the new vote."""
    result, summary = feedback(env, tmp_path)
    assert result.exit_code == 0, result.output
    assert triaged_traces(result) == {"t-flip", "t-again", "t-new"}
    assert (summary["votes_seen"], summary["thumbs_down"], summary["triaged"]) == (3, 3, 3)
    listed, listing = votes_view(env)
    assert listed.exit_code == 0, listed.output
    assert down_counts(listing) == {"t-flip": 1, "t-again": 1, "t-new": 1}


@pytest.mark.slow
def test_a_vote_changed_or_cast_again_is_triaged_the_night_it_changed_from_langfuse(
    openapi: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    with LangfuseStandIn(records=history()) as server:
        auth = (server.public_key, server.secret_key)
        first = MONDAY + timedelta(minutes=1)
        # the relay's writes as Langfuse sees them: a list POST with the first timestamp (an upsert)
        posted = httpx.post(
            f"{server.url}/api/public/scores", json=[vote_body("t-flip", 0, first).wire()], auth=auth
        )
        assert posted.status_code == 202
        assert httpx.delete(f"{server.url}/api/public/scores/vote-t-again", auth=auth).status_code == 204
        posted = httpx.post(
            f"{server.url}/api/public/scores", json=[vote_body("t-again", 0, first).wire()], auth=auth
        )
        assert posted.status_code == 202
        env = {**server.env, "LANGFUSE_TIMEOUT": "5"}

        assert_the_changed_votes_are_tonights(env, tmp_path)
        # no second row: the change overwrote the first write (same id, same timestamp)
        for vote_id in ("vote-t-flip", "vote-t-again"):
            [row] = server.score_rows(vote_id)
            assert row["timestamp"] == first and row["value"] == 0
        for entry in server.log:
            validate(openapi, entry)


@pytest.mark.slow
def test_the_langfuse_read_reaches_back_as_far_as_the_lookback_setting(tmp_path: Path) -> None:
    with LangfuseStandIn(records=history()) as server:
        flip = vote_body("t-flip", 0, MONDAY + timedelta(minutes=1)).wire()
        auth = (server.public_key, server.secret_key)
        assert httpx.post(f"{server.url}/api/public/scores", json=[flip], auth=auth).status_code == 202
        env = {**server.env, "LANGFUSE_TIMEOUT": "5"}

        short, _ = feedback({**env, "TRIAGE_VOTE_LOOKBACK_DAYS": "1"}, tmp_path)
        assert short.exit_code == 0, short.output
        # first cast three days ago: beyond a day's lookback, so only tonight's first write is seen
        assert triaged_traces(short) == {"t-new"}
        [read] = [
            r
            for r in server.requests("/v3/scores")
            if r.query.get("name") == ["user_feedback"] and "toTimestamp" in r.query
        ]
        start = datetime.fromisoformat(read.query["toTimestamp"][0]) - timedelta(hours=25)  # 24 h + overlap
        reached = datetime.fromisoformat(read.query["fromTimestamp"][0])
        assert abs(start - timedelta(days=1) - reached) < timedelta(seconds=5)

        default, _ = feedback(env, tmp_path, "--force")
        assert default.exit_code == 0, default.output
        assert triaged_traces(default) == {"t-flip", "t-new"}


# -- 2: a vote row that cannot be read is listed as bad input; the night goes on ----------------


def session_vote(vote_id: str, session_id: str, meta: dict[str, Any], at: datetime) -> dict[str, Any]:
    score = {"id": vote_id, "name": "user_feedback", "dataType": "BOOLEAN", "value": 0, "comment": "wrong turn",
             "sessionId": session_id, "metadata": meta, "timestamp": iso(at)}  # fmt: skip
    return {"traceId": None, "observations": [], "scores": [score]}


def bad_history() -> list[dict[str, Any]]:
    at = NOW - timedelta(hours=2)
    return [
        answered("t-good", vote=0, at=NOW - timedelta(hours=3)),
        session_vote("sv-super", "s1", {"turn": "²"}, at),  # a digit to `isdigit`, not to `int`
        session_vote("sv-huge", "s1", {"turn": "99999999999"}, at),
        session_vote("sv-minus", "s1", {"turn": -1}, at),
        # no turn: it rates s1's latest answer at its time, and s1 has none yet: pending, listed
        session_vote("sv-none", "s1", {}, at),
    ]


def check_listed(result: Result, summary: dict[str, Any], reasons: dict[str, str]) -> None:
    """The good vote triaged; every bad row listed as bad input with its reason in the report (the
    session vote without a turn as pending), `reasons` keyed as the report names a row: its trace,
    else its vote id."""
    assert result.exit_code == 0, result.output
    assert triaged_traces(result) == {"t-good"}
    assert summary["triaged"] == 1 and summary["not_triaged"] == {"bad_input": len(reasons) - 1, "pending": 1}
    listed = result.stdout.split("## Not triaged")[1].split("## Summary")[0]
    items = {}  # the row's name -> its item (the reason line and the lines under it)
    for item in listed.split("\n- ")[1:]:
        assert item.startswith(("bad_input: the vote cannot be read", "pending: session s1 has no trace")), item
        named = item.split("  - trace `" if "  - trace `" in item else "  - votes `")[1]
        items[named.split("`")[0]] = item
    assert items.keys() == reasons.keys()
    for name, reason in reasons.items():
        assert reason in items[name], (name, items[name])


BAD_TURNS = {
    "sv-super": "metadata.turn '²' is not a turn",
    "sv-huge": "metadata.turn '99999999999' is not a turn",
    "sv-minus": "metadata.turn -1 is not a turn",
    "sv-none": "without a turn, a vote rates the latest answer at its time",
}


def test_bad_vote_rows_are_listed_and_the_night_goes_on_in_the_embedded_store(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    with Store(path) as store:
        store.import_lines([json.dumps(r) for r in bad_history()], "votes")
    stamp = (NOW - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    broken_time = stamp[:14] + "99:00.000Z"  # minute 99: sorts inside the window, parses as no time
    with sqlite3.connect(path) as db:  # rows another tool (or an older triage) left in the file
        db.executemany(
            "INSERT INTO scores (id, name, value, dataType, traceId, sessionId, metadata, timestamp, updatedAt) "
            "VALUES (?, 'user_feedback', ?, 'BOOLEAN', ?, ?, ?, ?, ?)",
            [
                ("v-text", "not a number", "t-x1", None, None, stamp, stamp),
                ("v-time", 0, "t-x2", None, None, broken_time, broken_time),
                ("v-meta", 0, None, "s2", "{not json", stamp, stamp),
                ("v-nothing", 0, None, None, None, stamp, stamp),
                (None, 0, "t-x3", None, None, stamp, stamp),
            ],
        )
    reasons = {  # by vote id
        **BAD_TURNS,
        "v-text": "value 'not a number' is not a number",
        "v-time": "timestamp '" + broken_time + "' is not an ISO-8601 time",
        "v-meta": "metadata is not JSON",
        "v-nothing": "on neither a trace nor a session",
        "(no id)": "the row has no id",
    }
    on_traces = {"v-text": "t-x1", "v-time": "t-x2", "(no id)": "t-x3"}  # the report names their traces
    env = store_env(path)
    result, summary = feedback(env, tmp_path)
    check_listed(result, summary, {on_traces.get(k, k): reason for k, reason in reasons.items()})
    listed, listing = votes_view(env)
    assert listed.exit_code == 0, listed.output
    bad = {b["id"] or "(no id)": b["reason"] for b in listing["bad_votes"]}
    assert set(bad) == set(reasons) - {"sv-none"}  # a session vote without a turn is counted on its session
    assert all(reasons[i] in bad[i] for i in bad)
    assert down_counts(listing) == {"t-good": 1, "s1": 1}


@pytest.mark.slow
def test_bad_vote_rows_are_listed_and_the_night_goes_on_with_langfuse(
    openapi: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    with LangfuseStandIn(records=bad_history()) as server:
        env = {**server.env, "LANGFUSE_TIMEOUT": "5"}
        result, summary = feedback(env, tmp_path)
        check_listed(result, summary, BAD_TURNS)
        listed, listing = votes_view(env)
        assert listed.exit_code == 0, listed.output
        assert {b["id"]: b["reason"] for b in listing["bad_votes"]}.keys() == set(BAD_TURNS) - {"sv-none"}
        for entry in server.log:
            validate(openapi, entry)


def test_a_vote_row_that_breaks_the_api_contract_is_set_aside_alone() -> None:
    """Rows no Langfuse should send (no id, a time that is no time, a subject id that is a number):
    each is a bad vote with its reason; the page's other votes are read."""
    t0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    good = score_v3("good", timestamp=t0 - timedelta(hours=2), value=0, subject=on_trace("t-1"))
    no_id = score_v3("x", timestamp=t0 - timedelta(hours=2), value=0, subject=on_trace("t-2"))
    del no_id["id"]
    bad_time = score_v3("bad-time", timestamp=t0 - timedelta(hours=2), value=0, subject=on_trace("t-3"))
    bad_time["timestamp"] = "yesterday"
    bad_subject = score_v3(
        "bad-subject", timestamp=t0 - timedelta(hours=2), value=0, subject={"kind": "trace", "id": 7}
    )
    bad_turn = score_v3("bad-turn", timestamp=t0 - timedelta(hours=2), value=0, subject=on_session("s"),
                        metadata={"turn": "²"})  # fmt: skip
    router = Router()
    rows = [good, no_id, bad_time, bad_subject, bad_turn]
    router.on("GET", SCORES_V3, reply(200, scores_page(rows)), then=reply(200, scores_page([good, bad_turn])))
    backend = LangfuseBackend(public_key="pk-lf-test", secret_key="sk-lf-test", base_url=BASE_URL,
                              httpx_client=router.client(), clock=VirtualClock(start=t0))  # fmt: skip
    read = backend.votes("user_feedback", t0 - timedelta(days=1), t0)
    assert [v.id for v in read.votes] == ["good"]
    reasons = {b.id: b.reason for b in read.bad}
    assert reasons.keys() == {None, "bad-time", "bad-subject", "bad-turn"}
    assert reasons["bad-time"].startswith("timestamp:") and reasons[None].startswith("id:")
    assert "traceId 7 is not text" in reasons["bad-subject"]
    assert "metadata.turn '²' is not a turn" in reasons["bad-turn"]


# -- 3: JSONL is split on "\n" only, written with line separators escaped, read without crashing ---

SEPARATORS = "one\u2028two\u2029three\x85four"
FACTS = Facts(agent_searched=False, retrieved_has_answer=False, unsupported_claims=[SEPARATORS])
#: a facts file's line, as `ReplayJudge` and calibration read it
FACTS_LINE = {"trace_id": "t-1", **FACTS.model_dump(mode="json"), "judge": "heuristic"}


def test_promote_jsonl_reruns_after_a_correction_pasted_with_a_line_separator(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    correction = f"Use dsl.If.{SEPARATORS}"
    line = record("t-sep", "How do I branch?", "Use dsl.Switch.",
                  triaged("t-sep", "generation", "pipelines")
                  + review("t-sep", "ana", "negative", corrected_answer=correction))  # fmt: skip
    with Store(path) as store:
        store.import_lines([json.dumps(line)], "test")
    out = tmp_path / "cases.jsonl"

    def promote() -> Result:
        command = ["promote", "--jsonl", str(out), "--format", "json"]
        return CliRunner().invoke(cli, command, env=store_env(path), catch_exceptions=False)

    first = promote()
    assert first.exit_code == 0, first.output
    text = out.read_text(encoding="utf-8")
    second = promote()  # reads the file back: the item is there, unchanged
    assert second.exit_code == 0, second.output
    assert [case["action"] for case in json.loads(second.stdout)["cases"]] == ["unchanged"]
    assert out.read_text(encoding="utf-8") == text
    assert not set("\u2028\u2029\x85") & set(text)  # escaped: any reader sees one line per item
    [item] = [json.loads(part) for part in text.split("\n") if part]
    assert item["id"] == regression_item_id(DATASET, "t-sep")
    assert item["expectedOutput"]["answer"] == correction


def test_the_facts_file_writer_escapes_line_separators() -> None:
    line = write_facts_line("t-1", FACTS, judge="heuristic")
    assert "\n" not in line and not set("\u2028\u2029\x85") & set(line)
    assert json.loads(line)["unsupported_claims"] == [SEPARATORS]


def test_jsonl_readers_split_on_newline_only(tmp_path: Path) -> None:
    """Files an older triage (or another tool) wrote, the separators raw inside their strings."""
    facts_file = tmp_path / "facts.jsonl"
    facts_file.write_text(json.dumps(FACTS_LINE, ensure_ascii=False) + "\n", encoding="utf-8")
    assert "t-1" in ReplayJudge(facts_file)
    decided, bad = decisions_from_facts_file(facts_file)
    assert list(decided) == ["t-1"] and bad == []
    cases = tmp_path / "cases.jsonl"
    item = {"id": "i-1", "datasetName": "d", "expectedOutput": {"answer": SEPARATORS}}
    cases.write_text(json.dumps(item, ensure_ascii=False) + "\n", encoding="utf-8")
    assert DatasetFile(cases).dataset_items("d")["i-1"].expected_output == {"answer": SEPARATORS}
    traces = tmp_path / "traces.jsonl"
    score = {"id": "v", "name": "user_feedback", "comment": SEPARATORS, "timestamp": iso(NOW)}
    line = json.dumps({"traceId": "t", "scores": [score]}, ensure_ascii=False)
    traces.write_text(line + "\n", encoding="utf-8")
    assert vote_span(traces) == (NOW, NOW)
    labels = tmp_path / "labels.jsonl"
    label = {"trace_id": "t-1", "layer": "retrieval", "reviewer": "ana", "note": SEPARATORS}
    labels.write_text(json.dumps(label, ensure_ascii=False) + "\n", encoding="utf-8")
    found, bad_labels = labels_from_file(labels)
    assert [lab.trace_id for lab in found] == ["t-1"] and bad_labels == []


DEEP = "[" * 100_000 + "]" * 100_000


def _nested_line_file(tmp_path: Path, name: str, first: dict[str, Any]) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(first) + "\n" + DEEP + "\n", encoding="utf-8")
    return path


def test_a_line_nested_too_deeply_is_reported_with_its_number(tmp_path: Path) -> None:
    labels = _nested_line_file(tmp_path, "labels.jsonl", {"trace_id": "t-1", "layer": "retrieval"})
    _, bad = labels_from_file(labels)
    assert [b.where for b in bad] == ["labels.jsonl:2"] and "nested too deeply" in bad[0].reason

    facts = _nested_line_file(tmp_path, "facts.jsonl", FACTS_LINE)
    _, bad = decisions_from_facts_file(facts)
    assert [b.where for b in bad] == ["facts.jsonl:2"] and "nested too deeply" in bad[0].reason
    with pytest.raises(InputError, match=r"facts\.jsonl:2: JSON nested too deeply"):
        ReplayJudge(facts)

    cases = _nested_line_file(tmp_path, "cases.jsonl", {"id": "i-1", "datasetName": "d"})
    with pytest.raises(InputError, match=r"cases\.jsonl, line 2: .*nested too deeply"):
        DatasetFile(cases).dataset_items("d")

    traces = _nested_line_file(tmp_path, "traces.jsonl", {"traceId": "t", "scores": []})
    with pytest.raises(InputError, match=r"traces\.jsonl, line 2: .*nested too deeply"):
        vote_span(traces)

    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "page.md").write_text("# A page\n\nKatib runs trials of an experiment.\n", encoding="utf-8")
    _nested_line_file(folder, "INDEX.jsonl", {"path": "page.md", "url": "https://example.org/page"})
    with pytest.raises(ConfigError, match=r"INDEX\.jsonl, line 2: .*nested too deeply"):
        Index.from_folders([IndexFolder(collection="docs", path=folder)])
