"""The bundled demo: every layer appears, and every demo trace lands where it was written to land."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path

from click.testing import CliRunner

from triage.cli import cli
from triage.compose import DEMO_DIR, demo
from triage.config import load_config
from triage.domain.records import Layer
from triage.engine.options import RunOptions
from triage.engine.run import Sources, run_feedback
from triage.judges.replay import ReplayJudge
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
                options=RunOptions(now=now),
                searcher=NoSearch(),
            )  # type: ignore[arg-type]
        )
    assert {(e.trace_id, e.layer, e.component) for e in replayed.entries} == {
        (e.trace_id, e.layer, e.component) for e in first.entries
    }
    assert replayed.usage.calls == 0 and replayed.search_calls == 0


def test_readme_shows_what_the_demo_prints() -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    out = CliRunner().invoke(cli, ["demo"], catch_exceptions=False, prog_name="triage").stdout
    table = [line for line in out.splitlines() if line.startswith("|")]
    assert table and all(line in readme for line in table), "README's demo output is stale: rerun `triage demo`"
    entries = [line for line in out.splitlines() if line.startswith(("- **", "  - component"))]
    assert all(line in readme for line in entries)


def test_the_demo_report_is_the_same_bytes_at_any_concurrency(tmp_path: Path) -> None:
    """Issue 27: four runs of `triage demo` gave four reports (items followed the order traces
    finished, and the report carried the wall time). Four runs, at concurrency 1 and 16: one report."""
    from datetime import UTC, datetime

    from triage.compose import demo
    from triage.config import load_config
    from triage.engine.options import RunOptions
    from triage.sinks.report import render_report

    now = datetime(2026, 12, 1, 14, 13, tzinfo=UTC)
    reports = set()
    for run, concurrency in enumerate((1, 16, 1, 16)):
        options = RunOptions(since_hours=24, write=False, now=now, concurrency=concurrency)
        reports.add(render_report(demo(load_config(None), options, tmp_path / f"demo-{run}.sqlite")))
    assert len(reports) == 1
