"""`triage calibrate`: how far the job's verdicts agree with people's labels."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from triage import logs
from triage.cli.common import (
    config_for,
    config_option,
    format_option,
    handle_errors,
    load_settings,
    output_option,
)
from triage.errors import ExitCode


@click.command()
@click.option(
    "--labels-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="People's labels as JSONL. Default: the label scores in the store (Langfuse annotations, verdicts).",
)
@click.option(
    "--facts-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The job's decisions from a run's facts file. Default: its triage_layer scores in the store.",
)
@click.option(
    "--since-hours",
    type=click.FloatRange(min=0, max=24 * 366, min_open=True),
    default=24.0 * 30,
    show_default=True,
    help="Labels from this window; decisions from 30 days further back.",
)
@click.option(
    "--min-kappa",
    type=click.FloatRange(-1, 1),
    help="Trust gate: exit 6 when the layer kappa's 95% lower bound is below this (or undefined).",
)
@format_option("markdown", "json")
@output_option()
@config_option(
    "Configuration file (TOML): score names, [calibration]. Default: TRIAGE_CONFIG, else the built-in defaults."
)
@handle_errors
def calibrate(
    labels_file: Path | None,
    facts_file: Path | None,
    since_hours: float,
    min_kappa: float | None,
    fmt: str,
    output: Path | None,
    config_path: Path | None,
) -> None:
    """Compare the job's verdicts with people's labels: agreement, kappa, confusion, disagreements."""
    settings = load_settings()
    logs.configure(settings.triage_log_format, settings.secrets())
    from triage.calibration.calibrate import CalibrateOptions
    from triage.compose import calibrate as run
    from triage.sinks.calibration import calibration_json, render_calibration

    options = CalibrateOptions(
        since_hours=since_hours, labels_file=labels_file, facts_file=facts_file, min_kappa=min_kappa
    )
    report = run(settings, config_for(settings, config_path), options)
    text = calibration_json(report) if fmt == "json" else render_calibration(report)
    if output is None:
        click.echo(text, nl=False)
    else:
        output.write_text(text, encoding="utf-8")
    if report.gate_passed is False:
        sys.exit(ExitCode.BELOW_GATE)
