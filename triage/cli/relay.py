"""`triage relay`: the feedback service (votes and verdicts over HTTP into the store the job reads)."""

from __future__ import annotations

from pathlib import Path

import click

from triage import logs
from triage.cli.common import config_for, config_option, handle_errors, load_settings


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", type=click.IntRange(1, 65535), default=8080, show_default=True, help="Port to listen on."
)
@config_option("Configuration file (TOML; its [relay] table declares the score model). Default: TRIAGE_CONFIG.")
@click.option(
    "--outbox",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The relay's SQLite file (ledger and outbox). Default: TRIAGE_RELAY_OUTBOX, else relay.sqlite "
    "beside the embedded store.",
)
@click.option("--log-format", type=click.Choice(["text", "json"]), help="Default: TRIAGE_LOG_FORMAT.")
@handle_errors
def relay(
    host: str, port: int, config_path: Path | None, outbox: Path | None, log_format: str | None
) -> None:
    """Serve POST /api/feedback (votes and verdicts) and write them where `triage feedback` reads.

    Langfuse when LANGFUSE_PUBLIC_KEY and LANGFUSE_SECRET_KEY are set (through a durable outbox),
    else the embedded store (TRIAGE_STORE). Without TRIAGE_RELAY_TOKEN or TRIAGE_RELAY_SIGNING_KEY
    it serves on 127.0.0.1 only.
    """
    settings = load_settings()
    logs.configure(log_format or settings.triage_log_format, settings.secrets())
    from triage import compose

    compose.relay(settings, config_for(settings, config_path), host=host, port=port, outbox=outbox)
