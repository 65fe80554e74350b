"""The relay's configuration records (the declared score model, the service's limits) and the
vocabulary of people's scores, said once: the verdict's categories (`Verdict`), the fields of a
reviewer's verdict (`VerdictField`), and `ReviewNames`, the one record of the score names people
write, which the relay, `triage promote`, `triage calibrate` and `triage queue` all read.

Pure data, read from the `[relay]` table of the configuration file. `RelayConfig.problems()`
lists what makes a model incoherent; `triage relay` refuses to start on any (exit 3).

A new field of a reviewer's verdict is declared here (a name in `VerdictField`, its score in
`_default_scores`) and accepted in `triage.relay.bodies.FeedbackIn` (its spellings).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from triage.domain.review import Category, ScoreConfigSpec, config_name_problem
from triage.domain.scores import LANGFUSE_TEXT_MAX, DataType

if TYPE_CHECKING:  # the configuration holds `RelayConfig`: only the type is needed here
    from triage.domain.config import CalibrationConfig

#: a reviewer's verdict on an answer: `false_alarm` and `positive` on a thumbs-down say the agent was right
Verdict = Literal["positive", "negative", "false_alarm"]
VERDICTS: tuple[Verdict, ...] = get_args(Verdict)
#: the verdicts that find the agent's answer right
AGENT_RIGHT: frozenset[Verdict] = frozenset({"positive", "false_alarm"})
#: the fields of a reviewer's verdict besides the verdict itself, each a score of the same name
VerdictField = Literal["issue_category", "corrected_answer", "expected_tool_behavior", "note"]
VERDICT_FIELDS: tuple[VerdictField, ...] = get_args(VerdictField)
#: the end users' votes, written by the relay
VOTE_SCORE = "user_feedback"
#: the source that writes people's votes and verdicts (through /api/feedback)
HUMAN = "human"
#: the longest score name the relay declares or takes
MAX_SCORE_NAME = 64


@dataclass(frozen=True)
class ReviewNames:
    """The names of the scores people write, one record for every reader: the relay writes the
    verdict's fields, `triage promote` reads corrections, `triage calibrate` labels, `triage queue`
    makes the reviewers' score configs. `of` derives it from `[calibration]`, the only configuration
    of these names there is; the verdict's other fields are named as the relay's body names them."""

    #: CATEGORICAL (`Verdict`)
    verdict: str
    #: CATEGORICAL, the seven layers: a reviewer's layer
    layer: str
    #: BOOLEAN, one per judged fact: fact name -> score name
    facts: Mapping[str, str]

    #: the verdict's fields `triage promote` reads by meaning (their names are fixed)
    correction: ClassVar[VerdictField] = "corrected_answer"  # CORRECTION
    expected_tool_behavior: ClassVar[VerdictField] = "expected_tool_behavior"
    note: ClassVar[VerdictField] = "note"

    @classmethod
    def of(cls, calibration: CalibrationConfig) -> ReviewNames:
        return cls(
            verdict=calibration.verdict_score, layer=calibration.layer_score, facts=dict(calibration.fact_scores)
        )

    def verdict_scores(self) -> dict[str, str]:
        """Each field of a reviewer's verdict (as the relay's body names it) to its score's name."""
        return {"verdict": self.verdict, **{f: f for f in VERDICT_FIELDS}}

    def relay_writes(self) -> list[str]:
        """The names the relay writes for people, which the `human` source must be allowed to write."""
        return [VOTE_SCORE, *self.verdict_scores().values()]

    def labels(self) -> list[str]:
        """Every score name a calibration label can come from."""
        return [self.layer, self.verdict, *self.facts.values()]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DeclaredScore(_Section):
    """One score name the relay may write, with its Langfuse data type."""

    name: str = Field(min_length=1, max_length=MAX_SCORE_NAME)
    data_type: DataType
    #: NUMERIC bounds (inclusive)
    min: float | None = None
    max: float | None = None
    #: CATEGORICAL: the allowed values; empty means any string up to `max_length`
    categories: list[str] = Field(default_factory=list)
    #: CATEGORICAL, TEXT and CORRECTION: the longest value (Langfuse's TEXT takes 1-500 characters)
    max_length: int = Field(default=500, ge=1, le=100_000)

    def config_spec(self) -> ScoreConfigSpec | None:
        """The Langfuse score config that states this score exactly, or None where none can: a
        CATEGORICAL score open to any string, TEXT and CORRECTION go without one, and so does a
        name Langfuse would refuse for a config."""
        if config_name_problem(self.name) is not None:
            return None
        description = "declared in triage relay"
        if self.data_type == "BOOLEAN":
            return ScoreConfigSpec(name=self.name, data_type="BOOLEAN", description=description)
        if self.data_type == "NUMERIC":
            return ScoreConfigSpec(
                name=self.name, data_type="NUMERIC", description=description, min_value=self.min, max_value=self.max
            )
        if self.data_type == "CATEGORICAL" and self.categories:
            categories = [Category(label=c, value=float(n)) for n, c in enumerate(self.categories)]
            return ScoreConfigSpec(
                name=self.name, data_type="CATEGORICAL", categories=categories, description=description
            )
        return None


class ScoreSource(_Section):
    """Who writes: `human` (votes and verdicts through /api/feedback) or a named external channel."""

    name: str = Field(min_length=1, max_length=MAX_SCORE_NAME)
    scores: list[str]


