"""`triage queue`: a sample of the verdicts into a Langfuse annotation queue, for people to label."""

from __future__ import annotations

from pathlib import Path

import click

from triage import logs
from triage.calibration.queue import QueueOptions
from triage.cli.common import config_for, config_option, handle_errors, load_settings
from triage.cli.feedback import MAX_SINCE_HOURS, finite


@click.command()
@click.option(
    "--since-hours",
    type=click.FloatRange(min=0, max=MAX_SINCE_HOURS, min_open=True),
    callback=finite,
    default=24.0,
    show_default=True,
    help="Window of verdicts (by their trace's start), drawn as `triage feedback` draws its window.",
)
@click.option(
    "--per-layer",
    type=click.IntRange(0, 10_000),
    default=10,
    show_default=True,
    help="Traces sampled per layer (stable hash order; traces already queued count toward it).",
)
@click.option("--dry-run", is_flag=True, help="Show what would be created and queued; write nothing.")
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    help="Log line format on stderr. Default: TRIAGE_LOG_FORMAT.",
)
@config_option("Configuration file (TOML). Default: TRIAGE_CONFIG, else the built-in Kubeflow defaults.")
@handle_errors
def queue(
    since_hours: float, per_layer: int, dry_run: bool, log_format: str | None, config_path: Path | None
) -> None:
    """Queue a sample of triaged traces for human review in a Langfuse annotation queue.

    Per layer a stable sample, plus every low-confidence and injection-flagged verdict; creates the
    score configs and the queue when missing; never queues a trace twice and never pre-fills a verdict.
    Needs Langfuse (the embedded store has no annotation queues).
    """
    settings = load_settings()
    logs.configure(log_format or settings.triage_log_format, settings.secrets())
    from triage.compose import queue as run

    options = QueueOptions(since_hours=since_hours, per_layer=per_layer, dry_run=dry_run)
    result = run(settings, config_for(settings, config_path), options)
    for line in result.lines():
        click.echo(line)
