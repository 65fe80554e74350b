"""Replaying recorded facts: classify again without any search or model call.

A facts file is JSONL, one object per trace:

    {"trace_id": "t1", "retrieved_has_answer": false, "index_has_answer": "contains_answer",
     "answer_collection": "issues", "answer_grounded": "grounded", "answer_declined": "no",
     "component": "katib"}

Each fact is a boolean, null (not established), or one of the judge's richer values:
`contains_answer | partial | no_answer` (containment), `grounded | ungrounded | no_factual_claims`
(grounding), `declined | not_declined` (declining), `yes | no | true | false`. `partial` maps like
the LLM judge's default (not the answer) unless `partial_is_answer=True`. Optional:
`answer_collection`, `component`, `unsupported_claims`, `answer_sources`, `injection_suspected`,
`evidence`. `triage.sinks.exports.write_facts_line` writes every one of them, so a run's local facts file replays to
the same layers. Facts the trace proves (`agent_searched`, `agent_searched_collections`) are
written for the record but read from the trace, never from the file. When a trace appears on
several lines, the last line wins (a run file is appended to).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from triage import jsonl
from triage.domain.ports import JudgeRequest
from triage.domain.records import Evidence, Facts, Usage
from triage.errors import InputError, JudgeError

_TRUE = {"true", "yes", "contains_answer", "grounded", "no_factual_claims", "declined"}
_FALSE = {"false", "no", "no_answer", "ungrounded", "not_declined"}
_BOOL_FACTS = ("retrieved_has_answer", "index_has_answer", "answer_grounded", "answer_declined")
_COLLECTION = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
# written for the record by `triage.sinks.exports.write_facts_line` (or by hand), never used as facts
_IGNORED = {
    "agent_searched",
    "agent_searched_collections",
    "layer",
    "judge",
    "prompt_version",
    "note",
    "notes",
}
_KNOWN = {
    "trace_id",
    *_BOOL_FACTS,
    "answer_collection",
    "component",
    "unsupported_claims",
    "answer_sources",
    "injection_suspected",
    "evidence",
    *_IGNORED,
}


def _fact(value: Any, name: str, partial_is_answer: bool) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        word = value.strip().lower()
        if word == "partial":
            return partial_is_answer
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
    raise ValueError(
        f"{name} must be a boolean, null or one of {sorted(_TRUE | _FALSE | {'partial'})}, not {value!r}"
    )


def parse_line(
    record: Any, partial_is_answer: bool = False, collections: Iterable[str] | None = None
) -> tuple[str, dict[str, Any]]:
    """(trace id, the judged facts as `Facts` fields) of one decoded line. Raises ValueError."""
    if not isinstance(record, dict):
        raise ValueError("a line must be a JSON object")
    trace_id = record.get("trace_id")
    if not isinstance(trace_id, str) or not trace_id:
        raise ValueError("trace_id is missing or not a string")
    unknown = sorted(set(record) - _KNOWN)
    if unknown:
        raise ValueError(f"unknown field(s): {', '.join(unknown)}")
    facts: dict[str, Any] = {name: _fact(record.get(name), name, partial_is_answer) for name in _BOOL_FACTS}
    collection = record.get("answer_collection")
    allowed = set(collections) if collections is not None else None
    if collection is not None and (
        not isinstance(collection, str)
        or not _COLLECTION.match(collection)
        or (allowed is not None and collection not in allowed)
    ):
        known = f"one of {sorted(allowed)}" if allowed is not None else "a collection name"
        raise ValueError(f"answer_collection must be {known} or null, not {collection!r}")
    facts["answer_collection"] = collection
    component = record.get("component")
    if component is not None and not isinstance(component, str):
        raise ValueError("component must be a string or null")
    facts["component"] = component
    for name in ("unsupported_claims", "answer_sources"):
        items = record.get(name, [])
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise ValueError(f"{name} must be a list of strings")
        facts[name] = items
    injection = record.get("injection_suspected", False)
    if not isinstance(injection, bool):
        raise ValueError("injection_suspected must be a boolean")
    facts["injection_suspected"] = injection
    evidence = record.get("evidence", {})
    if not isinstance(evidence, dict):
        raise ValueError("evidence must be an object")
    try:
        facts["evidence"] = {str(k): Evidence.model_validate(v) for k, v in evidence.items()}
    except ValidationError as ex:
        raise ValueError(f"evidence: {ex.errors()[0]['msg']}") from None
    return trace_id, facts


class ReplayJudge:
    """Facts read from a facts file. No search, no model call."""

    needs_research = False
    #: recorded facts include grounding; a request's `grounding=False` changes nothing
    can_skip_grounding = False

    def __init__(
        self, path: Path, *, partial_is_answer: bool = False, collections: Iterable[str] | None = None
    ) -> None:
        """Reads the whole file now, so a malformed line fails before any trace is judged.
        `collections` (the configured ones) restricts `answer_collection`; by default any name."""
        self.path = Path(path)
        self.name = f"replay:{self.path.name}"
        self.usage = Usage()
        self._facts: dict[str, dict[str, Any]] = {}
        versions: set[str | None] = set()
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError as ex:
            raise InputError(f"facts file not found: {self.path}") from ex
        except (OSError, UnicodeDecodeError) as ex:
            raise InputError(f"cannot read facts file {self.path}: {ex}") from ex
        for number, line in jsonl.lines(text):
            try:
                record = jsonl.parse(line)
                trace_id, facts = parse_line(record, partial_is_answer, collections)
            except ValueError as ex:  # not JSON, too deep, or not a trace's facts
                raise InputError(f"{self.path}:{number}: {ex}") from None
            self._facts[trace_id] = facts
            versions.add(record.get("prompt_version"))
        #: the recorded prompt version when every line agrees on one
        self.prompt_version: str | None = versions.pop() if len(versions) == 1 else None

    def __contains__(self, trace_id: str) -> bool:
        return trace_id in self._facts

    def __len__(self) -> int:
        return len(self._facts)

    async def aclose(self) -> None:
        """Nothing to release."""

    async def judge(self, request: JudgeRequest) -> Facts:
        trace_id, base = request.trace.id, request.base
        recorded = self._facts.get(trace_id)
        if recorded is None:
            raise JudgeError(f"no recorded facts for trace {trace_id} in {self.path.name}")
        evidence = {**base.evidence, **recorded["evidence"]}
        return base.model_copy(update={**recorded, "evidence": evidence})
