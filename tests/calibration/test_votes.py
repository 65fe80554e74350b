"""`triage votes`: conversations and their votes, every filter, table / JSON / CSV, on both backends.

The same records go to the embedded store and the Langfuse stand-in (also in its legacy mode);
the Langfuse exchanges are validated against ../shared/langfuse/openapi.yml.
"""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from tests.doubles.langfuse_server import LangfuseStandIn
from tests.factories import session_vote, trace_line
from tests.sources.test_langfuse_spec import openapi, validate  # noqa: F401 - `openapi` is a fixture
from triage.cli import cli
from triage.domain.records import Vote
from triage.domain.votes import FILTERS, TraceRef, group_conversations
from triage.sinks.exports import safe_cell
from triage.sources.store import Store

NOW = datetime.now(UTC).replace(microsecond=0)
HOSTILE = "=cmd|' /C calc'!A0 | <b>bold</b> [link](http://evil.example)\n# heading"


def line(
    trace_id: str,
    *,
    session: str | None = None,
    vote: float | None = None,
    comment: str | None = None,
    started: timedelta = timedelta(hours=2),
    voted: timedelta | None = None,
) -> dict[str, Any]:
    record = trace_line(
        trace_id, f"question {trace_id}?", "answer", vote=vote, comment=comment, at=NOW - started, session_id=session
    )
    if voted is not None:
        for score in record["scores"]:
            score["timestamp"] = (NOW - voted).isoformat()
    return record


def records() -> list[dict[str, Any]]:
    return [
        # a session: one thumbs-up with a note, one thumbs-down, and a vote on the session (its turn 1)
        line("s1-a", session="s1", vote=1, comment="great", started=timedelta(hours=3)),
        line("s1-b", session="s1", vote=0, comment=None, started=timedelta(hours=2, minutes=50)),
        session_vote("sv1", "s1", 1, NOW - timedelta(hours=2), comment="still wrong"),
        # a session nobody voted on
        line("s2-a", session="s2"),
        line("s2-b", session="s2", started=timedelta(hours=1)),
        # traces of their own
        line("t-up", vote=1, comment=""),
        line("t-down", vote=0, comment=HOSTILE),
        line("t-none"),
        # a trace of ten days ago in a session, voted on today: counted, placed in its session
        line("t-old", session="s-old", vote=0, comment="late", started=timedelta(days=10), voted=timedelta(hours=1)),
        # a vote from before the window: not counted
        line("t-stale", vote=0, started=timedelta(days=3), voted=timedelta(days=3)),
    ]


EXPECTED = {
    "s1": {"kind": "session", "traces": 2, "up": 1, "down": 2, "notes": 2},
    "s2": {"kind": "session", "traces": 2, "up": 0, "down": 0, "notes": 0},
    "t-up": {"kind": "trace", "traces": 1, "up": 1, "down": 0, "notes": 0},
    "t-down": {"kind": "trace", "traces": 1, "up": 0, "down": 1, "notes": 1},
    "t-none": {"kind": "trace", "traces": 1, "up": 0, "down": 0, "notes": 0},
    "s-old": {"kind": "session", "traces": 1, "up": 0, "down": 1, "notes": 1},
}
BY_FILTER = {
    "all": set(EXPECTED),
    "any": {"s1", "t-up", "t-down", "s-old"},
    "none": {"s2", "t-none"},
    "has-positive": {"s1", "t-up"},
    "has-negative": {"s1", "t-down", "s-old"},
    "has-notes": {"s1", "t-down", "s-old"},
    "positive-only": {"t-up"},
    "negative-only": {"t-down", "s-old"},
    "mixed": {"s1"},
}


def invoke(env: dict[str, str], *args: str) -> Result:
    return CliRunner().invoke(cli, ["votes", "--since-hours", "24", *args], env=env, catch_exceptions=False)


def rows(result: Result) -> dict[str, dict[str, Any]]:
    assert result.exit_code == 0, result.output
    return {c["id"]: c for c in json.loads(result.stdout)["conversations"]}


def counts(row: dict[str, Any]) -> dict[str, Any]:
    return {k: row[k] for k in ("kind", "traces", "up", "down", "notes")}


def check_every_filter(env: dict[str, str]) -> None:
    every = rows(invoke(env, "--filter", "all", "--format", "json"))
    assert {k: counts(v) for k, v in every.items()} == EXPECTED
    assert every["t-down"]["comments"] == [HOSTILE.strip()]
    assert every["s1"]["comments"] == ["still wrong", "great"]  # newest first
    for name, wanted in BY_FILTER.items():
        assert set(rows(invoke(env, "--filter", name, "--format", "json"))) == wanted, name


# -- the grouping, without a backend ---------------------------------------------------------


def test_filters_are_the_ones_people_use() -> None:
    assert set(FILTERS) == set(BY_FILTER)


