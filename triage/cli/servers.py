"""The long-running servers: `triage index serve` (the embedded index over MCP) and `triage relay`
(the feedback service)."""

from __future__ import annotations

from pathlib import Path

import click

from triage.cli.options import config_option, handle_errors, log_format_option, open_app
from triage.domain.config import IndexFolder


@click.group()
def index() -> None:
    """The embedded search index (BM25 over folders of Markdown and YAML)."""


def _folders(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> list[IndexFolder]:
    folders = []
    for value in values:
        collection, sep, path = value.partition("=")
        if not sep or not collection or not path:
            raise click.BadParameter(f"expected COLLECTION=PATH, got {value!r}", param_hint="--folder")
        if not Path(path).is_dir():
            raise click.BadParameter(f"not a folder: {path}", param_hint="--folder")
        folders.append(IndexFolder(collection=collection, path=Path(path)))
    return folders


@index.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (HTTP).")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True, help="Port (HTTP).")
@click.option("--stdio", is_flag=True, help="Serve over standard input/output instead of HTTP.")
@click.option(
    "--folder",
    "folders",
    multiple=True,
    metavar="COLLECTION=PATH",
    callback=_folders,
    help="A folder to serve as a collection (repeatable). Default: the config's [[index]], else the demo index.",
)
@config_option("Configuration file.")
@log_format_option
@handle_errors
def serve(
    host: str, port: int, stdio: bool, folders: list[IndexFolder], config_path: Path | None, log_format: str | None
) -> None:
    """Serve the index as an MCP server with the docs agent's search tools (HTTP at /mcp, or stdio)."""
    open_app(log_format, config_path).serve_index(folders, host=host, port=port, stdio=stdio)


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
@log_format_option
@handle_errors
def relay(
    host: str, port: int, config_path: Path | None, outbox: Path | None, log_format: str | None
) -> None:
    """Serve POST /api/feedback (votes and verdicts) and write them where `triage feedback` reads.

    Langfuse when LANGFUSE_PUBLIC_KEY and LANGFUSE_SECRET_KEY are set (through a durable outbox),
    else the embedded store (TRIAGE_STORE). Without TRIAGE_RELAY_TOKEN or TRIAGE_RELAY_SIGNING_KEY
    it serves on 127.0.0.1 only.
    """
    open_app(log_format, config_path).relay(host=host, port=port, outbox=outbox)
