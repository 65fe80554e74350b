"""The command line: parse the options, call one method of the application (`triage.app.Triage`),
render its result (`triage.sinks`), exit with its code.

The commands, grouped by what they do: `nightly` (feedback, demo, import), `review` (calibrate,
eval, queue, promote, votes: people and the verdicts), `servers` (index serve, relay); `options`
holds what they share (the options said once, opening the application, printing, errors to exit codes).
Exit codes are `triage.errors.ExitCode` (the CronJob's contract, documented in the README).
"""

from __future__ import annotations

import click

from triage import __version__, redact
from triage.cli.nightly import demo, feedback, import_
from triage.cli.review import calibrate, eval_, promote, queue, votes
from triage.cli.servers import index, relay
from triage.errors import ExitCode

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


for command in (feedback, demo, import_, index, calibrate, eval_, queue, promote, votes, relay):
    cli.add_command(command)


def main() -> None:
    cli()
