"""Checking a fix before it ships: `triage check`."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path

import click

from triage import judges
from triage.check import CheckRequest
from triage.cli.options import FiniteFloatRange, app_options, concurrency_option, emit, file_option, open_app
from triage.sinks.report import check_json, render_check


def _not_empty(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not value.strip():
        raise click.BadParameter("must not be empty")
    return value


@click.command(epilog=judges.CHECK_JUDGES.epilog())
@click.option(
    "--dataset",
    callback=_not_empty,
    help="The dataset of regression cases (as `triage promote` writes them). Default: [check] dataset, "
    "else triage-regressions.",
)
@click.option(
    "--run-name",
    callback=_not_empty,
    help="The dataset run the results go to; a run of this name is resumed (its cases are not asked again). "
    "Default: check-<UTC time>.",
)
@click.option(
    "--judge",
    "judge_name",
    type=click.Choice(judges.CHECK_JUDGES.names()),
    metavar="JUDGE",
    help="The check judge. Default: llm when TRIAGE_JUDGE_MODEL is set, else offline (no model).",
)
@concurrency_option("Cases asked of the agent at once. Default: [check] concurrency (4).")
@click.option(
    "--timeout",
    type=FiniteFloatRange(min=0, min_open=True),
    help="Seconds one case may take with the agent, retries included. Default: [check] timeout_seconds (120).",
)
@click.option(
    "--min-pass",
    type=FiniteFloatRange(0, 1),
    help="Exit 7 when the share of passing cases is under this (0 to 1). Default: [check] min_pass (no gate).",
)
@click.option(
    "--max-unchecked",
    type=FiniteFloatRange(0, 1),
    help="Exit 8 when more than this share of the cases (0 to 1) is unchecked: agent errors and undecided "
    "cases. A case that passed before and is unchecked now exits 8 whatever the share. Default: "
    "[check] max_unchecked (0.1).",
)
@click.option(
    "--agent-url",
    help="The agent's URL, over [agent_endpoint] url: an OpenAI-compatible endpoint (.../v1) unless "
    '[agent_endpoint] says kind = "http".',
)
@click.option(
    "--agent-command",
    help="Check this local command instead (a shell-like line, run without a shell): the question on its "
    "standard input, its standard output the answer.",
)
@click.option(
    "--release",
    callback=_not_empty,
    help="The release the agent under check is: each failure signature whose cases all pass is recorded as "
    "fixed in it (`triage issues sync` closes its issue; it regresses if it comes back in this release or a "
    "later one).",
)
@file_option("--output", "Also write the results as JSON to this file.")
@app_options("Configuration file (TOML): [agent_endpoint], [check], tools. Default: TRIAGE_CONFIG, else built-in.")
def check(
    dataset: str | None,
    run_name: str | None,
    judge_name: str | None,
    concurrency: int | None,
    timeout: float | None,
    min_pass: float | None,
    max_unchecked: float | None,
    agent_url: str | None,
    agent_command: str | None,
    release: str | None,
    output: Path | None,
    config_path: Path | None,
    log_format: str | None,
) -> None:
    """Run the agent on its regression cases and say, per case, fixed, still failing or newly failing.

    Reads the dataset from Langfuse (when its keys are set) or the embedded store, asks the agent
    ([agent_endpoint], --agent-url or --agent-command) each case's question, judges each new answer
    against the case, writes the results as a dataset run and prints the Markdown report. With no
    Langfuse keys and no agent configured it checks the bundled demo with the demo agent.
    """
    if agent_url and agent_command:
        raise click.BadParameter("give the agent's URL or a command, not both", param_hint="--agent-command")
    app = open_app(log_format, config_path)
    request = CheckRequest(
        now=datetime.now(UTC),
        dataset=dataset,
        run_name=run_name,
        judge=judge_name,
        concurrency=concurrency,
        timeout=timeout,
        min_pass=min_pass,
        max_unchecked=max_unchecked,
        agent_url=agent_url,
        agent_command=agent_command,
        release=release,
    )
    result = app.check(request)
    if output is not None:
        output.write_text(check_json(result), encoding="utf-8")
    emit(render_check(result))
    sys.exit(result.exit_code)
