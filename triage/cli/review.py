"""People and the verdicts: `triage calibrate` and `triage eval` (agreement with people's labels),
`triage queue` (verdicts to label), `triage promote` (reviewed failures become regression cases),
`triage votes` (the review view)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import click

from triage import judges
from triage.calibration.calibrate import CalibrateOptions
from triage.calibration.evaluate import EvalOptions, EvalSet
from triage.calibration.queue import QueueOptions, VotesOptions
from triage.cli.options import (
    FiniteFloatRange,
    app_options,
    concurrency_option,
    config_option,
    emit,
    file_option,
    format_option,
    handle_errors,
    log_format_option,
    open_app,
    output_option,
    window_option,
)
from triage.domain.records import Layer
from triage.domain.review import CalibrationReport, EvalReport
from triage.domain.votes import FILTERS, ConversationList
from triage.domain.worklist import PromoteResult
from triage.regression import PromoteOptions
from triage.sinks.exports import PROMOTE_FORMATS, VOTES_FORMATS, text_lines
from triage.sinks.report import CALIBRATION_FORMATS, EVAL_FORMATS


@click.command()
@click.option(
    "--labels-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="People's labels as JSONL. Default: the label scores in the store (Langfuse annotations, verdicts).",
)
@click.option(
    "--facts-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The job's decisions from a run's facts file. Default: its triage_layer scores in the store.",
)
@window_option(24.0 * 30, "Labels from this window; decisions from 30 days further back.")
@click.option(
    "--min-kappa",
    type=FiniteFloatRange(-1, 1),
    help="Trust gate: exit 6 when the layer kappa's 95% lower bound is below this (or undefined).",
)
@click.option(
    "--write",
    is_flag=True,
    help="Record each judge's layer agreement (kappa, interval, labels, when) where the nightly report "
    "reads it: the dataset triage-calibrations in Langfuse or the embedded store.",
)
@format_option(CALIBRATION_FORMATS)
@output_option()
@app_options(
    "Configuration file (TOML): score names, [calibration]. Default: TRIAGE_CONFIG, else the built-in defaults."
)
def calibrate(
    labels_file: Path | None,
    facts_file: Path | None,
    since_hours: float,
    min_kappa: float | None,
    write: bool,
    render: Callable[[CalibrationReport], str],
    output: Path | None,
    config_path: Path | None,
    log_format: str | None,
) -> None:
    """Compare the job's verdicts with people's labels: agreement, kappa, confusion, disagreements."""
    app = open_app(log_format, config_path)
    options = CalibrateOptions(
        since_hours=since_hours, labels_file=labels_file, facts_file=facts_file, min_kappa=min_kappa, write=write
    )
    report = app.calibrate(options)
    emit(render(report), output)
    sys.exit(report.exit_code)


@click.command(name="eval", epilog=judges.JUDGES.epilog())
@click.argument("set_dir", metavar="SET_DIR", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--judge",
    "judges",
    multiple=True,
    metavar="[LABEL=]JUDGE",
    help="A judge to run (repeat for several), optionally named (llm-perfect=llm); replay without a FILE "
    "replays the labels' own facts. Default: heuristic and replay.",
)
@click.option("--split", help="Only the labels of this split (for example dev or test). Default: each, and all.")
@concurrency_option("Traces judged at once (as many more are searched meanwhile).", default=8)
@format_option(EVAL_FORMATS)
@output_option()
@click.option(
    "--keep",
    type=click.Path(file_okay=False, path_type=Path),
    help="Keep each judge's store, facts file, summary and log in this folder.",
)
@app_options("Configuration file. Default: the set's triage.toml, else TRIAGE_CONFIG, else the built-in defaults.")
def eval_(
    set_dir: Path,
    judges: tuple[str, ...],
    split: str | None,
    concurrency: int,
    render: Callable[[EvalReport], str],
    output: Path | None,
    keep: Path | None,
    config_path: Path | None,
    log_format: str | None,
) -> None:
    """Measure judges on a labelled set: layer accuracy, kappa, per-fact, component and owner accuracy."""
    eval_set = EvalSet(set_dir)
    app = open_app(log_format, config_path or eval_set.config)
    options = EvalOptions(judges=judges or EvalOptions.judges, split=split, concurrency=concurrency, keep=keep)
    report = app.eval(eval_set, options)
    emit(render(report), output)
    sys.exit(report.exit_code)


@click.command()
@window_option(24.0, "Window of verdicts (by their trace's start), drawn as `triage feedback` draws its window.")
@click.option(
    "--per-layer",
    type=click.IntRange(0, 10_000),
    default=10,
    show_default=True,
    help="Traces sampled per layer (stable hash order; traces already queued count toward it).",
)
@click.option("--dry-run", is_flag=True, help="Show what would be created and queued; write nothing.")
@log_format_option
@config_option("Configuration file (TOML). Default: TRIAGE_CONFIG, else the built-in Kubeflow defaults.")
@handle_errors
def queue(
    since_hours: float, per_layer: int, dry_run: bool, log_format: str | None, config_path: Path | None
) -> None:
    """Queue a sample of triaged traces for human review in a Langfuse annotation queue.

    Per layer a stable sample, plus every low-confidence and injection-flagged verdict; creates the
    score configs and the queue when missing; never queues a trace twice and never pre-fills a verdict.
    Needs Langfuse (the embedded store has no annotation queues).
    """
    app = open_app(log_format, config_path)
    result = app.queue(QueueOptions(since_hours=since_hours, per_layer=per_layer, dry_run=dry_run))
    emit(text_lines(result.lines()))


@click.command()
@click.option(
    "--dataset", default="triage-regressions", show_default=True, help="The dataset to upsert the cases into."
)
@click.option("--trace", "traces", multiple=True, metavar="ID", help="Promote this trace (repeatable).")
@click.option(
    "--signature",
    "signatures",
    multiple=True,
    metavar="ID",
    help="Promote the traces of this failure signature (repeatable).",
)
@click.option(
    "--layer",
    "layers",
    multiple=True,
    type=click.Choice([layer.value for layer in Layer]),
    help="Promote the traces triaged to this layer (repeatable).",
)
@click.option(
    "--corrections/--no-corrections",
    default=True,
    show_default=True,
    help="Also promote every reviewer's negative verdict that has a corrected answer or expected tool behaviour.",
)
@window_option(24.0 * 30, "Reviewers' scores of this window; the job's triage scores from 30 days further back.")
@file_option(
    "--jsonl", "Upsert the cases into this JSONL file instead of the dataset (Langfuse or the embedded store)."
)
@click.option("--dry-run", is_flag=True, help="Say what would be created or updated; write nothing.")
@format_option(PROMOTE_FORMATS)
@app_options("Configuration file (TOML): score names, tools. Default: TRIAGE_CONFIG, else the built-in defaults.")
def promote(
    dataset: str,
    traces: tuple[str, ...],
    signatures: tuple[str, ...],
    layers: tuple[str, ...],
    corrections: bool,
    since_hours: float,
    jsonl: Path | None,
    dry_run: bool,
    render: Callable[[PromoteResult], str],
    config_path: Path | None,
    log_format: str | None,
) -> None:
    """Turn reviewers' corrections and selected failures into dataset items, upserted by a stable id."""
    app = open_app(log_format, config_path)
    if not dataset.strip():
        raise click.BadParameter("the dataset needs a name", param_hint="--dataset")
    options = PromoteOptions(
        dataset=dataset, traces=traces, signatures=signatures, layers=layers, corrections=corrections,
        since_hours=since_hours, dry_run=dry_run,
    )  # fmt: skip
    result = app.promote(options, jsonl)
    emit(render(result))
    sys.exit(result.exit_code)


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
@window_option(24.0 * 7, "Conversations with a trace started or a vote cast in this window (up to now).")
@format_option(VOTES_FORMATS)
@output_option("Write to this file instead of standard output.")
@app_options("Configuration file (TOML): the vote score's name. Default: TRIAGE_CONFIG, else the built-in defaults.")
def votes(
    filter_: str, since_hours: float, render: Callable[[ConversationList], str], output: Path | None,
    config_path: Path | None, log_format: str | None,
) -> None:  # fmt: skip
    """List conversations with their votes (up, down, with notes, traces), filtered by feedback."""
    app = open_app(log_format, config_path)
    emit(render(app.votes(VotesOptions(since_hours=since_hours, filter=filter_))), output)
