"""`triage import`: load an export into the embedded store."""

from __future__ import annotations

from pathlib import Path

import click

from triage.cli.common import handle_errors, load_settings


@click.command(name="import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--store",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The embedded store to load. Default: TRIAGE_STORE, else ~/.local/share/triage/store.sqlite.",
)
@handle_errors
def import_(file: Path, store: Path | None) -> None:
    """Load an export (JSONL, one trace per line with its observations and scores) into the embedded store."""
    settings = load_settings()
    from triage.compose import default_store_path
    from triage.sources.store import Store

    path = store or settings.triage_store or default_store_path()
    with Store(path) as db:
        counts = db.import_file(file)
    click.echo(
        f"imported {counts.traces} traces, {counts.observations} observations, {counts.scores} scores into {path}"
    )
