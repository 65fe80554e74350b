"""The configuration's records: tools, collections, components, owners, score names.

Pure data (pydantic models); `triage.config.load_config` reads them from TOML.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from triage.domain.relay import RelayConfig
from triage.errors import ConfigError


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ScoreNames(_Section):
    vote: str = "user_feedback"
    layer: str = "triage_layer"
    component: str = "triage_component"
    #: written by triage, CATEGORICAL: the failure signature (`triage.domain.signatures`)
    signature: str = "triage_signature"


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
