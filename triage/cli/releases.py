"""The end of the loop: `triage releases` (each release against the one before it, and the gate) and
`triage issues sync` (one GitHub issue per failure signature, kept in step)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import click

from triage.app import ReleasesOptions
from triage.cli.options import (
    FiniteFloatRange,
    app_options,
    emit,
    format_option,
    open_app,
    output_option,
    window_option,
)
from triage.domain.releases import ALPHA, ReleaseWindow
from triage.sinks.issues import render_sync
from triage.sinks.report import RELEASES_FORMATS
from triage.tracker import SyncOptions

HELP = """Each release of the agent in the window, against the one before it: answers, votes, the
thumbs-down rate with its interval, the layers and signatures of its failures, and whether its
thumbs-down rate, or one layer's, is higher beyond chance (one-sided Fisher exact tests, Holm over
the layers), naming the owners of the layers that grew.

With --candidate R --baseline R0, a release gate: exit 7 when R is worse than R0 beyond chance.

Reads Langfuse (its metrics API for the answers per release, else the traces paged) or the
embedded store; votes and verdicts are the job's scores. With neither Langfuse keys nor an
embedded store: the bundled demo's two releases.

Small counts flag only large rises. Measured on a seeded simulation (bench/releases.py: retrieval
failures rising from 3% to 8% of answers): flagged about 1 night in 8 at 400 answers a release,
1 in 3 at 1,000, half at 1,500, nearly always at 5,000; with no rise, a release is flagged on
about 2.5% of nights (at most --alpha). A gate that passes on a few hundred answers says "no large
rise", not "no rise".
"""


def _release(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not value.strip():
        raise click.BadParameter("a release needs a name")
    return value.strip() if value is not None else None


@click.command(help=HELP)
@window_option(24.0 * 7, "Answers started in this window (up to 15 minutes before now, the data lag).")
@click.option("--candidate", metavar="RELEASE", callback=_release, help="The gate: the release to check.")
@click.option("--baseline", metavar="RELEASE", callback=_release, help="The gate: the release to check against.")
@click.option(
    "--alpha",
    type=FiniteFloatRange(0, 1, min_open=True, max_open=True),
    default=ALPHA,
    show_default=True,
    help="The level: the chance of flagging a release pair that did not get worse.",
)
@click.option(
    "--per",
    type=click.Choice(["answers", "votes"]),
    default="answers",
    show_default=True,
    help="Rates over every answer, or over the voted answers only (when how often users vote changed).",
)
@format_option(RELEASES_FORMATS)
@output_option()
@app_options("Configuration file (TOML): score names, owners. Default: TRIAGE_CONFIG, else the built-in defaults.")
def releases(
    since_hours: float,
    candidate: str | None,
    baseline: str | None,
    alpha: float,
    per: str,
    render: Callable[[ReleaseWindow], str],
    output: Path | None,
    config_path: Path | None,
    log_format: str | None,
) -> None:
    if (candidate is None) != (baseline is None):
        raise click.UsageError("the gate needs both --candidate and --baseline")
    app = open_app(log_format, config_path)
    options = ReleasesOptions(
        since_hours=since_hours,
        candidate=candidate,
        baseline=baseline,
        alpha=alpha,
        per="votes" if per == "votes" else "answers",
    )
    shown = app.releases(options)
    emit(render(shown), output)
    sys.exit(shown.exit_code)


SYNC_HELP = """Open, update and close one GitHub issue per failure signature in its owner's repository.

Reads each signature's newest state (the nightly job writes one per signature seen; `triage check
--release R` marks those whose cases all passed as fixed in R). A signature qualifies for an issue
at [tracker] min_count failures, min_share of a night's, or when escalating; it is opened only when
its verdict is trusted (a sure verdict, a reviewer's confirmation, or a judge whose last `triage
calibrate --write` kappa lower bound reaches [tracker] min_kappa) and its owner is in [tracker]
allow; else it stays a draft, listed here. An open issue gets a comment when the signature recurs,
escalates or regresses; it is closed with the release and the check run that showed it fixed, and
reopened when it comes back. Issues and comments carry markers: a rerun never doubles one.

A dry run by default (the plan, nothing written); --apply writes, with GITHUB_TOKEN (or
TRIAGE_GITHUB_TOKEN). Exit 5 when a write did not land (a rerun finishes it).
"""


@click.group()
def issues() -> None:
    """The owners' issue trackers (GitHub)."""


@issues.command(help=SYNC_HELP)
@click.option("--apply", "apply_", is_flag=True, help="Write to GitHub (default: print the plan, write nothing).")
@output_option("Write the plan (or what was done) to this file instead of standard output.")
@app_options("Configuration file (its [tracker] table: owners allowed, repositories, labels, thresholds).")
def sync(apply_: bool, output: Path | None, config_path: Path | None, log_format: str | None) -> None:
    app = open_app(log_format, config_path)
    result = app.issues_sync(SyncOptions(now=datetime.now(UTC), apply=apply_))
    emit(render_sync(result), output)
    sys.exit(result.exit_code)
