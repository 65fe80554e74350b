"""The owners' trackers: `triage issues sync` (one GitHub issue per failure signature, kept in step)."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path

import click

from triage.cli.options import app_options, emit, open_app, output_option
from triage.sinks.issues import render_sync
from triage.tracker import SyncOptions

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
