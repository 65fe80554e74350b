"""The declared score model as Langfuse score configs: created where missing, attached (`configId`)
where an existing one matches, so the Langfuse UI, annotation queues and the relay share one
definition of each score.

Only what a config can state exactly: BOOLEAN, NUMERIC (with its bounds) and CATEGORICAL with a
fixed list of categories. A CATEGORICAL score open to any string (`issue_category`), TEXT and
CORRECTION go without one. An existing config of the same name that differs (type, bounds,
categories) or is archived is left alone and not attached: Langfuse drops a score that does not
fit its config silently, in the worker, after answering 202.
"""

from __future__ import annotations

import logging
from typing import Any

from triage.domain.relay import DeclaredScore, RelayConfig
from triage.retry import RetryPolicy
from triage.sources.langfuse.http import LangfuseHttp

log = logging.getLogger("triage.relay")

MAX_NAME = 35  # Langfuse's limit for a config name


def wanted(score: DeclaredScore) -> dict[str, Any] | None:
    """The CreateScoreConfigRequest for a declared score, or None when no config fits it."""
    if len(score.name) > MAX_NAME:
        return None
    body: dict[str, Any] = {
        "name": score.name,
        "dataType": score.data_type,
        "description": "declared in triage relay",
    }
    if score.data_type == "BOOLEAN":
        return body
    if score.data_type == "NUMERIC":
        return {**body, "minValue": score.min, "maxValue": score.max}
    if score.data_type == "CATEGORICAL" and score.categories:
        return {**body, "categories": [{"label": c, "value": n} for n, c in enumerate(score.categories)]}
    return None


def matches(config: dict[str, Any], body: dict[str, Any]) -> bool:
    if config.get("isArchived") or config.get("dataType") != body["dataType"]:
        return False
    if body["dataType"] == "NUMERIC":
        return bool(config.get("minValue") == body["minValue"] and config.get("maxValue") == body["maxValue"])
    if body["dataType"] == "CATEGORICAL":
        return sorted(c.get("label") for c in config.get("categories") or []) == sorted(
            c["label"] for c in body["categories"]
        )
    return True


def sync_score_configs(http: LangfuseHttp, model: RelayConfig, retry: RetryPolicy) -> dict[str, str]:
    """Score name -> config id for every declared score a config fits; creates the missing ones.
    Raises what the requests raise (the caller tries again later)."""
    existing: dict[str, dict[str, Any]] = {}
    page = 1
    while True:

        def read(page: int = page) -> Any:
            return http.raw("GET", "api/public/score-configs", params={"page": page, "limit": 100})

        answer = http.call("reading score configs", read, retry=retry)
        for config in answer.get("data") or []:
            existing.setdefault(str(config.get("name")), config)
        if page >= int((answer.get("meta") or {}).get("totalPages") or 1):
            break
        page += 1
    ids: dict[str, str] = {}
    for score in model.scores:
        body = wanted(score)
        if body is None:
            continue
        config = existing.get(score.name)
        if config is None:

            def create(body: dict[str, Any] = body) -> Any:
                return http.raw("POST", "api/public/score-configs", json_body=body)

            config = http.call(f"creating score config {score.name}", create, retry=retry)
            log.info("created the Langfuse score config %r", score.name, extra={"event": "score_config"})
        elif not matches(config, body):
            log.warning(
                "Langfuse score config %r differs from the declared model: its scores go without it",
                score.name,
                extra={"event": "score_config_mismatch"},
            )
            continue
        ids[score.name] = str(config["id"])
    return ids
