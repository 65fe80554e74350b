"""What triage is given: settings from the environment, and the configuration file.

`Settings` is the only place triage reads `os.environ` (through pydantic-settings; and
`agent_environment`, what a command agent is given of it, by name); `load_config`
reads the TOML configuration over `defaults.toml` (the records it holds are in
`triage.domain.config`). Both are loaded once by the CLI (`triage.app.Triage`) and passed into the
core. Secrets are `SecretStr`, so they never print.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Literal, get_args
from urllib.parse import unquote, urlsplit

from pydantic import AliasChoices, Field, SecretStr, ValidationError, ValidationInfo, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, SettingsConfigDict

from triage.domain.config import AGENT_ENV, TriageConfig
from triage.domain.outcome import Shard
from triage.errors import ConfigError

#: what `for_evaluation` leaves out: every setting that points at real data
_PRODUCTION = (
    "langfuse_",
    "triage_store",
    "triage_config",
    "triage_facts_file",
    "triage_mcp_",
    "job_completion_index",
    "triage_shard_count",
)

# The secret settings are declared once: a field typed `SecretStr` (`Settings.secret_fields`). Each
# is masked in logs (`Settings.secrets`), stripped of a trailing newline, and checked header-safe;
# the two names below are the exceptions, each for a reason of its own.
#: a key that is no secret (the public half of a pair), treated as a key all the same
_PUBLIC_KEYS = ("langfuse_public_key",)
#: a secret that never travels in an HTTP header (its own validator checks it)
_NOT_IN_HEADERS = ("triage_relay_database_url",)


def _is_secret(field: FieldInfo) -> bool:
    """Whether a setting is typed `SecretStr` (or `SecretStr | None`)."""
    return field.annotation is SecretStr or SecretStr in get_args(field.annotation)


class Settings(BaseSettings):
    """Every environment variable triage reads. See the "Settings" table of docs/operations.md."""

    # an empty variable (as a ConfigMap may leave it) means unset
    model_config = SettingsConfigDict(
        extra="ignore", case_sensitive=False, populate_by_name=True, env_ignore_empty=True
    )

    langfuse_public_key: str | None = None
    langfuse_secret_key: SecretStr | None = None
    langfuse_base_url: str = Field(
        default="https://cloud.langfuse.com",
        validation_alias=AliasChoices("LANGFUSE_BASE_URL", "LANGFUSE_HOST"),
    )
    langfuse_timeout: float = Field(default=30.0, gt=0)
    triage_confirm_wait_seconds: float = Field(
        default=60.0, ge=0, description="how long to poll for written scores to become readable"
    )
    triage_langfuse_deadline_seconds: float = Field(
        default=90.0, gt=0, description="how long one Langfuse call may retry before it gives up"
    )
    triage_retry_budget_seconds: float | None = Field(
        default=1800.0, gt=0, description="after this long, no outside call of the run retries any more"
    )
    triage_vote_lookback_days: float = Field(
        default=30.0,
        ge=0,
        le=366,
        description="how far before a window a Langfuse vote read reaches for votes changed in the window "
        "(a changed vote keeps its first timestamp, and Langfuse filters scores by timestamp only)",
    )

    openai_base_url: str | None = None
    openai_api_key: SecretStr | None = None
    triage_judge_model: str | None = None
    triage_batch_deadline_seconds: float = Field(
        default=3600.0,
        gt=0,
        le=86400,
        description="`triage feedback --batch`: how long after the run's start the Batch API is polled; "
        "what is left then is sent directly. Keep it well below the CronJob's activeDeadlineSeconds "
        "(7200 in cronjob.yaml), which must also hold the direct calls, the writes and a retry",
    )

    triage_mcp_url: str | None = None
    triage_mcp_token: SecretStr | None = None
    triage_mcp_command: str | None = None

    #: `triage issues sync --apply`: a GitHub token that may write issues in the owners' repositories
    #: (fine-grained: Issues, read and write); TRIAGE_GITHUB_TOKEN, else GITHUB_TOKEN
    github_token: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("TRIAGE_GITHUB_TOKEN", "GITHUB_TOKEN")
    )

    #: `triage relay`: the gateway's bearer token, the key that signs browsers' feedback tokens,
    #: and the relay's own SQLite file (ledger and outbox)
    triage_relay_token: SecretStr | None = None
    triage_relay_signing_key: SecretStr | None = None
    triage_relay_outbox: Path | None = None
    #: `triage relay` on PostgreSQL (`postgresql://user:password@host:5432/db`): the ledger and
    #: outbox shared by any number of replicas, instead of the SQLite file (needs Langfuse as the sink)
    triage_relay_database_url: SecretStr | None = None
    #: the gateway's session JWTs: the keys (a JWKS file or URL, or a PEM public key), and the issuer
    #: and audience they must name; RS256 or ES256, expiry checked with this much clock skew
    triage_relay_session_keys: str | None = None
    triage_relay_session_issuer: str | None = None
    triage_relay_session_audience: str | None = None
    triage_relay_session_leeway_seconds: float = Field(default=60.0, ge=0, le=3600)
    #: SIGTERM: requests in flight get this long to finish, then the outbox this long to drain;
    #: both within Kubernetes' grace period (30 s by default)
    triage_relay_shutdown_seconds: float = Field(default=10.0, gt=0, le=300)

    triage_config: Path | None = None
    triage_store: Path | None = None
    triage_facts_file: Path | None = None
    triage_log_format: Literal["text", "json"] = "text"
    #: let an unexpected crash raise with its traceback instead of a one-line error (debugging, tests)
    triage_raise_errors: bool = False

    job_completion_index: int | None = Field(default=None, ge=0)
    triage_shard_count: int | None = Field(default=None, ge=1)

    @classmethod
    def secret_fields(cls) -> tuple[str, ...]:
        """The settings that hold secrets: every field typed `SecretStr`, a subclass's included."""
        return tuple(name for name, field in cls.model_fields.items() if _is_secret(field))

    @classmethod
    def _keys(cls) -> frozenset[str]:
        return frozenset((*cls.secret_fields(), *_PUBLIC_KEYS))

    @field_validator("*", mode="before")
    @classmethod
    def _strip(cls, value: object, info: ValidationInfo) -> object:
        # `kubectl create secret --from-file` keeps the file's trailing newline: a key never has one
        if isinstance(value, str) and info.field_name in cls._keys():
            return value.strip()
        return value

    @field_validator("*")
    @classmethod
    def _header_safe(cls, value: object, info: ValidationInfo) -> object:
        # keys travel in HTTP headers, which carry visible ASCII only; never echo the value
        if info.field_name in _NOT_IN_HEADERS or info.field_name not in cls._keys():
            return value
        text = value.get_secret_value() if isinstance(value, SecretStr) else value
        if not isinstance(text, str):
            return value
        if not all(33 <= ord(ch) <= 126 for ch in text):
            raise ValueError("holds a character an HTTP header cannot carry (non-ASCII, a space or a control)")
        return value

    @field_validator("triage_relay_database_url", mode="before")
    @classmethod
    def _database_url(cls, value: object) -> object:
        # a Secret made from a file keeps its trailing newline; the scheme is checked here, so a
        # file path or a MySQL URL is refused at start-up (exit 3), not at the first vote
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        if isinstance(value, str):
            value = value.strip()
            if not value.startswith(("postgresql://", "postgres://")):
                raise ValueError("must be a postgresql:// URL (postgresql://user:password@host:5432/database)")
        return value

    @property
    def uses_langfuse(self) -> bool:
        return bool(self.langfuse_public_key or self.langfuse_secret_key)

    def for_evaluation(self, store: Path) -> Settings:
        """The settings of a `triage feedback` that `triage eval` runs: these, minus everything that
        points at real data (Langfuse, the store, the search server, shards, the config and facts
        files), on `store`, so an evaluation can never read or write production. The judge's
        settings (OPENAI_*, TRIAGE_JUDGE_MODEL) stay."""
        production = {
            name: field.get_default(call_default_factory=True)
            for name, field in type(self).model_fields.items()
            if name.startswith(_PRODUCTION)
        }
        return self.model_copy(update={**production, "triage_store": store})

    def shard(self) -> Shard:
        """The Job's shard: JOB_COMPLETION_INDEX of TRIAGE_SHARD_COUNT (an Indexed Job), else all."""
        if self.job_completion_index is None:
            return Shard()
        shard_count = self.triage_shard_count
        if shard_count is None:
            raise ConfigError(
                "JOB_COMPLETION_INDEX is set but TRIAGE_SHARD_COUNT is not: set it to the Job's completions"
            )
        if self.job_completion_index >= shard_count:
            raise ConfigError(f"JOB_COMPLETION_INDEX {self.job_completion_index} >= TRIAGE_SHARD_COUNT {shard_count}")
        return Shard(self.job_completion_index, shard_count)

    def secrets(self) -> list[str]:
        """Secret values (every `secret_fields` setting that is set, and the forms they travel in),
        so logging can redact them wherever they might appear."""
        values = [getattr(self, name) for name in self.secret_fields()]
        found = [v.get_secret_value() for v in values if isinstance(v, SecretStr) and v.get_secret_value()]
        if self.langfuse_public_key and self.langfuse_secret_key:
            # the pair as HTTP Basic carries it (a proxy echoing the header shows its base64)
            found.append(f"{self.langfuse_public_key}:{self.langfuse_secret_key.get_secret_value()}")
        if self.triage_relay_database_url is not None:
            url = self.triage_relay_database_url.get_secret_value()
            try:  # and its password alone, wherever a driver's message might quote it
                password = urlsplit(url).password
            except ValueError:
                password = None
            if password:
                found.append(unquote(password))
        return found


