"""Who may call the relay, and how often.

Feedback tokens: a signed, expiring grant to vote on one answer as one subject (HMAC-SHA256). The
agent issues one with each answer it shows (`issue_token`, with the relay's signing key) and the
browser sends it as `Authorization: Bearer <token>`; the relay checks it (`verify_token`). Like
LangSmith's presigned feedback tokens: no other credential reaches the browser. A token is
`<payload>.<signature>`, both base64url without padding; the payload is JSON:
`{"a": answer, "sub": subject, "exp": unix seconds}` where `answer` is `trace:<id>` or
`session:<id>:<turn>` (0-based turn).

Session JWTs: the gateway's browsers may hold one instead (`SessionKeys` verifies it).

Rate limits: a token bucket per client (`RateLimiter`), the client's address believed from
`X-Forwarded-For` only behind a trusted proxy (`Proxies`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from starlette.requests import Request

from triage.errors import ConfigError

PREFIX = "tfb1."  # tells a feedback token from the gateway's bearer token


class TokenError(Exception):
    """A token that is malformed, badly signed or expired (a feedback token or a session JWT)."""


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
    # bytes: `compare_digest` raises on a str with non-ASCII characters (a 500, before)
    if not hmac.compare_digest(_sign(key, payload).encode(), signature.encode("utf-8", "replace")):
        raise TokenError("feedback token signature does not match")
    try:
        body = json.loads(_unb64(payload))
        answer, subject = body["a"], body["sub"]
        grant = Grant(answer=str(answer), subject=str(subject), expires=int(body["exp"]))
    except (ValueError, KeyError, TypeError):
        raise TokenError("malformed feedback token") from None
    # `str(None)` is "None": a token whose subject is no name would vote as `user:None`
    if not isinstance(answer, str) or not isinstance(subject, str) or not subject.strip():
        raise TokenError("the feedback token names no subject")
    if grant.expires < (now if now is not None else time.time()):
        raise TokenError("feedback token expired")
    return grant


# -- the gateway's session JWTs -----------------------------------------------------------------

#: what a browser's session token may be signed with (asymmetric only: the relay holds no secret)
SESSION_ALGORITHMS = ("RS256", "ES256")


class SessionKeys:
    """Verifies the session JWT a gateway forwards (the Kubeflow docs agent's browsers hold one, an
    RS256 token the Istio gateway validates): signature against the configured keys (a JWKS file or
    URL, or a PEM public key), issuer, audience, expiry and not-before with `leeway` seconds of clock
    skew. The verified `sub` is the end user."""

    def __init__(
        self, source: str, *, issuer: str | None = None, audience: str | None = None, leeway: float = 60.0
    ) -> None:
        self.issuer = issuer
        self.audience = audience
        self.leeway = leeway
        self._client: jwt.PyJWKClient | None = None
        self._keys: list[jwt.PyJWK] = []
        if source.startswith(("https://", "http://")):
            # fetched once, then on an unknown `kid` (a rotated key); cached in between
            self._client = jwt.PyJWKClient(source, cache_keys=True, lifespan=300, timeout=5)
            return
        try:
            text = Path(source).read_text(encoding="utf-8")
        except OSError as ex:
            raise ConfigError(f"the session keys {source} cannot be read: {ex.strerror or ex}") from None
        try:
            if text.lstrip().startswith("-----BEGIN"):
                self._keys = [_pem_key(text)]
            else:
                self._keys = list(jwt.PyJWKSet.from_json(text).keys)
        except (jwt.PyJWKError, jwt.PyJWKSetError, ValueError, TypeError) as ex:
            raise ConfigError(f"the session keys in {source} are no JWKS or PEM public key: {ex}") from None
        if not self._keys:
            raise ConfigError(f"the session keys in {source} hold no usable key")

    @staticmethod
    def looks_like(token: str) -> bool:
        """A compact JWS: three base64url parts (the feedback token has two, the gateway's secret none)."""
        return token.count(".") == 2 and not token.startswith(PREFIX)

    def subject(self, token: str) -> str:
        """The verified subject; `TokenError` saying why the token is refused."""
        try:
            header = jwt.get_unverified_header(token)
            algorithm = header.get("alg")
            if algorithm not in SESSION_ALGORITHMS:
                raise TokenError(f"session token signed with {algorithm!r}: only {', '.join(SESSION_ALGORITHMS)}")
            key = self._key(token, header.get("kid"))
            if key.algorithm_name != algorithm:
                # an ES256 header on an RSA key (or the reverse): pyjwt would hand the wrong key type
                # to the verifier, which raises outside its error tree (a 500, before)
                raise TokenError(f"the session token says {algorithm}, its key is {key.algorithm_name}")
            claims = jwt.decode(
                token,
                key.key,
                algorithms=[algorithm],
                issuer=self.issuer,
                audience=self.audience,
                leeway=self.leeway,
                options={"require": ["exp", "sub"], "verify_aud": self.audience is not None},
            )
        except jwt.ExpiredSignatureError:
            raise TokenError("the session token has expired") from None
        except (jwt.PyJWTError, jwt.PyJWKClientError) as ex:
            raise TokenError(f"the session token is not valid: {type(ex).__name__}") from None
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject.strip() or not subject.isprintable() or len(subject) > 200:
            raise TokenError("the session token names no subject")
        return subject

    def _key(self, token: str, kid: object) -> jwt.PyJWK:
        if self._client is not None:
            return self._client.get_signing_key_from_jwt(token)
        for key in self._keys:
            if kid is None or key.key_id in (None, kid):  # a PEM key has no id: it is the one key
                return key
        raise TokenError("the session token's key is not among the configured keys")


def _pem_key(text: str) -> jwt.PyJWK:
    """A PEM public key (RSA or EC P-256) as a JWK."""
    public = serialization.load_pem_public_key(text.encode())
    if isinstance(public, rsa.RSAPublicKey):
        return jwt.PyJWK(json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(public)), algorithm="RS256")
    if isinstance(public, ec.EllipticCurvePublicKey):
        return jwt.PyJWK(json.loads(jwt.algorithms.ECAlgorithm.to_jwk(public)), algorithm="ES256")
    raise ValueError(f"a {type(public).__name__} is neither RSA nor EC")


