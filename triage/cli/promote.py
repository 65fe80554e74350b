"""`triage promote`: reviewed and selected failures become regression cases (dataset items)."""

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
    writable_file,
)
from triage.domain.records import Layer


@click.command()
@click.option(
    "--dataset", default="triage-regressions", show_default=True, help="The dataset to upsert the cases into."
)
@click.option("--trace", "traces", multiple=True, metavar="ID", help="Promote this trace (repeatable).")
@click.option(
    "--signature",
    "signatures",
    multiple=True,
    metavar="ID",
    help="Promote the traces of this failure signature (repeatable).",
)
@click.option(
    "--layer",
    "layers",
    multiple=True,
    type=click.Choice([layer.value for layer in Layer]),
    help="Promote the traces triaged to this layer (repeatable).",
)
@click.option(
    "--corrections/--no-corrections",
    default=True,
    show_default=True,
    help="Also promote every reviewer's negative verdict that has a corrected answer or expected tool behaviour.",
)
@click.option(
    "--since-hours",
    type=click.FloatRange(min=0, max=24 * 366, min_open=True),
    default=24.0 * 30,
    show_default=True,
    help="Reviewers' scores of this window; the job's triage scores from 30 days further back.",
)
@click.option(
    "--jsonl",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    callback=lambda ctx, param, value: writable_file(value, "--jsonl"),
    help="Upsert the cases into this JSONL file instead of the dataset (Langfuse or the embedded store).",
)
@click.option("--dry-run", is_flag=True, help="Say what would be created or updated; write nothing.")
@format_option("markdown", "json")
@config_option("Configuration file (TOML): score names, tools. Default: TRIAGE_CONFIG, else the built-in defaults.")
@handle_errors
def promote(
    dataset: str,
    traces: tuple[str, ...],
    signatures: tuple[str, ...],
    layers: tuple[str, ...],
    corrections: bool,
    since_hours: float,
    jsonl: Path | None,
    dry_run: bool,
    fmt: str,
    config_path: Path | None,
) -> None:
    """Turn reviewers' corrections and selected failures into dataset items, upserted by a stable id."""
    settings = load_settings()
    logs.configure(settings.triage_log_format, settings.secrets())
    from triage.compose import promote as run
    from triage.sinks.promote import promote_json, render_promote
    from triage.worklist.promote import PromoteOptions

    if not dataset.strip():
        raise click.BadParameter("the dataset needs a name", param_hint="--dataset")
    options = PromoteOptions(
        dataset=dataset,
        traces=traces,
        signatures=signatures,
        layers=layers,
        corrections=corrections,
        since_hours=since_hours,
        dry_run=dry_run,
    )
    result = run(settings, config_for(settings, config_path), options, jsonl)
    click.echo(promote_json(result) if fmt == "json" else render_promote(result), nl=False)
    sys.exit(result.exit_code)
