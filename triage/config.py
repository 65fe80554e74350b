"""The configuration file: loading it (the records it holds are in `triage.domain.config`).

One TOML file. `triage/defaults.toml` holds the documented defaults (for the Kubeflow docs
agent); a user's file is merged over it, table by table, so it need only say what differs.
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from triage.domain.config import TriageConfig
from triage.errors import ConfigError


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
