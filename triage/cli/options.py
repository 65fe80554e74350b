"""What every command shares: the options said once (the window, the output file, the format, the
log format, the configuration file), opening the application, printing, and errors to exit codes."""

from __future__ import annotations

import ctypes
import logging
import math
import os
import sys
from collections.abc import Callable, Mapping
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click
from pydantic import ValidationError

from triage import redact
from triage.app import Triage
from triage.domain.kernel import since_hours_problem
from triage.domain.outcome import Shard
from triage.errors import ExitCode, TriageError
from triage.settings import Settings, load_config, load_settings

log = logging.getLogger("triage")
F = TypeVar("F", bound=Callable[..., Any])

# -- errors and exit codes ---------------------------------------------------------------------


class TriageClickError(click.ClickException):
    """A `TriageError` shown as `Error: ...`, with the error's own exit code."""

    def __init__(self, error: TriageError) -> None:
        super().__init__(redact.redact(str(error)))
        self.exit_code = error.exit_code  # type: ignore[misc]  # click's class default is 1


def handle_errors(func: F) -> F:
    """Turn `TriageError` into a clean message and exit code; crashes too, unless TRIAGE_RAISE_ERRORS is set."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except TriageError as ex:
            if redact.current_format == "json":
                # a log collector reads stderr as JSON lines: the fatal error is one too
                log.error("%s", redact.redact(str(ex)), extra={"event": "error", "exit_code": ex.exit_code})
                sys.exit(ex.exit_code)
            raise TriageClickError(ex) from ex
        except (click.ClickException, click.exceptions.Exit, click.Abort, KeyboardInterrupt):
            raise
        except Exception as ex:
            if _raise_errors():
                raise
            log.exception("unexpected failure", extra={"event": "crash"})
            message = redact.redact(f"unexpected failure: {type(ex).__name__}: {ex}")
            if redact.current_format == "json":
                log.error("%s", message, extra={"event": "error", "exit_code": int(ExitCode.ERROR)})
                sys.exit(ExitCode.ERROR)
            raise click.ClickException(message) from ex

    return wrapper  # type: ignore[return-value]


def _raise_errors() -> bool:
    """TRIAGE_RAISE_ERRORS: let a crash raise (tests, debugging) instead of a one-line message."""
    try:
        return Settings().triage_raise_errors
    except ValidationError:
        return False


# -- the application, and where output goes ----------------------------------------------------


def open_app(log_format: str | None, config_path: Path | None = None, *, built_in_config: bool = False) -> Triage:
    """The settings, the job log configured (`--log-format`, else TRIAGE_LOG_FORMAT; secrets
    redacted), then the configuration: the application a command calls once."""
    settings = load_settings()  # first: a bad setting is exit 3 before anything is read
    redact.configure_logging(log_format or settings.triage_log_format, settings.secrets())
    path = None if built_in_config else config_path or settings.triage_config
    return Triage(settings, load_config(path))


def emit(text: str, output: Path | None = None) -> None:
    """A command's rendered result: to standard output, or to the `--output` file."""
    if output is None:
        click.echo(text, nl=False)
    else:
        output.write_text(text, encoding="utf-8", newline="")


# -- options said once -------------------------------------------------------------------------


def _window(ctx: click.Context, param: click.Parameter, value: float) -> float:
    problem = since_hours_problem(value)
    if problem:
        raise click.BadParameter(problem)
    return value


def window_option(default: float, help: str) -> Callable[[F], F]:
    """`--since-hours`: the window's length, checked once (`kernel.since_hours_problem`: no NaN,
    more than 0, at most a year)."""
    return click.option(
        "--since-hours", type=float, default=default, show_default=True, callback=_window, help=help
    )


