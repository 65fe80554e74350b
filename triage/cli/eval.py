"""`triage eval`: every judge named, through the real `triage feedback`, against a labelled set."""

from __future__ import annotations

import sys
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
from triage.errors import ExitCode


@click.command(name="eval")
@click.argument("set_dir", metavar="SET_DIR", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--judge",
    "judges",
    multiple=True,
    metavar="[LABEL=]heuristic|llm|cascade|replay|replay:FILE",
    help="A judge to run (repeat for several), optionally named (llm-perfect=llm). Default: heuristic and replay.",
)
@click.option("--split", help="Only the labels of this split (for example dev or test). Default: each, and all.")
@click.option("--concurrency", type=click.IntRange(1, 256), default=8, show_default=True, help="Traces judged at once.")
@format_option("markdown", "json")
@output_option()
@click.option(
    "--keep",
    type=click.Path(file_okay=False, path_type=Path),
    help="Keep each judge's store, facts file, summary and log in this folder.",
)
@config_option("Configuration file. Default: the set's triage.toml, else TRIAGE_CONFIG, else the built-in defaults.")
@handle_errors
def eval_(
    set_dir: Path,
    judges: tuple[str, ...],
    split: str | None,
    concurrency: int,
    fmt: str,
    output: Path | None,
    keep: Path | None,
    config_path: Path | None,
) -> None:
    """Measure judges on a labelled set: layer accuracy, kappa, per-fact, component and owner accuracy."""
    settings = load_settings()
    logs.configure(settings.triage_log_format, settings.secrets())
    from triage.calibration.evaluate import EvalOptions, EvalSet, evaluate
    from triage.sinks.calibration import eval_json, render_eval

    eval_set = EvalSet(set_dir)
    config = config_for(settings, config_path or eval_set.config)
    options = EvalOptions(judges=judges or ("heuristic", "replay"), split=split, concurrency=concurrency, keep=keep)
    report = evaluate(eval_set, config, options, settings.child_environment())
    text = eval_json(report) if fmt == "json" else render_eval(report)
    if output is None:
        click.echo(text, nl=False)
    else:
        output.write_text(text, encoding="utf-8")
    if any(run.error for run in report.runs):
        sys.exit(ExitCode.ERROR)
