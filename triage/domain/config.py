"""The configuration's records: tools, collections, components, owners, score names.

Pure data (pydantic models); `triage.settings.load_config` reads them from TOML.

The relay's configuration records (the declared score model, the service's limits) and the
vocabulary of people's scores, said once: the fields of a reviewer's verdict (`VERDICT_FIELD_SPECS`; the
verdict's categories, `Verdict`, are in `triage.domain.review`), and `ReviewNames`, the one record
of the score names people write, which the relay, `triage promote`, `triage calibrate` and
`triage queue` all read.

Pure data, read from the `[relay]` table of the configuration file. `RelayConfig.problems()`
lists what makes a model incoherent; `triage relay` refuses to start on any (exit 3).

A new field of a reviewer's verdict is declared here, once (`VERDICT_FIELD_SPECS`): the relay's body
takes it and the built-in score model declares its score from that line.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from triage.domain.review import VERDICTS, Category, ScoreConfigSpec, config_name_problem
from triage.domain.scores import LANGFUSE_TEXT_MAX, DataType
from triage.errors import ConfigError

#: a field of a reviewer's verdict besides the verdict itself (a name of `VERDICT_FIELD_SPECS`)
VerdictField = str


@dataclass(frozen=True)
class VerdictFieldSpec:
    """A field of a reviewer's verdict besides the verdict itself, declared once: the relay's body
    takes it (under `name` and its camelCase spelling, `relay.bodies`), the built-in score model
    declares its score (same name), and the OpenAPI description says `description`."""

    name: str
    data_type: DataType
    #: the longest value the built-in model takes
    max_length: int = 500
    description: str | None = None


#: the verdict's fields, in the order the relay writes them: a new field is a line here, then read
#: where it is used (`triage promote`: an entry of `regression._REVIEWED`, a `_Review` attribute, and
#: the case's metadata it goes into)
VERDICT_FIELD_SPECS: tuple[VerdictFieldSpec, ...] = (
    VerdictFieldSpec(
        "issue_category", "CATEGORICAL", 64, "wrong_answer, missing_info, wrong_tool, refused, unsafe, ..."
    ),
    VerdictFieldSpec("corrected_answer", "CORRECTION", 20_000, "a CORRECTION score (traces only)"),
    VerdictFieldSpec("expected_tool_behavior", "TEXT"),
    VerdictFieldSpec("note", "TEXT"),
)
VERDICT_FIELDS: tuple[VerdictField, ...] = tuple(spec.name for spec in VERDICT_FIELD_SPECS)
#: the default of `[scores] vote`, the end users' votes (the relay writes them, the night reads
#: them); everything else takes the configured name (`ScoreNames.vote`, `ReviewNames.vote`)
VOTE_SCORE = "user_feedback"
#: the source that writes people's votes and verdicts (through /api/feedback)
HUMAN = "human"
#: the longest score name the relay declares or takes
MAX_SCORE_NAME = 64


@dataclass(frozen=True)
class ReviewNames:
    """The names of the scores people write, one record for every reader: the relay writes the
    verdict's fields, `triage promote` reads corrections, `triage calibrate` labels, `triage queue`
    makes the reviewers' score configs. `of` derives it from `[calibration]` and `[scores]` (the
    vote's name, the one the night reads), the only configuration of these names there is; the
    verdict's other fields are named as the relay's body names them."""

    #: BOOLEAN: an end user's vote (`[scores] vote`)
    vote: str
    #: CATEGORICAL (`Verdict`)
    verdict: str
    #: CATEGORICAL, the seven layers: a reviewer's layer
    layer: str
    #: BOOLEAN, one per judged fact: fact name -> score name
    facts: Mapping[str, str]

    @classmethod
    def of(cls, calibration: CalibrationConfig, scores: ScoreNames | None = None) -> ReviewNames:
        """`scores`: `[scores]`; left out (a reader of reviewers' labels only), its default vote."""
        return cls(
            vote=(scores or ScoreNames()).vote,
            verdict=calibration.verdict_score,
            layer=calibration.layer_score,
            facts=dict(calibration.fact_scores),
        )

    def verdict_scores(self) -> dict[str, str]:
        """Each field of a reviewer's verdict (as the relay's body names it) to its score's name."""
        return {"verdict": self.verdict, **{f: f for f in VERDICT_FIELDS}}

    def relay_writes(self) -> list[str]:
        """The names the relay writes for people, which the `human` source must be allowed to write."""
        return [self.vote, *self.verdict_scores().values()]

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


def _default_scores(vote: str | None = None) -> list[DeclaredScore]:
    """The built-in model, the vote under `vote` (`[scores] vote`; `TriageConfig` passes it)."""
    return [
        DeclaredScore(name=vote or ScoreNames().vote, data_type="BOOLEAN"),
        DeclaredScore(name="verdict", data_type="CATEGORICAL", categories=list(VERDICTS)),
        *(
            DeclaredScore(name=f.name, data_type=f.data_type, max_length=f.max_length)
            for f in VERDICT_FIELD_SPECS
        ),
    ]


def _default_sources(vote: str | None = None) -> list[ScoreSource]:
    return [ScoreSource(name=HUMAN, scores=[s.name for s in _default_scores(vote)])]


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


class ScoreNames(_Section):
    #: the users' BOOLEAN thumbs score: the night reads it, the relay writes it (`ReviewNames.vote`)
    vote: str = Field(default=VOTE_SCORE, min_length=1, max_length=MAX_SCORE_NAME)
    layer: str = "triage_layer"
    component: str = "triage_component"
    #: written by triage, CATEGORICAL: the failure signature (`triage.domain.worklist`)
    signature: str = "triage_signature"
    #: written by triage, CATEGORICAL on a signature's own trace id: its life across releases
    #: (`triage.domain.tracker.SignatureState`; the nightly job and `triage check --release`)
    signature_state: str = "triage_signature_state"


class CalibrationConfig(_Section):
    """Where people's labels live in Langfuse, and the annotation queue `triage queue` fills."""

    #: a CATEGORICAL score with the seven layers as categories: the reviewer's layer
    layer_score: str = "human_layer"
    #: BOOLEAN scores, one per judged fact (optional for a reviewer): fact name -> score name
    fact_scores: dict[str, str] = Field(
        default_factory=lambda: {
            "retrieved_has_answer": "human_retrieved_has_answer",
            "index_has_answer": "human_index_has_answer",
            "answer_grounded": "human_answer_grounded",
            "answer_declined": "human_answer_declined",
        }
    )
    #: the reviewers' verdict score (`triage relay`): CATEGORICAL positive | negative | false_alarm
    verdict_score: str = "verdict"
    queue: str = "triage-review"


class WindowConfig(_Section):
    lag_minutes: int = Field(default=15, ge=0)
    overlap_minutes: int = Field(default=60, ge=0)
    #: with `--write`, a run reaches back to where the last complete run ended (its marker score),
    #: at most this many days, so the thumbs-down an outage, a failed Job or a skipped night left
    #: are triaged the next night (0: never further back than the window)
    lookback_days: float = Field(default=7.0, ge=0, le=366)


class AgentConfig(_Section):
    team: str
    issues_collection: str = "issues"
    default_component: str = "general"


class SearchConfig(_Section):
    top_k: int = Field(default=5, ge=1, le=50)
    use_comment: bool = True
    #: also re-search each query the agent sent, in every collection
    use_agent_queries: bool = True
    #: the search server's longest query; a longer question (plus comment) is cut to it
    max_query_chars: int = Field(default=512, ge=16)
    #: queries of its own a model judge may search when no passage shown holds the answer (0: none)
    judge_queries: int = Field(default=2, ge=0, le=5)
    #: how long a run waits, in all, for a search that went down mid-run before it lists the traces
    #: that need it (0: never wait); cronjob.yaml's activeDeadlineSeconds is sized for it
    outage_wait_seconds: float = Field(default=600.0, ge=0, le=6 * 3600)


class Component(_Section):
    owner: str
    sources: list[str] = Field(default_factory=list)
    keywords: list[str] = Field(default_factory=list)


class JudgeConfig(_Section):
    input_price_per_mtok: float = Field(default=0.0, ge=0)
    output_price_per_mtok: float = Field(default=0.0, ge=0)
    concurrency: int = Field(default=16, ge=1)


class IndexFolder(_Section):
    """A folder of Markdown/YAML files served as one collection of the embedded index."""

    collection: str
    path: Path
    base_url: str | None = None


#: the placeholder a request template, or a command's argument, holds for the question
QUESTION = "{question}"


#: what a command agent gets of triage's environment whatever `[agent_endpoint] env` says (never a key)
AGENT_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class AgentEndpointConfig(_Section):
    """`[agent_endpoint]`: how `triage check` reaches the agent it checks.

    - `openai` (the default): an OpenAI-compatible chat endpoint; the question is the user message,
      the reply's message the answer, the URLs in it the sources;
    - `http`: any JSON API: `request` is the body POSTed, each `{question}` in its strings replaced by
      the question (inside the JSON value, so no question can break out of it); the paths say where
      the reply holds the answer, the sources, the trace id and the tool calls;
    - `command`: a local command, the question on its standard input (or as the argument that reads
      `{question}`), its standard output the answer (text) or a JSON object read with the paths; its
      environment is `AGENT_ENV` and the variables `env` names, nothing more of triage's.

    The default paths read the agent answer format (docs/commands.md, "The agent's answer format").
    """

    kind: Literal["openai", "http", "command"] = "openai"
    #: openai: the base URL (`.../v1`; `/chat/completions` is added); http: the URL POSTed to
    url: str | None = None
    #: openai: the model name sent
    model: str = "agent"
    #: openai: a system message sent before the question
    system_prompt: str | None = None
    #: sent with every request (no secret belongs in a configuration file)
    headers: dict[str, str] = Field(default_factory=dict)
    #: http: the JSON body
    request: dict[str, Any] = Field(default_factory=lambda: {"question": QUESTION})
    #: where a JSON reply holds what `triage check` reads: JSON pointers (`/data/answer`,
    #: `/choices/0/message/content`); an empty one is not read. Sources may be URLs or objects with a
    #: `url`; without them, the URLs in the answer are its sources. Retrieved passages are objects
    #: with a `text` and a `source_url` (and optionally `title`, `collection`, `id`)
    answer_path: str | None = None
    sources_path: str = "/sources"
    retrieved_path: str = "/retrieved"
    trace_id_path: str = "/trace_id"
    tool_calls_path: str = "/tool_calls"
    #: a response header that carries the trace id (openai, http), e.g. `x-trace-id`
    trace_id_header: str | None = None
    #: command: the program and its arguments (no shell)
    command: list[str] = Field(default_factory=list)
    input: Literal["stdin", "argument"] = "stdin"
    output: Literal["text", "json"] = "text"
    #: command: the variables of triage's environment passed to it besides `AGENT_ENV` (by name;
    #: settings.py reads their values)
    env: list[str] = Field(default_factory=list)

    @property
    def answer_pointer(self) -> str:
        """Where the answer is: the configured path, else the kind's own place."""
        if self.answer_path is not None:
            return self.answer_path
        return "/choices/0/message/content" if self.kind == "openai" else "/answer"

    def problems(self) -> list[str]:
        found: list[str] = []
        if self.kind in ("openai", "http") and not self.url:
            found.append(f"[agent_endpoint] kind {self.kind!r} needs a url")
        if self.url and not self.url.startswith(("http://", "https://")):
            found.append(f"[agent_endpoint] url {self.url!r} is not an http:// or https:// URL")
        if self.kind == "command" and not self.command:
            found.append("[agent_endpoint] kind 'command' needs a command (a list: the program and its arguments)")
        if self.kind == "command" and self.input == "argument" and not any(QUESTION in a for a in self.command):
            found.append(f"[agent_endpoint] input 'argument' needs an argument holding {QUESTION}")
        bad_names = [name for name in self.env if not _ENV_NAME.fullmatch(name)]
        found += [f"[agent_endpoint] env {name!r} is not a variable name" for name in bad_names]
        for name in ("answer_path", "sources_path", "retrieved_path", "trace_id_path", "tool_calls_path"):
            value = getattr(self, name)
            if value and not value.startswith("/"):
                found.append(f"[agent_endpoint] {name} {value!r} is not a JSON pointer (it starts with /)")
        return found


class CheckConfig(_Section):
    """`[check]`: how `triage check` runs (its options override these)."""

    dataset: str = Field(default="triage-regressions", min_length=1)
    #: cases asked at once
    concurrency: int = Field(default=4, ge=1, le=256)
    #: one case's time with the agent, its retries included
    timeout_seconds: float = Field(default=120.0, gt=0)
    #: tries per case (transport errors, time-outs of one try, 408, 429 and 5xx are tried again)
    attempts: int = Field(default=3, ge=1, le=10)
    #: the gate: exit 7 when the pass rate is under this (None: no gate on the rate)
    min_pass: float | None = Field(default=None, ge=0, le=1)
    #: the gate: exit 8 when more than this share of the cases is unchecked (agent errors, undecided;
    #: 1: no gate on the share, though a case that passed before and is unchecked now still exits 8)
    max_unchecked: float = Field(default=0.1, ge=0, le=1)
    #: Langfuse: how long to wait for the agent's new traces to become readable
    trace_wait_seconds: float = Field(default=60.0, ge=0)


class TrackerConfig(_Section):
    """`[tracker]`: `triage issues sync`, one GitHub issue per failure signature in its owner's
    repository (`triage.domain.tracker`)."""

    #: the owners whose repositories the sync may write to (an owner not listed stays a draft)
    allow: list[str] = Field(default_factory=list)
    #: owner -> repository (`owner/name`) where they differ; by default the owner itself
    repositories: dict[str, str] = Field(default_factory=dict)
    #: labels every issue carries; the first one is how the sync lists its issues again
    labels: list[str] = Field(default_factory=lambda: ["triage"], min_length=1)
    #: a signature qualifies for an issue at this many failures (its nights together) ...
    min_count: int = Field(default=3, ge=1)
    #: ... or this share of a night's failures (0: not by share) ...
    min_share: float = Field(default=0.0, ge=0, le=1)
    #: ... or when it is escalating (tonight's share above the nights before, beyond chance)
    on_escalating: bool = True
    #: the one-sided test's level for escalating
    alpha: float = Field(default=0.05, gt=0, lt=1)
    #: the trust gate for verdicts neither sure nor confirmed: the judge's last `triage calibrate
    #: --write` kappa lower bound must reach this
    min_kappa: float = Field(default=0.6, ge=-1, le=1)
    #: how far back a signature's states are read
    lookback_days: float = Field(default=90.0, gt=0, le=366)
    #: users' comments in an issue (off: a public tracker gets none)
    include_comments: bool = False
    #: GitHub's API (GitHub Enterprise: https://HOST/api/v3)
    api_url: str = "https://api.github.com"


@dataclass(frozen=True)
class LangfuseLimits:
    """Requests an organisation may make of Langfuse, per API group (None: no limit kept)."""

    #: the general API: v2 observations, v3 scores, traces, score configs, queues (the Langfuse MCP
    #: server shares it)
    general_per_minute: int | None = None
    #: datasets, dataset items and runs, experiments
    datasets_per_minute: int | None = None
    #: the v2 metrics API (the release watch's answers per release)
    metrics_per_hour: int | None = None
    metrics_per_day: int | None = None


#: Langfuse Cloud's published limits per organisation, fixed windows (as of 2026-11)
CLOUD_PLANS: dict[str, LangfuseLimits] = {
    "hobby": LangfuseLimits(general_per_minute=30, datasets_per_minute=100, metrics_per_day=100),
    "core": LangfuseLimits(general_per_minute=100, datasets_per_minute=200, metrics_per_hour=100),
    "pro": LangfuseLimits(general_per_minute=1000, datasets_per_minute=1000, metrics_per_hour=500),
}


class LangfuseConfig(_Section):
    """`[langfuse]`: the request budget every Langfuse call of this process keeps to (the night,
    `check`, `releases`, the relay's outbox), paced before each request rather than learnt from
    429s. `plan` takes Langfuse Cloud's limits for that plan; a number set here overrides it. A
    self-hosted Langfuse limits nothing: leave it all unset."""

    plan: Literal["hobby", "core", "pro"] | None = None
    requests_per_minute: int | None = Field(default=None, ge=1)
    dataset_requests_per_minute: int | None = Field(default=None, ge=1)
    metrics_requests_per_hour: int | None = Field(default=None, ge=1)
    metrics_requests_per_day: int | None = Field(default=None, ge=1)

    def limits(self) -> LangfuseLimits:
        base = CLOUD_PLANS[self.plan] if self.plan else LangfuseLimits()
        return LangfuseLimits(
            general_per_minute=self.requests_per_minute or base.general_per_minute,
            datasets_per_minute=self.dataset_requests_per_minute or base.datasets_per_minute,
            metrics_per_hour=self.metrics_requests_per_hour or base.metrics_per_hour,
            metrics_per_day=self.metrics_requests_per_day or base.metrics_per_day,
        )


class TriageConfig(_Section):
    rule_version: str = "1"
    scores: ScoreNames = Field(default_factory=ScoreNames)
    window: WindowConfig = Field(default_factory=WindowConfig)
    agent: AgentConfig
    tools: dict[str, str] = Field(min_length=1, description="tool name -> collection it searches")
    search: SearchConfig = Field(default_factory=SearchConfig)
    components: dict[str, Component]
    judge: JudgeConfig = Field(default_factory=JudgeConfig)
    index: list[IndexFolder] = Field(default_factory=list)
    calibration: CalibrationConfig = Field(default_factory=CalibrationConfig)
    relay: RelayConfig = Field(default_factory=RelayConfig)
    #: `triage check`: the agent (None: none configured) and the run
    agent_endpoint: AgentEndpointConfig | None = None
    check: CheckConfig = Field(default_factory=CheckConfig)
    tracker: TrackerConfig = Field(default_factory=TrackerConfig)
    langfuse: LangfuseConfig = Field(default_factory=LangfuseConfig)

    @model_validator(mode="after")
    def _vote_declared_as_configured(self) -> TriageConfig:
        # the relay's built-in model declares the vote under the name the night reads; a model the
        # file declares (`[[relay.scores]]`, `[[relay.sources]]`) is the file's own
        given = self.relay.model_fields_set
        derived: dict[str, Any] = {}
        if "scores" not in given:
            derived["scores"] = _default_scores(self.scores.vote)
        if "sources" not in given:
            derived["sources"] = _default_sources(self.scores.vote)
        if derived:
            self.relay = self.relay.model_copy(update=derived)
        return self

    def review_names(self) -> ReviewNames:
        """The names of the scores people write, the vote's the one the night reads."""
        return ReviewNames.of(self.calibration, self.scores)

    @property
    def collections(self) -> list[str]:
        """The collections, in the order their tools are configured."""
        return list(dict.fromkeys(self.tools.values()))

    def tool_for(self, collection: str) -> str:
        """The search tool that serves `collection` (the first configured)."""
        for tool, coll in self.tools.items():
            if coll == collection:
                return tool
        raise ConfigError(f"no search tool is configured for collection {collection!r}")
