"""The configuration file: tools, collections, components, owners, score names.

One TOML file. `triage/defaults.toml` holds the documented defaults (for the Kubeflow docs
agent); a user's file is merged over it, table by table, so it need only say what differs.
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import ConfigError


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ScoreNames(_Section):
    vote: str = "user_feedback"
    layer: str = "triage_layer"
    component: str = "triage_component"


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
    tools: dict[str, str] = Field(description="tool name -> collection it searches")
    search: SearchConfig = Field(default_factory=SearchConfig)
    components: dict[str, Component]
    judge: JudgeConfig = Field(default_factory=JudgeConfig)
    index: list[IndexFolder] = Field(default_factory=list)

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


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if (
            isinstance(value, dict)
            and isinstance(merged.get(key), dict)
            and key not in {"tools", "components"}
        ):
            merged[key] = _merge(merged[key], value)
        else:
            # tools and components replace the defaults whole: a user's agent has its own
            merged[key] = value
    return merged


def default_config_text() -> str:
    return resources.files("triage").joinpath("defaults.toml").read_text(encoding="utf-8")


def load_config(path: Path | None = None) -> TriageConfig:
    """The defaults, with the file at `path` (if any) merged over them."""
    data = tomllib.loads(default_config_text())
    if path is not None:
        try:
            user = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError as ex:
            raise ConfigError(f"config file not found: {path}") from ex
        except tomllib.TOMLDecodeError as ex:
            raise ConfigError(f"config file {path} is not valid TOML: {ex}") from ex
        data = _merge(data, user)
        for folder in data.get("index", []):
            # relative index folders are relative to the config file, not the working directory
            if "path" in folder and not Path(folder["path"]).is_absolute():
                folder["path"] = str((Path(path).parent / folder["path"]).resolve())
    try:
        config = TriageConfig.model_validate(data)
    except ValidationError as ex:
        where = f"config file {path}" if path else "built-in defaults"
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in ex.errors())
        raise ConfigError(f"{where}: {problems}") from ex
    if config.agent.default_component not in config.components:
        raise ConfigError(
            f"agent.default_component {config.agent.default_component!r} is not in [components]"
        )
    return config
