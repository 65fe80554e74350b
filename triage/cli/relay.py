"""`triage relay`: the feedback service (votes and verdicts over HTTP into the store the job reads)."""

from __future__ import annotations

from pathlib import Path

import click

from triage import logs
from triage.cli.common import config_for, config_option, handle_errors, load_settings
from triage.errors import ConfigError


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
    from triage.compose import default_store_path
    from triage.relay.app import Credentials
    from triage.relay.server import check_startup, relay_running, serve
    from triage.relay.sinks import LangfuseSink, Sink, StoreSink
    from triage.sources.store import Store

    config = config_for(settings, config_path)
    credentials = Credentials(
        gateway_token=settings.triage_relay_token.get_secret_value() if settings.triage_relay_token else None,
        signing_key=settings.triage_relay_signing_key.get_secret_value()
        if settings.triage_relay_signing_key
        else None,
    )
    check_startup(config, credentials, host)
    store_path = settings.triage_store or default_store_path()
    outbox_path = outbox or settings.triage_relay_outbox or store_path.parent / "relay.sqlite"
    sink: Sink
    if settings.uses_langfuse:
        if not settings.langfuse_public_key or not settings.langfuse_secret_key:
            missing = "LANGFUSE_SECRET_KEY" if settings.langfuse_public_key else "LANGFUSE_PUBLIC_KEY"
            raise ConfigError(
                f"Langfuse needs both keys: set {missing} (or unset the other to use the embedded store)"
            )
        from triage.domain.ports import SourceStats
        from triage.sources.langfuse.http import LANGFUSE_RETRY, LangfuseHttp

        http = LangfuseHttp(
            public_key=settings.langfuse_public_key,
            secret_key=settings.langfuse_secret_key.get_secret_value(),
            base_url=settings.langfuse_base_url,
            timeout=settings.langfuse_timeout,
            retry=LANGFUSE_RETRY.with_(attempts=1),
            stats=SourceStats(),
        )
        sink = LangfuseSink(http, batch_max=config.relay.batch_max, model=config.relay)
    else:
        sink = StoreSink(Store(store_path, create_folder=settings.triage_store is None))
    try:
        with relay_running(config, sink, outbox_path, credentials) as app:
            serve(app, host, port)
    finally:
        sink.close()