def agent_environment(names: Sequence[str] = ()) -> dict[str, str]:
    """The whole environment a command agent runs with (`[agent_endpoint] kind = "command"`): of
    triage's own, `AGENT_ENV` and the variables `names` lists (`[agent_endpoint] env`), where set;
    never the rest (triage's keys: OPENAI_API_KEY, LANGFUSE_SECRET_KEY...)."""
    return {name: os.environ[name] for name in dict.fromkeys((*AGENT_ENV, *names)) if name in os.environ}


def load_settings() -> Settings:
    """The settings; one the environment gets wrong is a configuration error naming it (exit 3)."""
    try:
        return Settings()
    except ValidationError as ex:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])).upper()}: {e['msg']}" for e in ex.errors())
        raise ConfigError(f"bad environment setting: {problems}") from ex


# -- the configuration file --------------------------------------------------------------------
# One TOML file. `triage/defaults.toml` holds the documented defaults (for the Kubeflow docs
# agent); a user's file is merged over it, table by table, so it need only say what differs.


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
        except UnicodeDecodeError as ex:
            raise ConfigError(f"config file {path} is not UTF-8 text (a TOML file): {ex.reason}") from ex
        except OSError as ex:
            raise ConfigError(f"cannot read config file {path}: {ex.strerror or ex}") from ex
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
