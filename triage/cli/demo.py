"""`triage demo`: the main job on the bundled demo data, with no set-up."""

from __future__ import annotations

import tempfile
from datetime import UTC, datetime
from pathlib import Path

import click

from triage import logs
from triage.cli.common import finish, handle_errors, load_settings, report_options, with_options
from triage.config import load_config
from triage.engine.options import RunOptions


@click.command()
@with_options(report_options[1:])
@click.option(
    "--store",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Keep the demo's embedded store in this file (default: a temporary file).",
)
@click.option("--write", is_flag=True, help="Write the scores into the demo store, as the nightly job does.")
@handle_errors
def demo(report_file: Path | None, store: Path | None, write: bool) -> None:
    """Run the main job on the bundled demo: embedded store, demo index, offline judge; print the report.

    Needs no Langfuse, no model and no server. The demo's votes are stamped relative to now.
    """
    settings = load_settings()
    logs.configure(settings.triage_log_format, settings.secrets())
    from triage.compose import demo as run_demo

    options = RunOptions(since_hours=24, write=write, now=datetime.now(UTC))
    with tempfile.TemporaryDirectory() as tmp:
        result = run_demo(load_config(None), options, store or Path(tmp) / "demo.sqlite")
    finish(result, True, report_file)
