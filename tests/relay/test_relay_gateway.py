"""Issue 26, item 2: the relay takes real front ends' credentials, over real HTTP.

The session JWTs are signed with keys this test makes (RS256 and ES256), verified against a JWKS
file, a PEM public key, or a JWKS URL served on 127.0.0.1. Each test fails on the relay before
the change: it answered every session JWT 401, had no CORS and one rate bucket behind a proxy.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from tests.relay.test_relay import relay_config, rows, serving
from triage.errors import ConfigError
from triage.relay.access import SessionKeys, issue_token
from triage.relay.api import Credentials

ISSUER = "https://auth.example/realms/docs"
AUDIENCE = "docs-agent"


class Signer:
    def __init__(self, algorithm: str, kid: str) -> None:
        self.algorithm, self.kid = algorithm, kid
        self.key: Any = (
            rsa.generate_private_key(public_exponent=65537, key_size=2048)
            if algorithm == "RS256"
            else ec.generate_private_key(ec.SECP256R1())
        )

    def token(self, sub: str = "u-123", **claims: Any) -> str:
        now = int(time.time())
        body = {"sub": sub, "iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + 600, **claims}
        return jwt.encode(body, self.key, algorithm=self.algorithm, headers={"kid": self.kid})

    def jwk(self) -> dict[str, Any]:
        algorithm = jwt.algorithms.RSAAlgorithm if self.algorithm == "RS256" else jwt.algorithms.ECAlgorithm
        return {**json.loads(algorithm.to_jwk(self.key.public_key())), "kid": self.kid, "alg": self.algorithm}

    def pem(self) -> str:
        return self.key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ).decode()


@pytest.fixture(scope="module")
def rs() -> Signer:
    return Signer("RS256", "rs-1")


@pytest.fixture(scope="module")
def es() -> Signer:
    return Signer("ES256", "es-1")


def jwks_file(tmp_path: Path, *signers: Signer) -> str:
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [s.jwk() for s in signers]}), encoding="utf-8")
    return str(path)


def keys(source: str) -> SessionKeys:
    return SessionKeys(source, issuer=ISSUER, audience=AUDIENCE, leeway=30)


def hs256(claims: dict[str, Any], secret: str) -> str:
    """An HS256 token made by hand (pyjwt rightly refuses a public key as an HMAC secret)."""

    def part(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    head = part(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "rs-1"}).encode())
    body = part(json.dumps(claims).encode())
    signature = hmac.new(secret.encode(), f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{part(signature)}"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_session_jwt_is_the_end_user_rs256_and_es256(tmp_path: Path, rs: Signer, es: Signer) -> None:
    creds = Credentials(gateway_token="gw-token-0123456789", sessions=keys(jwks_file(tmp_path, rs, es)))
    with serving(tmp_path, credentials=creds) as (client, _):
        for signer, sub in ((rs, "kim"), (es, "lee")):
            vote = {"traceId": "t", "value": "down"}
            answer = client.post("/api/feedback", json=vote, headers=bearer(signer.token(sub)))
            assert answer.status_code == 200, answer.text
            assert answer.json()["author"] == f"user:{sub}"
        # the subject is the author: a body cannot name another user, nor a reviewer
        other = client.post("/api/feedback", json={"traceId": "t", "userId": "bob", "value": "up"},
                            headers=bearer(rs.token("kim")))  # fmt: skip
        assert other.status_code == 403
        member = client.post("/api/feedback", json={"traceId": "t", "reviewer": "kim", "verdict": "negative"},
                             headers=bearer(rs.token("kim")))  # fmt: skip
        assert member.status_code == 403
        # a session lists its own feedback only, and writes no channel scores
        mine = client.get("/api/feedback", params={"traceId": "t"}, headers=bearer(es.token("lee")))
        assert [item["author"] for item in mine.json()["data"]] == ["user:lee"]
        channel = client.post("/api/scores", json={"traceId": "t", "source": "x", "name": "n", "value": 1},
                              headers=bearer(rs.token("kim")))  # fmt: skip
        assert channel.status_code == 403
    assert sorted(r["userId"] for r in rows(tmp_path, "user_feedback")) == ["user:kim", "user:lee"]


@pytest.mark.parametrize(
    ("claims", "why"),
    [
        ({"iss": "https://evil.example"}, "not valid"),
        ({"aud": "another-app"}, "not valid"),
        ({"exp": int(time.time()) - 3600}, "expired"),
        ({"nbf": int(time.time()) + 3600}, "not valid"),
    ],
)
def test_a_session_jwt_with_the_wrong_issuer_audience_or_time_is_401(
    tmp_path: Path, rs: Signer, claims: dict[str, Any], why: str
) -> None:
    creds = Credentials(sessions=keys(jwks_file(tmp_path, rs)))
    with serving(tmp_path, credentials=creds) as (client, _):
        vote = {"traceId": "t", "value": "down"}
        answer = client.post("/api/feedback", json=vote, headers=bearer(rs.token(**claims)))
        assert answer.status_code == 401 and why in answer.json()["error"]
        assert answer.headers["WWW-Authenticate"] == "Bearer"


def test_keys_the_relay_does_not_hold_an_hs256_token_and_a_pem_key(tmp_path: Path, rs: Signer, es: Signer) -> None:
    creds = Credentials(sessions=keys(jwks_file(tmp_path, rs)))
    with serving(tmp_path, credentials=creds) as (client, _):
        foreign = client.post("/api/feedback", json={"traceId": "t", "value": "down"}, headers=bearer(es.token()))
        assert foreign.status_code == 401
        # a symmetric token signed with the public key's text as its secret: the classic confusion
        forged = hs256({"sub": "x", "iss": ISSUER, "aud": AUDIENCE, "exp": int(time.time()) + 60}, rs.pem())
        refused = client.post("/api/feedback", json={"traceId": "t", "value": "down"}, headers=bearer(forged))
        assert refused.status_code == 401 and "HS256" in refused.json()["error"]
    pem = tmp_path / "es.pem"
    pem.write_text(es.pem(), encoding="utf-8")
    with serving(tmp_path / "pem", credentials=Credentials(sessions=keys(str(pem)))) as (client, _):
        answer = client.post("/api/feedback", json={"traceId": "t", "value": "down"}, headers=bearer(es.token("pem")))
        assert answer.status_code == 200 and answer.json()["author"] == "user:pem"


def test_keys_from_a_jwks_url_and_unreadable_keys_are_a_configuration_error(tmp_path: Path, rs: Signer) -> None:
    body = json.dumps({"keys": [rs.jwk()]}).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the standard library's name
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/jwks"
        with serving(tmp_path, credentials=Credentials(sessions=keys(url))) as (client, _):
            answer = client.post("/api/feedback", json={"traceId": "t", "value": "up"}, headers=bearer(rs.token("web")))
            assert answer.status_code == 200 and answer.json()["author"] == "user:web"
    finally:
        server.shutdown()
    (tmp_path / "junk.json").write_text("{not keys", encoding="utf-8")
    for source in (str(tmp_path / "missing.json"), str(tmp_path / "junk.json")):
        with pytest.raises(ConfigError):
            keys(source)


def test_the_feedback_token_crosses_a_gateway_that_owns_authorization(tmp_path: Path, rs: Signer) -> None:
    creds = Credentials(signing_key="signing-key-0123456789abcdef0123", sessions=keys(jwks_file(tmp_path, rs)))
    token = issue_token("signing-key-0123456789abcdef0123", subject="kim", trace_id="t")
    with serving(tmp_path, credentials=creds) as (client, _):
        # the gateway keeps its session JWT in Authorization; the feedback token rides beside it
        headers = {**bearer(rs.token("kim")), "X-Feedback-Token": token}
        answer = client.post("/api/feedback", json={"traceId": "t", "value": "down"}, headers=headers)
        assert answer.status_code == 200 and answer.json()["author"] == "user:kim"
        elsewhere = client.post("/api/feedback", json={"traceId": "u", "value": "down"}, headers=headers)
        assert elsewhere.status_code == 403  # the token binds its answer


def test_a_feedback_token_binds_its_answer_and_nothing_in_the_body_moves_it(tmp_path: Path) -> None:
    creds = Credentials(signing_key="signing-key-0123456789abcdef0123")
    token = issue_token("signing-key-0123456789abcdef0123", subject="kim", trace_id="t")
    with serving(tmp_path, credentials=creds) as (client, _):
        body = {"traceId": "t", "sessionId": "someone-elses-chat", "turn": 3, "value": "down"}
        answer = client.post("/api/feedback", json=body, headers=bearer(token))
        assert answer.status_code == 200 and "sessionId" not in answer.json()
        [mine] = client.get("/api/feedback", params={"traceId": "t"}, headers=bearer(token)).json()["data"]
        assert "sessionId" not in mine and "turn" not in mine
    [row] = rows(tmp_path, "user_feedback")
    assert row["sessionId"] is None and "someone-elses-chat" not in row["metadata"]


def test_cors_preflight_and_headers_for_allowed_origins_only(tmp_path: Path) -> None:
    config = relay_config(cors_origins=["https://www.kubeflow.org"])
    with serving(tmp_path, config=config) as (client, _):
        pre = client.options("/api/feedback", headers={"Origin": "https://www.kubeflow.org",
                                                       "Access-Control-Request-Method": "POST"})  # fmt: skip
        assert pre.status_code == 204
        assert pre.headers["Access-Control-Allow-Origin"] == "https://www.kubeflow.org"
        assert set(pre.headers["Access-Control-Allow-Methods"].split(", ")) == {"GET", "POST", "PUT", "DELETE"}
        assert "X-Feedback-Token" in pre.headers["Access-Control-Allow-Headers"]
        post = client.post("/api/feedback", json={"traceId": "t", "value": "up"},
                           headers={"Origin": "https://www.kubeflow.org"})  # fmt: skip
        assert post.headers["Access-Control-Allow-Origin"] == "https://www.kubeflow.org"
        evil = client.options("/api/feedback", headers={"Origin": "https://evil.example"})
        assert evil.status_code == 403 and "Access-Control-Allow-Origin" not in evil.headers
        plain = client.post("/api/feedback", json={"traceId": "t", "value": "up"}, headers={"Origin": "https://evil.example"})
        assert "Access-Control-Allow-Origin" not in plain.headers
        wrong = client.patch("/api/feedback", json={})
        assert wrong.status_code == 405
        assert set(wrong.headers["Allow"].split(", ")) == {"GET", "POST", "PUT", "DELETE", "OPTIONS"}
    assert relay_config(cors_origins=["kubeflow.org"]).relay.problems()


def test_behind_a_trusted_proxy_each_forwarded_client_has_its_own_bucket(tmp_path: Path) -> None:
    vote = {"traceId": "t", "value": "up"}
    config = relay_config(rate_per_second=0.001, rate_burst=1, trusted_proxies=["127.0.0.0/8"])
    with serving(tmp_path, config=config) as (client, _):
        for address in ("203.0.113.7", "203.0.113.8"):
            # a client's own claim is ignored: the proxy appends the address it saw
            headers = {"X-Forwarded-For": f"10.9.9.9, {address}"}
            assert client.post("/api/feedback", json=vote, headers=headers).status_code == 200
            assert client.post("/api/feedback", json=vote, headers=headers).status_code == 429
    untrusted = relay_config(rate_per_second=0.001, rate_burst=1)
    with serving(tmp_path / "b", config=untrusted) as (client, _):
        assert client.post("/api/feedback", json=vote, headers={"X-Forwarded-For": "203.0.113.7"}).status_code == 200
        assert client.post("/api/feedback", json=vote, headers={"X-Forwarded-For": "203.0.113.8"}).status_code == 429


def test_a_chunked_delete_is_read_from_its_body(tmp_path: Path) -> None:
    with serving(tmp_path) as (client, _):
        assert client.post("/api/feedback", json={"traceId": "t", "userId": "bob", "value": "up"}).status_code == 200

        def chunks() -> Iterator[bytes]:
            yield b'{"traceId": "t", '
            yield b'"userId": "bob"}'

        gone = client.request("DELETE", "/api/feedback", content=chunks())
        assert gone.status_code == 200, gone.text
    assert rows(tmp_path, "user_feedback") == []


def test_a_short_secret_is_refused_off_loopback_only() -> None:
    from triage.relay.server import check_startup

    config = relay_config()
    short = Credentials(gateway_token="x")
    with pytest.raises(ConfigError, match="shorter than 32"):
        check_startup(config, short, "0.0.0.0")
    check_startup(config, short, "127.0.0.1")  # a laptop may use any token
    check_startup(config, Credentials(gateway_token="g" * 32, signing_key="k" * 40), "0.0.0.0")


# -- issue 37 item 6: the relay's edges -------------------------------------------------------------


def test_a_token_naming_the_other_allowed_algorithm_is_401_not_500(tmp_path: Path, rs: Signer) -> None:
    """`{"alg":"ES256"}` against an RS256 key: the key and the header disagree, a refusal (it was a 500)."""
    creds = Credentials(sessions=keys(jwks_file(tmp_path, rs)))
    pem = tmp_path / "rs.pem"
    pem.write_text(rs.pem(), encoding="utf-8")
    by_pem = Credentials(sessions=keys(str(pem)))
    for where, credentials in (("jwks", creds), ("pem", by_pem)):
        with serving(tmp_path / where, credentials=credentials) as (client, _):
            for token in ("eyJhbGciOiJFUzI1NiJ9.e30.AAAA", "eyJhbGciOiJFUzI1NiIsImtpZCI6InJzLTEifQ.e30.AAAA"):
                answer = client.post("/api/feedback", json={"traceId": "t", "value": "down"}, headers=bearer(token))
                assert answer.status_code == 401, (where, token, answer.text)


@pytest.mark.parametrize("sub", [None, 42, "", "  ", ["u"]])
def test_a_session_token_whose_subject_is_not_a_name_is_401(tmp_path: Path, rs: Signer, sub: Any) -> None:
    creds = Credentials(sessions=keys(jwks_file(tmp_path, rs)))
    with serving(tmp_path, credentials=creds) as (client, _):
        answer = client.post("/api/feedback", json={"traceId": "t", "value": "down"}, headers=bearer(rs.token(sub=sub)))
        assert answer.status_code == 401, answer.text


@pytest.mark.parametrize("sub", [None, 42, "", ["u"]])
def test_a_feedback_token_whose_subject_is_not_a_name_is_refused(sub: Any) -> None:
    """A feedback token with `"sub": null` voted as `user:None`."""
    from triage.relay.access import PREFIX, TokenError, _b64, _sign, verify_token

    key = "k" * 32
    payload = _b64(json.dumps({"a": "trace:t", "sub": sub, "exp": int(time.time()) + 60}).encode())
    with pytest.raises(TokenError):
        verify_token(key, f"{PREFIX}{payload}.{_sign(key, payload)}")
