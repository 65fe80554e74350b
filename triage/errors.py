"""Errors raised by triage.

    TriageError
    ├── ConfigError          bad or missing configuration, refused credentials  (exit 3)
    ├── InputError           a file or record that cannot be read               (exit 1)
    └── SourceError          an outside system failed                           (exit 1)
        ├── LangfuseError    the Langfuse API
        ├── SearchError      the MCP search server or the embedded index
        └── JudgeError       the LLM judge
            └── JudgeRejected  the judge answered, but its output failed verification

`SearchError` and `JudgeError` raised for one trace leave that trace undecided (the run is
degraded); raised before any trace is read they end the run.
"""

from __future__ import annotations


class TriageError(Exception):
    """Base class for every error triage raises on purpose."""

    exit_code = 1


class ConfigError(TriageError):
    """Configuration is missing or wrong, or credentials were refused."""

    exit_code = 3


class InputError(TriageError):
    """An input file or record cannot be read."""


class SourceError(TriageError):
    """An outside system failed."""


class LangfuseError(SourceError):
    """The Langfuse API failed or answered something unusable."""


class SearchError(SourceError):
    """The search server (MCP) or the embedded index failed."""


class JudgeError(SourceError):
    """The LLM judge could not be reached or kept failing."""


class JudgeRejected(JudgeError):
    """The judge answered, but its output failed verification."""


def leaves(error: BaseException) -> list[BaseException]:
    """The plain exceptions inside (possibly nested) exception groups, in order; `[error]` otherwise."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in leaves(inner)]
    return [error]
