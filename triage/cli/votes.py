"""`triage votes`: conversations and their votes, filtered, as a table, JSON or CSV."""

from __future__ import annotations

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
@format_option("table", "json", "csv")
@output_option("Write to this file instead of standard output.")
@config_option("Configuration file (TOML): the vote score's name. Default: TRIAGE_CONFIG, else the built-in defaults.")
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
