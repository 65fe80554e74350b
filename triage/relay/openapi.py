"""The relay's OpenAPI description (`GET /openapi.json`, docs/relay.md): generated from the body
models of `relay.bodies` and the statuses each route answers, so the published contract cannot
drift from what the relay reads (tests/relay/test_relay_fuzz.py checks the relay against it)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

from pydantic import (
    BaseModel,
)
from pydantic.json_schema import models_json_schema

from triage.relay.bodies import FeedbackIn, ListingOut, ProblemOut, ScoreIn, TargetIn, WrittenOut

MODELS: tuple[type[BaseModel], ...] = (FeedbackIn, TargetIn, ScoreIn, WrittenOut, ListingOut, ProblemOut)


STATUSES = {
    200: "written to the store the job reads",
    201: "created (mode=create)",
    202: "durable in the relay's outbox; delivered to Langfuse from there",
    400: "malformed body or a missing or malformed id (the message names the field)",
    401: "missing or bad credentials",
    403: "a credential used beyond its grant",
    404: "nothing to replace or retract",
    405: "a method the path does not have (Allow lists the ones it has)",
    408: "the request's head or body did not arrive in time",
    409: "create-only: this voter already has feedback on this answer",
    413: "body over the limit",
    422: "undeclared score name (enforce) or a value wrong for its type",
    429: "per-client rate limit; see Retry-After",
    431: "the request's head is over the limit",
    503: "nothing written, send it again after Retry-After: no store configured, the outbox is full, "
    "the relay's ledger cannot commit, the relay is shutting down or over its connections",
}


#: what any call may be answered besides its own statuses (the frame and the server's limits)
_ANY = (400, 401, 408, 413, 429, 431, 503)


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _responses(ok: Mapping[int, type[BaseModel]], *errors: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for code, model in ok.items():
        out[str(code)] = {"description": STATUSES[code], "content": {"application/json": {"schema": _ref(model)}}}
    for code in sorted({*errors, *_ANY}):
        out[str(code)] = {"description": STATUSES[code], "content": {"application/json": {"schema": _ref(ProblemOut)}}}
    return out


def _body(model: type[BaseModel], *, required: bool = True) -> dict[str, Any]:
    return {"required": required, "content": {"application/json": {"schema": _ref(model)}}}


def _plain(description: str, media: str = "application/json") -> dict[str, Any]:
    return {"get": {"summary": description, "security": [], "responses": {"200": {"description": description,
            "content": {media: {"schema": {}}}}}}}  # fmt: skip


@cache
def openapi_document() -> dict[str, Any]:
    """What `/openapi.json` serves: the bodies and answers above, on the relay's paths."""
    _, defs = models_json_schema([(m, "validation") for m in MODELS], ref_template="#/components/schemas/{model}")
    query = [
        # an empty filter is refused (it would list nothing, or everything): the description says so
        {"name": n, "in": "query", "required": False, "schema": {"type": "string", "minLength": 1}}
        for n in ("traceId", "sessionId", "contextId", "reviewer", "author", "verdict", "cursor")
    ] + [
        {"name": "turn", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 0}},
        {"name": "limit", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 1}},
    ]
    written = {200: WrittenOut, 202: WrittenOut}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "triage relay",
            "version": "1",
            "description": "Votes and verdicts on an agent's answers, written to Langfuse (through a durable "
            "outbox) or to triage's embedded store. Auth: `Authorization: Bearer <gateway token or session JWT>`, "
            "or a feedback token from `triage.relay.issue_token` (also as `X-Feedback-Token`).",
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": defs.get("$defs", {}),
        },
        "security": [{"bearer": []}],
        "paths": {
            "/api/feedback": {
                "post": {
                    "summary": "Upsert a vote and/or a verdict (mode=create: 409 when the voter has one)",
                    "parameters": [
                        {"name": "mode", "in": "query", "schema": {"type": "string", "enum": ["upsert", "create"]}}
                    ],
                    "requestBody": _body(FeedbackIn),
                    "responses": _responses({**written, 201: WrittenOut}, 403, 409, 422),
                },
                "put": {
                    "summary": "Replace the voter's whole feedback on the answer (parts left out are cleared)",
                    "requestBody": _body(FeedbackIn),
                    "responses": _responses(written, 403, 404, 422),
                },
                "delete": {
                    "summary": "Retract feedback: your own, or an end user's on their behalf (author or userId)",
                    "requestBody": _body(TargetIn, required=False),
                    "responses": _responses(written, 403, 404),
                },
                "get": {
                    "summary": "List feedback by trace, session, reviewer or verdict (negative includes false alarms)",
                    "parameters": query,
                    "responses": _responses({200: ListingOut}, 403, 422),
                },
            },
            "/api/scores": {
                "post": {
                    "summary": "One score from a named channel, checked against the declared score model",
                    "requestBody": _body(ScoreIn),
                    "responses": _responses(written, 403, 422),
                }
            },
            "/healthz": _plain("The process answers"),
            "/readyz": {
                "get": {
                    "summary": "The store is reachable and writes succeed; the outbox's depth",
                    "security": [],
                    "responses": {
                        "200": {"description": "ready", "content": {"application/json": {"schema": {}}}},
                        "503": {"description": "not ready", "content": {"application/json": {"schema": {}}}},
                    },
                }
            },
            "/metrics": _plain("Prometheus metrics", "text/plain"),
            "/openapi.json": _plain("This document"),
        },
    }
