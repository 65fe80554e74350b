"""The command line: parse the options, call one method of the application (`triage.app.Triage`),
render its result (`triage.sinks`), exit with its code.

The commands, grouped by what they do: `nightly` (feedback, demo, import), `review` (calibrate,
eval, queue, promote, votes: people and the verdicts), `releases` (the release watch and its
gate; `issues sync`, the owners' trackers), and here the two long-running servers (`index
serve`, the embedded index over MCP; `relay`, the feedback service); `options` holds what they
share (the options said once, opening the application, printing, errors to exit codes).
Exit codes are `triage.errors.ExitCode` (the CronJob's contract, documented in docs/operations.md).
"""

from __future__ import annotations

from pathlib import Path

import click

from triage import __version__, redact
from triage.cli.check import check
from triage.cli.nightly import demo, feedback, import_
from triage.cli.options import app_options, config_option, handle_errors, log_format_option, open_app
from triage.cli.releases import issues, releases
from triage.cli.review import calibrate, eval_, promote, queue, votes
from triage.domain.config import IndexFolder
from triage.errors import ExitCode


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
@app_options("Configuration file.")
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


HELP = f"""Tell the owners of an LLM agent why its answers got a thumbs-down.

Reads thumbs-down votes and their traces (Langfuse, or the embedded store when no Langfuse
keys are set), searches the index again, asks a judge for facts, maps them to a layer
(retrieval, generation, tool_routing, content gap, ...) and an owner, and reports.

Start with `triage demo`. Exit codes: {", ".join(f"{int(code)} {code.label}" for code in ExitCode)}.
"""


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, help=HELP)
@click.version_option(__version__, prog_name="triage")
def cli() -> None:
    redact.current_format = "text"  # until a command configures its logging


COMMANDS = (feedback, demo, import_, index, calibrate, eval_, queue, promote, check, releases, issues, votes, relay)
for command in COMMANDS:
    cli.add_command(command)


def main() -> None:
    cli()
