"""Errors raised by triage, and the exit codes they (and a run's outcome) map to.

    TriageError
    ├── ConfigError          bad or missing configuration, refused credentials  (exit 3)
    ├── InputError           a file or record that cannot be read               (exit 1)
    └── SourceError          an outside system failed                           (exit 1)
        ├── LangfuseError    the Langfuse API
        ├── SearchError      the MCP search server or the embedded index
        │   └── SearchSuspended  not asked: its collection's backend keeps failing alike
        └── JudgeError       the LLM judge
            └── JudgeRejected  the judge answered, but its output failed verification

`SearchError` and `JudgeError` raised for one trace leave that trace undecided (the run is
degraded); raised before any trace is read they end the run.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """The process's exit codes: the CronJob's contract, documented in docs/operations.md."""

    #: done; bad-input traces and session votes whose turn has not arrived are listed, not errors
    OK = 0
    #: a runtime failure, or an internal error on some trace (listed; the others still ran)
    ERROR = 1
    #: bad command-line usage (click's own code)
    USAGE = 2
    #: configuration missing or wrong, or credentials refused
    CONFIG = 3
    #: degraded: some traces undecided (search or judge unavailable, judge output rejected, SIGTERM)
    DEGRADED = 4
    #: some scores not confirmed as written (takes precedence over DEGRADED)
    NOT_WRITTEN = 5
    #: `triage calibrate --min-kappa K`: the layer kappa's lower bound is below K (or undefined)
    BELOW_GATE = 6
    #: a release pipeline's gate: `triage check` (a case that passed in the previous run fails now, or
    #: the pass rate is under --min-pass) or `triage releases --candidate` (worse than the baseline
    #: beyond chance)
    REGRESSED = 7
    #: `triage check`: too many cases left unchecked (agent errors, undecided, stopped) for the run to
    #: say the release holds, or a case that passed before is now unchecked (`CheckResult.exit_code`)
    UNCHECKED = 8

    @property
    def label(self) -> str:
        """A few words for `triage --help`."""
        return _LABELS[self]


_LABELS = {
    ExitCode.OK: "done",
    ExitCode.ERROR: "runtime failure",
    ExitCode.USAGE: "usage",
    ExitCode.CONFIG: "configuration or authentication",
    ExitCode.DEGRADED: "degraded (some traces undecided)",
    ExitCode.NOT_WRITTEN: "scores not confirmed as written",
    ExitCode.BELOW_GATE: "calibrate: agreement below --min-kappa",
    ExitCode.REGRESSED: "check or release gate: worse than before",
    ExitCode.UNCHECKED: "check: too many cases unchecked",
}


class TriageError(Exception):
    """Base class for every error triage raises on purpose."""

    exit_code: ExitCode = ExitCode.ERROR


class ConfigError(TriageError):
    """Configuration is missing or wrong, or credentials were refused."""

    exit_code = ExitCode.CONFIG


class InputError(TriageError):
    """An input file or record cannot be read."""


class UsageError(TriageError):
    """The command was asked for something that does not fit what it was given (exit 2, as click's)."""

    exit_code = ExitCode.USAGE


class SourceError(TriageError):
    """An outside system failed."""


class LangfuseError(SourceError):
    """The Langfuse API failed or answered something unusable."""


class SearchError(SourceError):
    """The search server (MCP) or the embedded index failed."""


class SearchSuspended(SearchError):
    """A search not made: its collection's backend failed the same way several times in a row, so
    the searcher stops asking it for a while (`triage.search.mcp_client`)."""

    def __init__(self, collection: str, reason: str) -> None:
        super().__init__(reason)
        self.collection = collection


class JudgeError(SourceError):
    """The LLM judge could not be reached or kept failing."""


class JudgeRejected(JudgeError):
    """The judge answered, but its output failed verification."""


def leaves(error: BaseException) -> list[BaseException]:
    """The plain exceptions inside (possibly nested) exception groups, in order; `[error]` otherwise."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in leaves(inner)]
    return [error]
