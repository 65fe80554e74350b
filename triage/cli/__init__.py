"""The command line: parse options, build settings, call one core function, map errors to exit codes.

Exit codes (the CronJob's contract, documented in the README):
0 done; 1 runtime failure; 2 usage; 3 configuration or authentication;
4 degraded (some traces undecided: search or judge unavailable, or judge output rejected);
5 some scores not confirmed as written.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click
from pydantic import ValidationError

from triage import __version__, logs
from triage.config import load_config
from triage.domain.config import IndexFolder, TriageConfig
from triage.domain.outcome import RunResult, Shard
from triage.engine.options import RunOptions
from triage.errors import ConfigError, TriageError
from triage.settings import Settings
from triage.sinks.report import render_report, summary_lines

log = logging.getLogger("triage")
F = TypeVar("F", bound=Callable[..., Any])


class TriageClickError(click.ClickException):
    """A `TriageError` shown as `Error: ...`, with the error's own exit code."""

    def __init__(self, error: TriageError) -> None:
        super().__init__(str(error))
        self.exit_code = error.exit_code  # type: ignore[misc]  # click's class default is 1


def handle_errors(func: F) -> F:
    """Turn `TriageError` into a clean message and exit code; crashes too, unless TRIAGE_RAISE_ERRORS is set."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except TriageError as ex:
            if logs.current_format == "json":
                # a log collector reads stderr as JSON lines: the fatal error is one too
                log.error("%s", ex, extra={"event": "error", "exit_code": ex.exit_code})
                sys.exit(ex.exit_code)
            raise TriageClickError(ex) from ex
        except (click.ClickException, click.exceptions.Exit, click.Abort, KeyboardInterrupt):
            raise
        except Exception as ex:
            if os.environ.get("TRIAGE_RAISE_ERRORS"):
                raise
            log.exception("unexpected failure", extra={"event": "crash"})
            raise click.ClickException(f"unexpected failure: {type(ex).__name__}: {ex}") from ex

    return wrapper  # type: ignore[return-value]


def load_settings() -> Settings:
    try:
        return Settings()
    except ValidationError as ex:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])).upper()}: {e['msg']}" for e in ex.errors())
        raise ConfigError(f"bad environment setting: {problems}") from ex


def _config(settings: Settings, path: Path | None) -> TriageConfig:
    return load_config(path or settings.triage_config)


def parse_shard(value: str | None, settings: Settings) -> Shard:
    if value:
        try:
            index_text, count_text = value.split("/")
            index, count = int(index_text), int(count_text)
        except ValueError as ex:
            raise click.BadParameter("expected I/N, for example 0/4", param_hint="--shard") from ex
        if count < 1 or not 0 <= index < count:
            raise click.BadParameter(f"shard index must be in 0..{count - 1}", param_hint="--shard")
        return Shard(index, count)
    if settings.job_completion_index is None:
        return Shard()
    shard_count = settings.triage_shard_count
    if shard_count is None:
        raise ConfigError(
            "JOB_COMPLETION_INDEX is set but TRIAGE_SHARD_COUNT is not: set it to the Job's completions"
        )
    if settings.job_completion_index >= shard_count:
        raise ConfigError(
            f"JOB_COMPLETION_INDEX {settings.job_completion_index} >= TRIAGE_SHARD_COUNT {shard_count}"
        )
    return Shard(settings.job_completion_index, shard_count)


def finish(result: RunResult, report: bool, report_file: Path | None) -> None:
    """Print the summary to the log, the report where asked, and exit with the run's code."""
    for line in summary_lines(result):
        log.info("summary: %s", line, extra={"event": "summary"})
    if report or report_file:
        text = render_report(result)
        if report:
            click.echo(text, nl=False)
        if report_file:
            report_file.write_text(text, encoding="utf-8")
            log.info("report written to %s", report_file, extra={"event": "report_file"})
    sys.exit(result.exit_code)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="triage")
