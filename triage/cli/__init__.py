"""The command line: parse options, build settings, call one core function, map errors to exit codes.

One module per command (group): `feedback`, `demo`, `store` (import), `index`, `calibrate`, `eval`,
`queue`, `promote`, `votes`, `relay`; `common` holds
what they share. Commands are glue only: the work is in the core they call.
Exit codes are `triage.errors.ExitCode` (the CronJob's contract, documented in the README).
"""

from __future__ import annotations

import click

from triage import __version__, logs
from triage.cli.calibrate import calibrate
from triage.cli.demo import demo
from triage.cli.eval import eval_
from triage.cli.feedback import feedback
from triage.cli.index import index
from triage.cli.promote import promote
from triage.cli.queue import queue
from triage.cli.relay import relay
from triage.cli.store import import_
from triage.cli.votes import votes
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
    logs.current_format = "text"  # until a command configures its logging


for command in (feedback, demo, import_, index, calibrate, eval_, queue, promote, votes, relay):
    cli.add_command(command)


def main() -> None:
    cli()
