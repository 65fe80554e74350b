"""`triage feedback`: the nightly job."""

from __future__ import annotations

from pathlib import Path

import click

from triage import logs
from triage.cli.common import (
    config_for,
    config_option,
    finish,
    handle_errors,
    limit_heap_fragmentation,
    load_settings,
    parse_shard,
    report_options,
    with_options,
    writable_file,
    writable_folder,
)
from triage.engine.options import RunOptions
from triage.sinks.issues import DEFAULT_MIN_SIZE

MAX_SINCE_HOURS = 24 * 366  # a year: Langfuse keeps no more by default, and a datetime cannot go far past


def finite(ctx: click.Context, param: click.Parameter, value: float) -> float:
    # click's FloatRange lets NaN through (every comparison with NaN is false)
    if value != value:
        raise click.BadParameter("must be a number of hours, not NaN")
    return value


@click.command()
@click.option(
    "--since-hours",
    type=click.FloatRange(min=0, max=MAX_SINCE_HOURS, min_open=True),
    callback=finite,
    default=24.0,
    show_default=True,
    help="Window length; it ends 15 minutes before now (data lag) and reaches back a configured overlap.",
)
@click.option("--write", is_flag=True, help="Write triage_layer and triage_component scores on the traces.")
@with_options(report_options)
@click.option(
    "--concurrency", type=click.IntRange(1, 256), default=8, show_default=True, help="Traces judged at once."
)
@click.option("--force", is_flag=True, help="Triage again traces already scored under this rule version.")
@click.option(
    "--judge",
    "judge_spec",
    metavar="heuristic|llm|cascade|replay:FILE",
    help="Default: llm when TRIAGE_JUDGE_MODEL is set, else heuristic (offline, no model).",
)
@click.option(
    "--shard",
    metavar="I/N",
    help="Take only shard I of N (stable hash of the trace). Default from JOB_COMPLETION_INDEX and TRIAGE_SHARD_COUNT.",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    help="Log line format on stderr. Default: TRIAGE_LOG_FORMAT.",
)
@config_option("Configuration file (TOML). Default: TRIAGE_CONFIG, else the built-in Kubeflow defaults.")
@click.option(
    "--facts-file",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    help="Append each trace's facts as JSONL (replay them with --judge replay:FILE). Default: TRIAGE_FACTS_FILE.",
)
@click.option(
    "--summary-file",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    callback=lambda ctx, param, value: writable_file(value, "--summary-file"),
    help="Write the run's figures (counts, judge calls, tokens, cost, exit code) as JSON to this file.",
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
    shard: str | None,
    log_format: str | None,
    config_path: Path | None,
    facts_file: Path | None,
    summary_file: Path | None,
    issues_dir: Path | None,
    issue_min_size: int,
) -> None:
    """Triage every thumbs-down vote in the window (the nightly job)."""
    limit_heap_fragmentation()  # memory flat in the window: see the function
    settings = load_settings()
    logs.configure(log_format or settings.triage_log_format, settings.secrets())
    from triage.compose import feedback as run

    options = RunOptions(
        since_hours=since_hours,
        write=write,
        force=force,
        concurrency=concurrency,
        shard=parse_shard(shard, settings),
        facts_file=facts_file or settings.triage_facts_file,
    )
    result = run(settings, config_for(settings, config_path), options, judge_spec)
    finish(result, report, report_file, summary_file, issues_dir, issue_min_size)
