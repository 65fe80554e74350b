"""`triage votes`: conversations and their votes, filtered, as a table, JSON or CSV."""

from __future__ import annotations

from pathlib import Path

import click

from triage import logs
from triage.cli.common import config_for, handle_errors, load_settings, writable_file
from triage.domain.conversations import FILTERS


@click.command()
@click.option(
    "--filter",
    "filter_",
    type=click.Choice(list(FILTERS)),
    default="any",
    show_default=True,
    help="Which conversations: all, any (some feedback), none, has-positive, has-negative, has-notes, "
    "positive-only, negative-only, mixed.",
)
@click.option(
    "--since-hours",
    type=click.FloatRange(min=0, max=24 * 366, min_open=True),
    default=24.0 * 7,
    show_default=True,
    help="Conversations with a trace started or a vote cast in this window (up to now).",
)
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv"]), default="table", show_default=True)
@click.option(
    "--output",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    callback=lambda ctx, param, value: writable_file(value, "--output"),
    help="Write to this file instead of standard output.",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Configuration file (TOML): the vote score's name. Default: TRIAGE_CONFIG, else the built-in defaults.",
)
@handle_errors
def votes(filter_: str, since_hours: float, fmt: str, output: Path | None, config_path: Path | None) -> None:
    """List conversations with their votes (up, down, with notes, traces), filtered by feedback."""
    settings = load_settings()
    logs.configure(settings.triage_log_format, settings.secrets())
    from triage.compose import votes as run
    from triage.sinks.votes import votes_csv, votes_json, votes_table
    from triage.worklist.votes import VotesOptions

    listing = run(settings, config_for(settings, config_path), VotesOptions(since_hours=since_hours, filter=filter_))
    text = {"json": votes_json, "csv": votes_csv}.get(fmt, votes_table)(listing)
    if output is None:
        click.echo(text, nl=False)
    else:
        output.write_text(text, encoding="utf-8", newline="")