def cli() -> None:
    """Tell the owners of an LLM agent why its answers got a thumbs-down.

    Reads thumbs-down votes and their traces (Langfuse, or the embedded store when no Langfuse
    keys are set), searches the index again, asks a judge for facts, maps them to a layer
    (retrieval, generation, tool_routing, content gap, ...) and an owner, and reports.

    Start with `triage demo`. Exit codes: 0 done, 1 runtime failure, 2 usage, 3 configuration or
    authentication, 4 degraded (some traces undecided), 5 scores not confirmed as written.
    """
    logs.current_format = "text"  # until a command configures its logging


report_options = [
    click.option("--report", is_flag=True, help="Print the Markdown report to standard output."),
    click.option(
        "--report-file",
        type=click.Path(dir_okay=False, writable=True, path_type=Path),
        help="Also write the Markdown report to this file.",
    ),
]


def _with(options: list[Callable[[F], F]]) -> Callable[[F], F]:
    def apply(func: F) -> F:
        for option in reversed(options):
            func = option(func)
        return func

    return apply


@cli.command()
@click.option(
    "--since-hours",
    type=click.FloatRange(min=0, min_open=True),
    default=24.0,
    show_default=True,
    help="Window length; it ends 15 minutes before now (data lag) and reaches back a configured overlap.",
)
@click.option("--write", is_flag=True, help="Write triage_layer and triage_component scores on the traces.")
@_with(report_options)
@click.option(
    "--concurrency", type=click.IntRange(1, 256), default=8, show_default=True, help="Traces judged at once."
)
@click.option("--force", is_flag=True, help="Triage again traces already scored under this rule version.")
@click.option(
    "--judge",
    "judge_spec",
    metavar="heuristic|llm|cascade|replay:FILE",
    help="Default: llm when TRIAGE_JUDGE_MODEL is set, else heuristic (offline, no model).",
)
@click.option(
    "--shard",
    metavar="I/N",
    help="Take only shard I of N (stable hash of the trace). Default from JOB_COMPLETION_INDEX and TRIAGE_SHARD_COUNT.",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    help="Log line format on stderr. Default: TRIAGE_LOG_FORMAT.",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Configuration file (TOML). Default: TRIAGE_CONFIG, else the built-in Kubeflow defaults.",
)
@click.option(
    "--facts-file",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    help="Append each trace's facts as JSONL (replay them with --judge replay:FILE). Default: TRIAGE_FACTS_FILE.",
)
@handle_errors
def feedback(
    since_hours: float,
    write: bool,
    report: bool,
    report_file: Path | None,
    concurrency: int,
    force: bool,
    judge_spec: str | None,
    shard: str | None,
    log_format: str | None,
    config_path: Path | None,
    facts_file: Path | None,
) -> None:
    """Triage every thumbs-down vote in the window (the nightly job)."""
    settings = load_settings()
    logs.configure(log_format or settings.triage_log_format, settings.secrets())
    from triage.compose import feedback as run

    options = RunOptions(
        since_hours=since_hours,
        write=write,
        force=force,
        concurrency=concurrency,
        shard=parse_shard(shard, settings),
        facts_file=facts_file or settings.triage_facts_file,
    )
    result = run(settings, _config(settings, config_path), options, judge_spec)
    finish(result, report, report_file)


@cli.command()
@_with(report_options[1:])
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


@cli.command(name="import")
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


@cli.group()
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
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Configuration file.",
)
@handle_errors
def serve(host: str, port: int, stdio: bool, folders: tuple[str, ...], config_path: Path | None) -> None:
    """Serve the index as an MCP server with the docs agent's search tools (HTTP at /mcp, or stdio)."""
    settings = load_settings()
    config = _config(settings, config_path)
    from triage.search.index import Index
    from triage.search.mcp_server import serve as run_server

    logs.configure(settings.triage_log_format)
    built = Index.from_folders(_folders(folders, config))
    where = "stdio" if stdio else f"http://{host}:{port}/mcp"
    log.info("serving %d chunks in %s on %s", built.size, ", ".join(built.collections), where)
    run_server(built, config.tools, host=host, port=port, stdio=stdio)


def main() -> None:
    cli()
