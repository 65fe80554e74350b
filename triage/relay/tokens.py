"""Feedback tokens: a signed, expiring grant to vote on one answer as one subject (HMAC-SHA256).

The agent issues one with each answer it shows (`issue_token`, with the relay's signing key) and
the browser sends it as `Authorization: Bearer <token>`; the relay checks it (`verify_token`).
Like LangSmith's presigned feedback tokens: no other credential reaches the browser.

A token is `<payload>.<signature>`, both base64url without padding; the payload is JSON:
`{"a": answer, "sub": subject, "exp": unix seconds}` where `answer` is `trace:<id>` or
`session:<id>:<turn>` (0-based turn).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from dataclasses import dataclass

PREFIX = "tfb1."  # tells a feedback token from the gateway's bearer token


class TokenError(Exception):
    """A token that is malformed, badly signed or expired."""


@dataclass(frozen=True)
class Grant:
    answer: str
    subject: str
    expires: int


def answer_key(trace_id: str | None = None, session_id: str | None = None, turn: int | None = None) -> str:
    """The one answer a vote is about: a trace, or a session plus its 0-based turn."""
    if trace_id:
        return f"trace:{trace_id}"
    if session_id is not None and turn is not None:
        return f"session:{session_id}:{turn}"
    raise ValueError("an answer is a trace id, or a session id and a turn")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _sign(key: str, payload: str) -> str:
    return _b64(hmac.new(key.encode(), payload.encode(), hashlib.sha256).digest())


def issue_token(
    key: str,
    *,
    subject: str,
    trace_id: str | None = None,
    session_id: str | None = None,
    turn: int | None = None,
    ttl_seconds: int = 3 * 3600,
    now: float | None = None,
) -> str:
    """A token for `subject` (the end user, as the agent knows them) to vote on one answer."""
    if not key:
        raise ValueError("a signing key is needed (TRIAGE_RELAY_SIGNING_KEY)")
    expires = int((now if now is not None else time.time()) + ttl_seconds)
    body = {"a": answer_key(trace_id, session_id, turn), "sub": subject, "exp": expires}
    payload = _b64(json.dumps(body, separators=(",", ":")).encode())
    return f"{PREFIX}{payload}.{_sign(key, payload)}"


def is_feedback_token(token: str) -> bool:
    return token.startswith(PREFIX)


def verify_token(key: str, token: str, now: float | None = None) -> Grant:
    """The grant a token carries; raises `TokenError` (never echoing the token)."""
    try:
        payload, signature = token.removeprefix(PREFIX).split(".")
    except ValueError:
        raise TokenError("malformed feedback token") from None
    if not hmac.compare_digest(_sign(key, payload), signature):
        raise TokenError("feedback token signature does not match")
    try:
        body = json.loads(_unb64(payload))
        grant = Grant(answer=str(body["a"]), subject=str(body["sub"]), expires=int(body["exp"]))
    except (ValueError, KeyError, TypeError):
        raise TokenError("malformed feedback token") from None
    if grant.expires < (now if now is not None else time.time()):
        raise TokenError("feedback token expired")
    return grant
