"""The nightly job and what feeds it: `triage feedback`, `triage demo`, `triage import`."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from triage import judges
from triage.cli.options import (
    concurrency_option,
    config_option,
    emit,
    file_option,
    handle_errors,
    limit_heap_fragmentation,
    log_format_option,
    open_app,
    shard_option,
    window_option,
    writable_folder,
)
from triage.domain.outcome import Shard
from triage.engine.stream import RunOptions
from triage.sinks.exports import imported_text
from triage.sinks.report import DEFAULT_MIN_SIZE, RunOutputs, publish_run

REPORT_FILE_HELP = "Also write the Markdown report to this file."


@click.command(epilog=judges.JUDGES.epilog())
@window_option(
    24.0, "Window length; it ends 15 minutes before now (data lag) and reaches back a configured overlap."
)
@click.option("--write", is_flag=True, help="Write triage_layer and triage_component scores on the traces.")
@click.option("--report", is_flag=True, help="Print the Markdown report to standard output.")
@file_option("--report-file", REPORT_FILE_HELP)
@concurrency_option("Traces judged at once (as many more are searched meanwhile).", default=8)
@click.option("--force", is_flag=True, help="Triage again traces already scored under this rule version.")
@click.option(
    "--judge",
    "judge_spec",
    metavar="JUDGE",
    help="Default: llm when TRIAGE_JUDGE_MODEL is set, else heuristic (offline, no model).",
)
@click.option(
    "--batch",
    "batch_mode",
    is_flag=True,
    help="Send the model judge's calls through the Batch API (half the price; up to "
    "TRIAGE_BATCH_DEADLINE_SECONDS of waiting, then the rest directly); the window's traces are judged at once.",
)
@shard_option
@log_format_option
@config_option("Configuration file (TOML). Default: TRIAGE_CONFIG, else the built-in Kubeflow defaults.")
@click.option(
    "--facts-file",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    help="Append each trace's facts as JSONL (replay them with --judge replay:FILE). Default: TRIAGE_FACTS_FILE.",
)
@file_option(
    "--summary-file",
    "Write the run's figures (counts, judge calls, tokens, cost, exit code) as JSON to this file.",
)
@click.option(
    "--issues-dir",
    type=click.Path(file_okay=False, path_type=Path),
    callback=lambda ctx, param, value: writable_folder(value, "--issues-dir"),
    help="Write issue drafts here: one Markdown file per owner, and one per signature seen often. Nothing is filed.",
)
@click.option(
    "--issue-min-size",
    type=click.IntRange(min=1),
    default=DEFAULT_MIN_SIZE,
    show_default=True,
    help="A signature gets its own draft with this many traces in the last 8 nights.",
)
@handle_errors
def feedback(
    since_hours: float,
    write: bool,
    report: bool,
    report_file: Path | None,
    concurrency: int,
    force: bool,
    judge_spec: str | None,
    batch_mode: bool,
    shard: Shard | None,
    log_format: str | None,
    config_path: Path | None,
    facts_file: Path | None,
    summary_file: Path | None,
    issues_dir: Path | None,
    issue_min_size: int,
) -> None:
    """Triage every thumbs-down vote in the window (the nightly job)."""
    limit_heap_fragmentation()  # memory flat in the window: see the function
    app = open_app(log_format, config_path)
    options = RunOptions(
        since_hours=since_hours,
        write=write,
        force=force,
        concurrency=concurrency,
        shard=shard or app.settings.shard(),
        facts_file=facts_file or app.settings.triage_facts_file,
        batch_mode=batch_mode,
    )
    result = app.feedback(options, judge_spec)
    publish_run(result, RunOutputs(report, report_file, summary_file, issues_dir, issue_min_size), emit)
    sys.exit(result.exit_code)


@click.command()
@file_option("--report-file", REPORT_FILE_HELP)
@click.option(
    "--store",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Keep the demo's embedded store in this file (default: a temporary file).",
)
@click.option("--write", is_flag=True, help="Write the scores into the demo store, as the nightly job does.")
@log_format_option
@handle_errors
def demo(report_file: Path | None, store: Path | None, write: bool, log_format: str | None) -> None:
    """Run the main job on the bundled demo: embedded store, demo index, offline judge; print the report.

    Needs no Langfuse, no model and no server. The demo's votes are stamped relative to now.
    """
    app = open_app(log_format, built_in_config=True)
    result = app.demo(RunOptions(since_hours=24, write=write), store)
    publish_run(result, RunOutputs(report=True, report_file=report_file), emit)
    sys.exit(result.exit_code)


@click.command(name="import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--store",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The embedded store to load. Default: TRIAGE_STORE, else ~/.local/share/triage/store.sqlite.",
)
@log_format_option
@handle_errors
def import_(file: Path, store: Path | None, log_format: str | None) -> None:
    """Load an export (JSONL, one trace per line with its observations and scores) into the embedded store."""
    app = open_app(log_format, built_in_config=True)
    emit(imported_text(app.import_(file, store)))