def _default_scores() -> list[DeclaredScore]:
    return [
        DeclaredScore(name=VOTE_SCORE, data_type="BOOLEAN"),
        DeclaredScore(name="verdict", data_type="CATEGORICAL", categories=list(VERDICTS)),
        DeclaredScore(name="issue_category", data_type="CATEGORICAL", max_length=64),
        DeclaredScore(name="corrected_answer", data_type="CORRECTION", max_length=20_000),
        DeclaredScore(name="expected_tool_behavior", data_type="TEXT"),
        DeclaredScore(name="note", data_type="TEXT"),
    ]


def _default_sources() -> list[ScoreSource]:
    return [ScoreSource(name=HUMAN, scores=[s.name for s in _default_scores()])]


class RelayConfig(_Section):
    """`[relay]`: the declared score model and the service's limits."""

    #: enforce: an undeclared score name is refused (422); monitor: accepted and counted
    mode: Literal["enforce", "monitor"] = "enforce"
    scores: list[DeclaredScore] = Field(default_factory=_default_scores)
    sources: list[ScoreSource] = Field(default_factory=_default_sources)
    #: a request body over this many bytes is refused (413)
    max_body_bytes: int = Field(default=64 * 1024, ge=256)
    #: a request head (line and headers) over this many bytes is refused (431); one that takes
    #: longer than `head_seconds` to arrive, and a body longer than `body_seconds`, 408
    max_head_bytes: int = Field(default=32 * 1024, ge=1024, le=1024 * 1024)
    head_seconds: float = Field(default=10.0, gt=0, le=300)
    body_seconds: float = Field(default=10.0, gt=0, le=300)
    #: connections and requests at once; beyond, uvicorn answers 503
    max_connections: int = Field(default=1000, ge=1)
    #: per client (token subject, named user, else address): sustained requests per second and burst
    rate_per_second: float = Field(default=20.0, gt=0)
    rate_burst: int = Field(default=40, ge=1)
    #: feedback tokens issued by `triage.relay.access.issue_token` expire after this long by default
    token_ttl_seconds: int = Field(default=3 * 3600, ge=60)
    #: delivery to Langfuse: wait this long for a batch to fill, send at most this many per request
    batch_wait_seconds: float = Field(default=0.25, ge=0)
    batch_max: int = Field(default=500, ge=1, le=1000)
    #: the outbox refuses new writes (503) beyond this many undelivered operations
    outbox_max: int = Field(default=1_000_000, ge=1)
    #: an operation Langfuse refuses outright (a 4xx that is not 408/409/429) this often is set aside
    max_attempts: int = Field(default=20, ge=1)
    #: browser origins allowed to call the API (CORS), e.g. "https://www.kubeflow.org"
    cors_origins: list[str] = Field(default_factory=list)
    #: proxies (addresses or networks) whose X-Forwarded-For names the client, for the rate limit
    trusted_proxies: list[str] = Field(default_factory=list)

    def declared(self, name: str) -> DeclaredScore | None:
        return next((s for s in self.scores if s.name == name), None)

    def may_write(self, source: str, name: str) -> bool:
        return any(s.name == source and name in s.scores for s in self.sources)

    def max_text(self, names: ReviewNames) -> dict[str, int]:
        """The longest value of each field of a reviewer's verdict (by the relay's body name), as
        its declared score allows; a field whose score is not declared (monitor mode) is absent."""
        return {
            field: declared.max_length
            for field, name in names.verdict_scores().items()
            if (declared := self.declared(name)) is not None
        }

    def problems(self, required: list[str] | None = None) -> list[str]:
        """What makes the model incoherent; empty when it is sound. `required`: names the relay
        itself writes for people, which the `human` source must be allowed to write."""
        found: list[str] = []
        names = [s.name for s in self.scores]
        for name in sorted({n for n in names if names.count(n) > 1}):
            found.append(f"score {name!r} is declared twice")
        if not self.sources:
            found.append("no source is declared ([[relay.sources]])")
        sources = [s.name for s in self.sources]
        for name in sorted({n for n in sources if sources.count(n) > 1}):
            found.append(f"source {name!r} is declared twice")
        for source in self.sources:
            for name in source.scores:
                if name not in names:
                    found.append(f"source {source.name!r} writes {name!r}, which is not declared")
        written = {n for s in self.sources for n in s.scores}
        for score in self.scores:
            if score.name not in written:
                found.append(f"score {score.name!r} is declared but no source writes it")
            if score.data_type == "NUMERIC" and score.min is not None and score.max is not None:
                if score.min > score.max:
                    found.append(f"score {score.name!r}: min {score.min} is above max {score.max}")
            if score.data_type == "TEXT" and score.max_length > LANGFUSE_TEXT_MAX:
                # accepted here, refused by Langfuse later: the note would be set aside after a 202
                found.append(
                    f"score {score.name!r}: a TEXT score is at most {LANGFUSE_TEXT_MAX} characters in Langfuse, "
                    f"not {score.max_length}"
                )
            if score.data_type != "CATEGORICAL" and score.categories:
                found.append(f"score {score.name!r}: categories need data_type CATEGORICAL")
        for origin in self.cors_origins:
            scheme, _, host = origin.partition("://")
            if scheme not in ("http", "https") or not host or "/" in host.rstrip("/"):
                found.append(f"cors origin {origin!r} is not scheme://host[:port]")
        for proxy in self.trusted_proxies:
            try:
                ipaddress.ip_network(proxy, strict=False)
            except ValueError:
                found.append(f"trusted proxy {proxy!r} is not an address or a network")
        for name in required or []:
            if self.mode == "enforce" and not self.may_write(HUMAN, name):
                found.append(f"the {HUMAN!r} source must be allowed to write {name!r} (the relay writes it)")
        return found
