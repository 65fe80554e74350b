"""The bundled demo: every layer appears, and every demo trace lands where it was written to land."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import UTC, datetime
from pathlib import Path

from click.testing import CliRunner

from tests.test_docs import DOCS, README, fence_blocks, parse
from triage.app import DEMO_DIR, run_setup
from triage.app import run_demo as demo
from triage.cli import cli
from triage.domain.records import Layer
from triage.engine.run import Sources, run_feedback
from triage.engine.stream import RunOptions
from triage.judges.replay import ReplayJudge
from triage.settings import load_config
from triage.sources.store import Store


def expected() -> dict[str, dict[str, str]]:
    rows = [
        json.loads(line) for line in (DEMO_DIR / "expected.jsonl").read_text().splitlines() if line.strip()
    ]
    return {row["trace_id"]: row for row in rows}


def test_every_demo_trace_lands_on_its_layer_and_component(tmp_path: Path) -> None:
    result = demo(load_config(), RunOptions(now=datetime.now(UTC)), tmp_path / "demo.sqlite")
    want = expected()
    assert len(want) >= 20
    got = {e.trace_id: (e.layer.value, e.component) for e in result.entries}
    assert got == {t: (row["layer"], row["component"]) for t, row in want.items()}
    assert {layer.value for layer in Layer} == {layer for layer, _ in got.values()}
    assert result.skipped == [] and result.exit_code == 0
    # only the trace whose comment tries to steer the judge is flagged, and it still lands honestly
    assert [e.trace_id for e in result.entries if e.injection_suspected] == ["demo-gen-hostile-medianstop"]


def test_demo_twice_with_write_second_run_triages_and_writes_nothing(tmp_path: Path) -> None:
    store_path = tmp_path / "demo.sqlite"
    now = datetime.now(UTC)
    first = demo(load_config(), RunOptions(now=now, write=True), store_path)
    assert first.written == 2 * len(first.entries)
    second = demo(load_config(), RunOptions(now=now, write=True), store_path)
    assert second.entries == [] and second.written == 0
    assert second.already_triaged == len(first.entries)
    with Store(store_path) as store:
        layer_rows = store.scores_named("triage_layer")
    assert len(layer_rows) == len({r["id"] for r in layer_rows}) == len(first.entries)


def test_demo_command_prints_the_report() -> None:
    result = CliRunner().invoke(cli, ["demo"], catch_exceptions=False, prog_name="triage")
    assert result.exit_code == 0
    out = result.stdout
    assert out.startswith("# Triage of thumbs-down answers")
    for layer in Layer:
        assert f"### {layer.value} (" in out
    assert "## kubeflow/docs-agent" in out and "## kubeflow/katib" in out
    assert "&lt;script&gt;" in out and "<script>" not in out
    assert out.count("warning: the trace or the comment contains text that tries to instruct the judge") == 1


def test_recorded_facts_replay_to_the_same_layers_without_search_or_model(tmp_path: Path) -> None:
    facts = tmp_path / "facts.jsonl"
    now = datetime.now(UTC)
    first = demo(load_config(), RunOptions(now=now, facts_file=facts), tmp_path / "demo.sqlite")
    assert len(facts.read_text().splitlines()) == len(first.entries)

    class NoSearch:
        async def __aenter__(self) -> NoSearch:
            raise AssertionError("a replay must not search")

        async def __aexit__(self, *exc: object) -> None:
            return None

    with Store(tmp_path / "demo.sqlite") as store:
        judge = ReplayJudge(facts)
        replayed = asyncio.run(
            run_feedback(
                sources=Sources.of(store),
                judge=judge,
                config=load_config(),
                options=RunOptions(now=now), setup=run_setup(RunOptions(now=now), load_config()),
                searcher=NoSearch(),
            )  # type: ignore[arg-type]
        )
    assert {(e.trace_id, e.layer, e.component) for e in replayed.entries} == {
        (e.trace_id, e.layer, e.component) for e in first.entries
    }
    assert replayed.usage.calls == 0 and replayed.search_calls == 0


def _dated(line: str) -> str:
    # a run's dates and times are its own; everything else is the same on every run
    return re.sub(r"\d{4}-\d{2}-\d{2}|\d{2}:\d{2}", "D", line)


def _logged(line: str) -> str:
    # a log line without its time stamp, its figures (rates, seconds) as N
    return re.sub(r"\d+(?:\.\d+)?", "N", re.sub(r"^\S+Z\s+", "", line))


def test_the_docs_show_what_the_demo_prints() -> None:
    """README.md shows the top of `triage demo`'s output, docs/report.md the rest: every line they
    show is one the demo prints (dates and timings aside), the log whole, and the README the totals.
    A section the report gains is not asked of the page (its own heading and line say what it is);
    a line the page shows that the demo no longer prints fails: rerun `triage demo` and paste."""
    result = CliRunner().invoke(cli, ["demo"], catch_exceptions=False, prog_name="triage")
    printed = {_dated(line) for line in result.stdout.splitlines()}
    logged = {_logged(line) for line in result.stderr.splitlines()}
    shown: dict[str, tuple[list[str], list[str]]] = {}
    for page in (README, DOCS / "report.md"):
        tokens = parse(page)
        reports = [b.splitlines() for b in fence_blocks(tokens, "markdown")]
        logs = [b.splitlines() for b in fence_blocks(tokens, "") if b.startswith("20")]
        assert reports and logs, f"{page.name} shows no demo output"
        report = [line for block in reports for line in block if line.strip() and line != "..."]
        log = [line for block in logs for line in block]
        stale = [line for line in report if _dated(line) not in printed]
        stale += [line for line in log if _logged(line) not in logged]
        assert not stale, f"{page.name}: the demo does not print {stale[:3]}: rerun `triage demo`"
        shown[page.name] = report, log
    _, log = shown["report.md"]
    assert {_logged(line) for line in log} == logged
    readme_report, _ = shown["README.md"]
    table = [line for line in result.stdout.splitlines() if line.startswith("|")][:8]
    assert all(line in readme_report for line in table), "README.md: the totals table is stale"


def test_the_demo_report_is_the_same_bytes_at_any_concurrency(tmp_path: Path) -> None:
    """Issue 27: four runs of `triage demo` gave four reports (items followed the order traces
    finished, and the report carried the wall time). Four runs, at concurrency 1 and 16: one report."""
    from datetime import UTC, datetime

    from triage.app import run_demo as demo
    from triage.engine.stream import RunOptions
    from triage.settings import load_config
    from triage.sinks.report import render_report

    now = datetime(2026, 12, 1, 14, 13, tzinfo=UTC)
    reports = set()
    for run, concurrency in enumerate((1, 16, 1, 16)):
        options = RunOptions(since_hours=24, write=False, now=now, concurrency=concurrency)
        reports.add(render_report(demo(load_config(None), options, tmp_path / f"demo-{run}.sqlite")))
    assert len(reports) == 1
