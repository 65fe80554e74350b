"""What every command shares: error handling and exit codes, settings, config, the report's end."""

from __future__ import annotations

import ctypes
import json
import logging
import os
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click
from pydantic import ValidationError

from triage import logs
from triage.config import load_config
from triage.domain.config import TriageConfig
from triage.domain.outcome import RunResult, Shard
from triage.errors import ConfigError, ExitCode, TriageError
from triage.redact import redact
from triage.settings import Settings
from triage.sinks.issues import DEFAULT_MIN_SIZE, write_issue_drafts
from triage.sinks.report import render_report
from triage.sinks.summary import summary_lines, summary_record

log = logging.getLogger("triage")
F = TypeVar("F", bound=Callable[..., Any])

#: glibc's M_MMAP_THRESHOLD (mallopt), and the value triage fixes it at
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 128 * 1024


def limit_heap_fragmentation() -> None:
    """Keep glibc's mmap threshold at 128 KiB for the process (Linux with glibc; a no-op elsewhere).

    glibc raises the threshold to the size of the largest mmapped block freed, up to 32 MiB. After
    the first page of observations (about 1.4 MB of JSON) is freed, every block below that size
    comes from the heap, between long-lived objects, and the holes it leaves are not given back:
    RSS grew about 3-4 MB per 1,000 traces with the bytes in use flat (bench/README.md, "Memory").
    A fixed threshold turns off that adjustment. `MALLOC_MMAP_THRESHOLD_` set by the user wins.
    """
    if not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # pragma: no cover - not glibc (musl has it as a no-op)
        return
    mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)


class TriageClickError(click.ClickException):
    """A `TriageError` shown as `Error: ...`, with the error's own exit code."""

    def __init__(self, error: TriageError) -> None:
        super().__init__(redact(str(error)))
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
                log.error("%s", redact(str(ex)), extra={"event": "error", "exit_code": ex.exit_code})
                sys.exit(ex.exit_code)
            raise TriageClickError(ex) from ex
        except (click.ClickException, click.exceptions.Exit, click.Abort, KeyboardInterrupt):
            raise
        except Exception as ex:
            if _raise_errors():
                raise
            log.exception("unexpected failure", extra={"event": "crash"})
            if logs.current_format == "json":
                message = redact(f"unexpected failure: {type(ex).__name__}: {ex}")
                log.error("%s", message, extra={"event": "error", "exit_code": int(ExitCode.ERROR)})
                sys.exit(ExitCode.ERROR)
            raise click.ClickException(redact(f"unexpected failure: {type(ex).__name__}: {ex}")) from ex

    return wrapper  # type: ignore[return-value]


def _raise_errors() -> bool:
    """TRIAGE_RAISE_ERRORS: let a crash raise (tests, debugging) instead of a one-line message."""
    try:
        return Settings().triage_raise_errors
    except ValidationError:
        return False


def load_settings() -> Settings:
    try:
        return Settings()
    except ValidationError as ex:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])).upper()}: {e['msg']}" for e in ex.errors())
        raise ConfigError(f"bad environment setting: {problems}") from ex


def config_for(settings: Settings, path: Path | None) -> TriageConfig:
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


def writable_file(path: Path | None, option: str) -> Path | None:
    """Checked before the run, so a report is never lost after the scores are written."""
    if path is not None and not path.parent.is_dir():
        raise click.BadParameter(f"the folder {path.parent} does not exist", param_hint=option)
    return path


def finish(
    result: RunResult,
    report: bool,
    report_file: Path | None,
    summary_file: Path | None = None,
    issues_dir: Path | None = None,
    issue_min_size: int = DEFAULT_MIN_SIZE,
) -> None:
    """Print the summary to the log, the report where asked, and exit with the run's code."""
    for line in summary_lines(result):
        log.info("summary: %s", line, extra={"event": "summary"})
    if issues_dir:
        drafts = write_issue_drafts(result, issues_dir, issue_min_size)
        log.info("%d issue drafts written to %s", len(drafts), issues_dir, extra={"event": "issue_drafts"})
    if summary_file:
        summary_file.write_text(json.dumps(summary_record(result), indent=2) + "\n", encoding="utf-8")
    if report or report_file:
        text = render_report(result)
        if report:
            click.echo(text, nl=False)
        if report_file:
            report_file.write_text(text, encoding="utf-8")
            log.info("report written to %s", report_file, extra={"event": "report_file"})
    sys.exit(result.exit_code)


def writable_folder(path: Path | None, option: str) -> Path | None:
    """A folder that exists or can be made in an existing one; checked before the run."""
    if path is not None and not (path.is_dir() or (path.parent.is_dir() and not path.exists())):
        raise click.BadParameter(f"{path} is not a folder, and cannot be made in an existing one", param_hint=option)
    return path


def config_option(help: str = "Configuration file.") -> Callable[[F], F]:
    """`--config FILE` (into `config_path`): the TOML file `config_for` reads; each command says
    which of its tables it uses."""
    return click.option(
        "--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path), help=help
    )


def output_option(help: str = "Write the report to this file instead of standard output.") -> Callable[[F], F]:
    """`--output FILE`, checked before the command runs: a folder that is missing fails at once,
    not after the work is done."""
    return click.option(
        "--output",
        type=click.Path(dir_okay=False, writable=True, path_type=Path),
        callback=lambda ctx, param, value: writable_file(value, "--output"),
        help=help,
    )


def format_option(*choices: str) -> Callable[[F], F]:
    """`--format` (into `fmt`), the first choice the default."""
    return click.option("--format", "fmt", type=click.Choice(list(choices)), default=choices[0], show_default=True)


report_options = [
    click.option("--report", is_flag=True, help="Print the Markdown report to standard output."),
    click.option(
        "--report-file",
        type=click.Path(dir_okay=False, writable=True, path_type=Path),
        callback=lambda ctx, param, value: writable_file(value, "--report-file"),
        help="Also write the Markdown report to this file.",
    ),
]


def with_options(options: list[Callable[[F], F]]) -> Callable[[F], F]:
    def apply(func: F) -> F:
        for option in reversed(options):
            func = option(func)
        return func

    return apply
