"""The OpenAPI description the relay serves at `/openapi.json`."""

from __future__ import annotations

from typing import Any

_ANSWER = {
    "traceId": {"type": "string", "description": "the answer's trace (or sessionId + turn)"},
    "sessionId": {"type": "string", "description": "the chat session; `contextId` is accepted too"},
    "contextId": {"type": "string", "description": "the docs agent's name for sessionId"},
    "turn": {"type": "integer", "minimum": 0, "description": "0-based turn of the answer in the session"},
    "turnNumber": {"type": "integer", "minimum": 1, "description": "1-based turn (K2View's form)"},
}
_FEEDBACK = {
    "type": "object",
    "properties": {
        **_ANSWER,
        "value": {
            "description": 'the vote: up/down, true/false or 1/0; "" or absent for none',
            "oneOf": [
                {"type": "string", "enum": ["up", "down", ""]},
                {"type": "boolean"},
                {"type": "integer"},
            ],
        },
        "comment": {
            "type": "string",
            "maxLength": 4000,
            "description": "the vote's comment; alone it is a note",
        },
        "userId": {"type": "string", "description": "the end user (gateway only); stored as user:<userId>"},
        "reviewer": {"type": "string", "description": "a project member writing a verdict (gateway only)"},
        "verdict": {"type": "string", "enum": ["positive", "negative", "false_alarm"]},
        "issue_category": {
            "type": "string",
            "maxLength": 64,
            "description": "wrong_answer, missing_info, wrong_tool, refused, unsafe, other, or any string",
        },
        "corrected_answer": {"type": "string", "description": "stored as a CORRECTION score (traces only)"},
        "expected_tool_behavior": {"type": "string", "maxLength": 500},
        "note": {"type": "string", "maxLength": 500},
        "environment": {"type": "string", "default": "default"},
    },
    "example": {"contextId": "c-42", "turn": 0, "value": "down", "comment": "the link is dead"},
}
_WRITTEN = {
    "type": "object",
    "properties": {
        "ids": {"type": "array", "items": {"type": "string"}},
        "cleared": {"type": "array", "items": {"type": "string"}},
        "stored": {"type": "string", "enum": ["store", "outbox", "langfuse"]},
        "author": {"type": "string"},
    },
}
_ERROR = {"type": "object", "properties": {"error": {"type": "string"}}}


def _responses(*codes: int) -> dict[str, Any]:
    text = {
        200: "written to the store the job reads",
        201: "created (mode=create)",
        202: "durable in the relay's outbox; delivered to Langfuse from there",
        400: "malformed body or a missing id (the message names the field)",
        401: "missing or bad credentials",
        403: "a credential used beyond its grant",
        404: "nothing to replace or retract",
        409: "create-only: this voter already has feedback on this answer",
        413: "body over the limit",
        422: "undeclared score name (enforce) or a value wrong for its type",
        429: "per-client rate limit; see Retry-After",
        503: "nothing written, send it again after Retry-After: no store configured, the outbox is full, "
        "the relay's ledger cannot commit, or the relay is shutting down",
    }
    out: dict[str, Any] = {}
    for code in codes:
        schema = _WRITTEN if code < 300 else _ERROR
        out[str(code)] = {"description": text[code], "content": {"application/json": {"schema": schema}}}
    return out


_WRITE_ERRORS = (400, 401, 403, 413, 422, 429, 503)


def openapi_document() -> dict[str, Any]:
    body = {"required": True, "content": {"application/json": {"schema": _FEEDBACK}}}
    query = [
        {"name": n, "in": "query", "required": False, "schema": {"type": "string"}}
        for n in ("traceId", "sessionId", "turn", "reviewer", "verdict")
    ]
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "triage relay",
            "version": "1",
            "description": "Votes and verdicts on an agent's answers, written to Langfuse (through a durable "
            "outbox) or to triage's embedded store. Auth: `Authorization: Bearer <gateway token>` or a "
            "feedback token from `triage.relay.tokens.issue_token`.",
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"Feedback": _FEEDBACK, "Written": _WRITTEN, "Error": _ERROR},
        },
        "security": [{"bearer": []}],
        "paths": {
            "/api/feedback": {
                "post": {
                    "summary": "Upsert a vote and/or a verdict (mode=create: 409 when the voter has one)",
                    "parameters": [
                        {
                            "name": "mode",
                            "in": "query",
                            "schema": {"type": "string", "enum": ["upsert", "create"]},
                        }
                    ],
                    "requestBody": body,
                    "responses": _responses(200, 201, 202, *_WRITE_ERRORS, 409),
                },
                "put": {
                    "summary": "Replace the voter's whole feedback on the answer (parts left out are cleared)",
                    "requestBody": body,
                    "responses": _responses(200, 202, *_WRITE_ERRORS, 404),
                },
                "delete": {
                    "summary": "Retract feedback: your own, or an end user's on their behalf (author or userId)",
                    "requestBody": {
                        "required": False,
                        "content": {"application/json": {"schema": _FEEDBACK}},
                    },
                    "responses": _responses(200, 202, 400, 401, 403, 404, 413, 429, 503),
                },
                "get": {
                    "summary": "List feedback by trace, session, reviewer or verdict (negative includes false alarms)",
                    "parameters": query,
                    "responses": {
                        "200": {"description": "the feedback, grouped per answer and author"},
                        **_responses(400, 401, 403, 422, 429),
                    },
                },
            },
            "/api/scores": {
                "post": {
                    "summary": "One score from a named channel, checked against the declared score model",
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "required": ["source", "name", "value"],
                                    "properties": {
                                        **_ANSWER,
                                        "source": {"type": "string"},
                                        "name": {"type": "string"},
                                        "value": {},
                                        "comment": {"type": "string"},
                                    },
                                }
                            }
                        },
                    },
                    "responses": _responses(200, 202, *_WRITE_ERRORS),
                }
            },
            "/healthz": {
                "get": {
                    "summary": "The process answers",
                    "security": [],
                    "responses": {"200": {"description": "ok"}},
                }
            },
            "/readyz": {
                "get": {
                    "summary": "The store is reachable; the outbox's depth",
                    "security": [],
                    "responses": {"200": {"description": "ready"}, "503": {"description": "not ready"}},
                }
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics",
                    "security": [],
                    "responses": {"200": {"description": "text"}},
                }
            },
            "/openapi.json": {
                "get": {
                    "summary": "This document",
                    "security": [],
                    "responses": {"200": {"description": "JSON"}},
                }
            },
        },
    }