class FiniteFloatRange(click.FloatRange):
    """Every float option's type: `click.FloatRange` that refuses NaN and the infinities first.

    Click reads `nan` and `inf` as floats, and NaN passes every range check (each comparison is
    False), so `--min-pass nan` was a gate that never failed; an infinite `--timeout` a case never
    timed out. A usage error, exit 2, naming the option."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number (NaN and infinities are refused).", param, ctx)
        return super().convert(number, param, ctx)


def writable_file(path: Path | None, option: str) -> Path | None:
    """Checked before the run, so a report is never lost after the scores are written."""
    if path is not None and not path.parent.is_dir():
        raise click.BadParameter(f"the folder {path.parent} does not exist", param_hint=option)
    return path


def file_option(name: str, help: str, dest: str | None = None) -> Callable[[F], F]:
    """An output file (`--output`, `--report-file`, `--summary-file`, `--jsonl`), checked before the
    command runs: a folder that is missing fails at once, not after the work is done."""
    names = [name, dest] if dest else [name]
    return click.option(
        *names,
        type=click.Path(dir_okay=False, writable=True, path_type=Path),
        callback=lambda ctx, param, value: writable_file(value, name),
        help=help,
    )


def output_option(help: str = "Write the report to this file instead of standard output.") -> Callable[[F], F]:
    """`--output FILE`: where the rendered result goes instead of standard output."""
    return file_option("--output", help)


def writable_folder(path: Path | None, option: str) -> Path | None:
    """A folder that exists or can be made in an existing one; checked before the run."""
    if path is not None and not (path.is_dir() or (path.parent.is_dir() and not path.exists())):
        raise click.BadParameter(f"{path} is not a folder, and cannot be made in an existing one", param_hint=option)
    return path


def format_option(renderers: Mapping[str, Callable[[Any], str]]) -> Callable[[F], F]:
    """`--format`, one of the sink's renderers by name (the first the default), given to the
    command as `render`."""
    names = list(renderers)
    return click.option(
        "--format",
        "render",
        type=click.Choice(names),
        default=names[0],
        show_default=True,
        callback=lambda ctx, param, value: renderers[value],
    )


def log_format_option(func: F) -> F:
    """`--log-format`, on every command: the job log's lines on standard error, as text or JSON."""
    return click.option(
        "--log-format",
        type=click.Choice(["text", "json"]),
        help="Log line format on stderr. Default: TRIAGE_LOG_FORMAT.",
    )(func)


def config_option(help: str = "Configuration file.") -> Callable[[F], F]:
    """`--config FILE` (into `config_path`): the TOML file the application reads; each command says
    which of its tables it uses."""
    return click.option(
        "--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path), help=help
    )


def concurrency_option(help: str, default: int | None = None) -> Callable[[F], F]:
    """`--concurrency N`, 1 to 256: how much of the work runs at once. Without a default the
    command gets None, and the configuration decides."""
    given: dict[str, Any] = {} if default is None else {"default": default, "show_default": True}
    return click.option("--concurrency", type=click.IntRange(1, 256), help=help, **given)


def app_options(config_help: str) -> Callable[[F], F]:
    """What most commands end with: the two options `open_app` reads (`--config`, its help naming
    the tables the command uses; `--log-format`), then `handle_errors`."""

    def apply(func: F) -> F:
        return config_option(config_help)(log_format_option(handle_errors(func)))

    return apply


def _shard(ctx: click.Context, param: click.Parameter, value: str | None) -> Shard | None:
    if not value:
        return None
    try:
        index_text, count_text = value.split("/")
        index, count = int(index_text), int(count_text)
    except ValueError as ex:
        raise click.BadParameter("expected I/N, for example 0/4", param_hint="--shard") from ex
    if count < 1 or not 0 <= index < count:
        raise click.BadParameter(f"shard index must be in 0..{count - 1}", param_hint="--shard")
    return Shard(index, count)


def shard_option(func: F) -> F:
    """`--shard I/N` (into `shard`: a `Shard`, or None for the settings' own)."""
    return click.option(
        "--shard",
        metavar="I/N",
        callback=_shard,
        help="Take only shard I of N (stable hash of the trace). Default from JOB_COMPLETION_INDEX and "
        "TRIAGE_SHARD_COUNT.",
    )(func)


# -- the process -------------------------------------------------------------------------------

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
