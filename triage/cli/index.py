"""`triage index`: the embedded search index, served over MCP."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from triage import logs
from triage.cli.common import config_for, config_option, handle_errors, load_settings
from triage.domain.config import IndexFolder, TriageConfig

log = logging.getLogger("triage")

@click.group()
def index() -> None:
    """The embedded search index (BM25 over folders of Markdown and YAML)."""


def _folders(values: tuple[str, ...], config: TriageConfig) -> list[IndexFolder]:
    if not values:
        from triage.compose import demo_index_folders

        return config.index or demo_index_folders()
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
    help="A folder to serve as a collection (repeatable). Default: the config's [[index]], else the demo index.",
)
@config_option("Configuration file.")
@handle_errors
def serve(host: str, port: int, stdio: bool, folders: tuple[str, ...], config_path: Path | None) -> None:
    """Serve the index as an MCP server with the docs agent's search tools (HTTP at /mcp, or stdio)."""
    settings = load_settings()
    config = config_for(settings, config_path)
    from triage.search.index import Index
    from triage.search.mcp_server import serve as run_server

    logs.configure(settings.triage_log_format)
    built = Index.from_folders(_folders(folders, config))
    where = "stdio" if stdio else f"http://{host}:{port}/mcp"
    log.info("serving %d chunks in %s on %s", built.size, ", ".join(built.collections), where)
    run_server(built, config.tools, host=host, port=port, stdio=stdio)