def test_a_trace_vote_joins_its_session_and_a_sessionless_trace_is_its_own_conversation() -> None:
    at = NOW - timedelta(hours=1)
    refs = [TraceRef(trace_id="a", session_id="s", start_time=at), TraceRef(trace_id="b", start_time=at)]
    votes = [
        Vote(id="1", trace_id="a", value=0, timestamp=at, comment="no"),
        Vote(id="2", session_id="s", turn=0, value=1, timestamp=at),
        Vote(id="3", trace_id="b", value=1, timestamp=at),
        Vote(id="4", value=0, timestamp=at),  # on nothing: left out, as feedback lists it as bad input
        Vote(id="5", trace_id="b", value=-1, timestamp=at),  # not a vote the store could read
    ]
    session = [TraceRef(trace_id=t, session_id="s") for t in ("a", "x")]
    found = {c.id: c for c in group_conversations(refs, votes, {"s": session})}
    assert (found["s"].up, found["s"].down, found["s"].notes, found["s"].traces) == (1, 1, 1, 2)
    assert (found["b"].kind, found["b"].up, found["b"].down, found["b"].traces) == ("trace", 1, 0, 1)
    assert set(found) == {"s", "b"}


# -- both backends ---------------------------------------------------------------------------


def test_the_embedded_store_every_filter(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    with Store(path) as store:
        store.import_lines([json.dumps(r) for r in records()], "test")
    check_every_filter({"TRIAGE_STORE": str(path), "LANGFUSE_PUBLIC_KEY": "", "LANGFUSE_SECRET_KEY": ""})


@pytest.mark.slow
@pytest.mark.parametrize("legacy", [False, True], ids=["v2", "legacy"])
def test_langfuse_every_filter_and_the_exchanges_match_the_spec(openapi: Any, legacy: bool) -> None:  # noqa: F811
    with LangfuseStandIn(records=records(), legacy=legacy) as server:
        env = {
            **server.env,
            "LANGFUSE_TIMEOUT": "5",
        }
        check_every_filter(env)
        linked = rows(invoke(env, "--format", "json"))
        assert linked["t-down"]["url"] == f"{server.url}/project/proj-standin/traces/t-down"
        assert linked["s1"]["url"].endswith("/traces/s1-a")  # a session links to its first trace
        checked = {validate(openapi, entry) for entry in server.log}
    assert "unvalidated" not in checked
    assert ("GET /api/public/traces 200" if legacy else "GET /api/public/v2/observations 200") in checked


# -- the formats -----------------------------------------------------------------------------


@pytest.fixture
def store_env(tmp_path: Path) -> dict[str, str]:
    path = tmp_path / "store.sqlite"
    with Store(path) as store:
        store.import_lines([json.dumps(r) for r in records()], "test")
    return {"TRIAGE_STORE": str(path), "LANGFUSE_PUBLIC_KEY": "", "LANGFUSE_SECRET_KEY": ""}


def test_csv_has_the_counts_and_no_cell_runs_as_a_formula(store_env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "votes.csv"
    result = invoke(store_env, "--filter", "all", "--format", "csv", "--output", str(out))
    assert result.exit_code == 0 and result.stdout == ""
    table = list(csv.DictReader(io.StringIO(out.read_text(encoding="utf-8"))))
    by_id = {row["conversation"]: row for row in table}
    assert set(by_id) == set(EXPECTED)
    assert (by_id["s1"]["up"], by_id["s1"]["down"], by_id["s1"]["notes"], by_id["s1"]["traces"]) == ("1", "2", "2", "2")
    assert by_id["t-down"]["newest_note"] == "'" + HOSTILE.strip()
    for row in table:
        for cell in row.values():
            assert not cell.startswith(("=", "+", "-", "@", "\t", "\r")), cell


@pytest.mark.parametrize("text", ["=1+1", "+1", "-1", "@SUM(A1)", "\tx", "\rx"])
def test_formula_cells_are_prefixed(text: str) -> None:
    assert safe_cell(text) == "'" + text
    assert safe_cell("plain") == "plain" and safe_cell(3) == 3


def test_the_table_keeps_its_shape_whatever_the_comment(store_env: dict[str, str]) -> None:
    result = invoke(store_env, "--filter", "has-notes")
    assert result.exit_code == 0
    text = result.stdout
    table = [line for line in text.splitlines() if line.startswith("|")]
    assert len(table) == 2 + len(BY_FILTER["has-notes"])  # header, rule, one row each: no line broken
    assert all(line.replace("\\|", "").count("|") == 10 for line in table)  # 9 cells, none split
    assert "<b>" not in text and "\\[link\\]" in text and "http\\://evil" in text
    assert not any(line.startswith("# heading") for line in text.splitlines())


def test_the_table_renders_as_a_table(store_env: dict[str, str]) -> None:
    markdown_it = pytest.importorskip("markdown_it")
    tokens = markdown_it.MarkdownIt().enable("table").parse(invoke(store_env, "--filter", "all").stdout)
    assert [t.tag for t in tokens if t.type.endswith("_open") and t.tag.startswith("h")][:1] == ["h1"]
    assert sum(1 for t in tokens if t.type == "tr_open") == 1 + len(EXPECTED)
    assert not any(t.type == "link_open" or t.type == "html_inline" for t in tokens if t.children is None) and not any(
        c.type in ("link_open", "html_inline") for t in tokens for c in (t.children or [])
    )


def test_an_empty_window_is_an_empty_table(tmp_path: Path) -> None:
    Store(tmp_path / "empty.sqlite").close()  # a store with nothing in it (a missing one is an error)
    env = {"TRIAGE_STORE": str(tmp_path / "empty.sqlite"), "LANGFUSE_PUBLIC_KEY": "", "LANGFUSE_SECRET_KEY": ""}
    result = invoke(env)
    assert result.exit_code == 0
    assert "0 of 0 conversations (any)" in result.stdout