# -- rate limits -------------------------------------------------------------------------------


class RateLimiter:
    """A token bucket per client: `rate` requests per second sustained, `burst` at once."""

    def __init__(self, rate: float, burst: int, now: Callable[[], float], max_clients: int = 100_000) -> None:
        self.rate = rate
        self.burst = burst
        self.now = now
        self.max_clients = max_clients
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # client -> (tokens, at)
        self._lock = threading.Lock()

    def take(self, client: str) -> float | None:
        """None when the request may go; else the seconds to wait (a 429's Retry-After)."""
        now = self.now()
        with self._lock:
            tokens, at = self._buckets.pop(client, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) * self.rate)
            if tokens >= 1:
                self._buckets[client] = (tokens - 1, now)
                wait = None
            else:
                self._buckets[client] = (tokens, now)
                wait = (1 - tokens) / self.rate
            while len(self._buckets) > self.max_clients:  # bounded: the longest idle go first
                self._buckets.popitem(last=False)
        return None if wait is None else max(1.0, math.ceil(wait))


class Proxies:
    """The client's address for its rate bucket: the connection's peer, or, when that peer is a
    trusted proxy (`[relay] trusted_proxies`), the nearest address in `X-Forwarded-For` that is not
    one (a client can write anything into the header; only the proxies' own entries are believed).
    Behind a gateway with no trusted proxy configured, every anonymous vote shares one bucket."""

    def __init__(self, trusted: list[str]) -> None:
        self.networks = [ipaddress.ip_network(t, strict=False) for t in trusted]

    def _trusted(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address.strip())
        except ValueError:
            return False
        return any(ip in network for network in self.networks)

    def client(self, request: Request) -> str:
        peer = request.client.host if request.client else "?"
        if not self.networks or not self._trusted(peer):
            return peer
        hops = [h.strip() for h in ",".join(request.headers.getlist("x-forwarded-for")).split(",") if h.strip()]
        for hop in reversed(hops):
            if not self._trusted(hop):
                return hop
        return peer
