"""Every exchange between LangfuseBackend and the stand-in, checked against Langfuse's OpenAPI file.

Requests (parameters, auth, bodies) and response bodies are validated with openapi-core against
../shared/langfuse/openapi.yml. Known skew, not a bug of either side: that file is the OLDER
contract of `POST /api/public/scores` (one `CreateScoreRequest`, `200 {id}`, no `timestamp`).
SDK 5.x (whose contract triage speaks) sends a JSON list and gets `202 {"message"}` or `207 {accepted,
rejected, errors}`. So a list body is validated item by item against `CreateScoreRequest` (its
`timestamp` is an extra property the file allows), and 202/207 answers, which the file does not
list, are checked against the SDK's own response models instead. 429 and 5xx answers are not in
the file either and are not validated.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.doubles.langfuse_server import LangfuseStandIn, LoggedRequest
from tests.sources.test_langfuse import NOW, WINDOW, backend_for, layer_score, session_vote, trace
from triage.sources.langfuse.wire import BatchAnswer, BatchResults

SPEC = Path(__file__).resolve().parents[3] / "shared" / "langfuse" / "openapi.yml"


@pytest.fixture(scope="module")
def openapi() -> Any:
    if not SPEC.is_file():
        pytest.skip(f"the Langfuse OpenAPI file is not here ({SPEC}); it ships in ../shared")
    from openapi_core import Config, OpenAPI

    # the file is not strictly OpenAPI 3.0 (it uses `const`), so skip validating the spec itself
    return OpenAPI.from_file_path(str(SPEC), config=Config(spec_validator_cls=None))


def _request(entry: LoggedRequest, body: bytes | None = None) -> Any:
    from openapi_core.testing import MockRequest

    args = {k: v[-1] for k, v in entry.query.items()}
    return MockRequest(
        "http://127.0.0.1",
        entry.method,
        entry.path,
        args=args,
        headers={"Authorization": entry.request_headers.get("authorization", "")},
        data=entry.request_body if body is None else body,
    )


def validate(openapi: Any, entry: LoggedRequest) -> str:
    """Validate one logged exchange; returns what was checked (for the coverage assertion)."""
    from langfuse.api.scores.types.create_score_batch_results import CreateScoreBatchResults
    from langfuse.api.scores.types.create_scores_response import CreateScoresResponse
    from openapi_core.testing import MockResponse
    from pydantic import TypeAdapter

    is_list = entry.method == "POST" and entry.request_body.lstrip().startswith(b"[")
    if is_list:
        for item in json.loads(entry.request_body):
            openapi.validate_request(_request(entry, json.dumps(item).encode()))
    else:
        openapi.validate_request(_request(entry))
    if entry.status in {202, 207}:
        # the SDK 5.x contract (see the module docstring); triage reads it with its own copy of
        # the SDK's models (it does not import the SDK), which must agree
        answer = json.loads(entry.response_body)
        sdk = TypeAdapter(CreateScoresResponse).validate_python(answer)
        ours = BatchAnswer.validate_python(answer)
        assert isinstance(ours, BatchResults) == isinstance(sdk, CreateScoreBatchResults)
        assert ours.model_dump() == sdk.model_dump()
        return f"{entry.method} {entry.path} {entry.status} (SDK contract)"
    if entry.status in {200, 400, 401, 404}:
        response = MockResponse(entry.response_body, status_code=entry.status)
        openapi.validate_response(_request(entry), response)
        path = "/api/public/traces" if entry.path.startswith("/api/public/traces/") else entry.path
        return f"{entry.method} {path} {entry.status}"
    return "unvalidated"


@pytest.fixture
def busy_server() -> Iterator[LangfuseStandIn]:
    records = [trace(f"t{i}", session_id="s1" if i < 3 else None) for i in range(120)]
    records.append(session_vote("sv", "s1", 1, NOW - timedelta(hours=1)))
    with LangfuseStandIn(records=records) as srv:
        yield srv


def test_every_exchange_of_a_run_matches_the_spec(openapi: Any, busy_server: LangfuseStandIn) -> None:
    srv = busy_server
    srv.add_duplicate_observation("t0-gen")
    with backend_for(srv) as backend:
        votes = backend.votes("user_feedback", *WINDOW).votes
        backend.session_traces(["s1"])
        backend.observations([v.trace_id for v in votes if v.trace_id])
        backend.triaged([f"t{i}" for i in range(120)], "triage_layer", "1")
        backend.write_scores([layer_score(f"t{i}") for i in range(120)])
        backend.trace_url("t0")
    # a refused request and an invalid list item, for the error shapes
    httpx.get(f"{srv.url}/api/public/v3/scores", params={"limit": 101}, auth=(srv.public_key, srv.secret_key))
    httpx.get(f"{srv.url}/api/public/projects", auth=(srv.public_key, "wrong"))
    bad = {"name": "x", "value": "v", "dataType": "CATEGORICAL", "traceId": "t0", "sessionId": "s1"}
    answer = httpx.post(f"{srv.url}/api/public/scores", json=[bad], auth=(srv.public_key, srv.secret_key))
    assert answer.status_code == 207 and answer.json()["rejected"] == 1

    checked = {validate(openapi, entry) for entry in srv.log}
    assert {
        "GET /api/public/v3/scores 200",
        "GET /api/public/v2/observations 200",
        "POST /api/public/scores 202 (SDK contract)",
        "POST /api/public/scores 207 (SDK contract)",
        "GET /api/public/projects 200",
        "GET /api/public/projects 401",
        "GET /api/public/v3/scores 400",
    } <= checked
    assert "unvalidated" not in checked


def test_legacy_and_single_object_exchanges_match_the_spec(openapi: Any) -> None:
    records = [trace("a", session_id="s"), trace("b", session_id="s")]
    with LangfuseStandIn(records=records, legacy=True, score_contract="single") as srv:
        with backend_for(srv) as backend:
            backend.observations(["a", "b", "gone"])
            backend.session_traces(["s"])
            outcome = backend.write_scores([layer_score("a")])
        assert outcome.failed == {}
        checked = {validate(openapi, entry) for entry in srv.log}
    assert {
        "GET /api/public/v2/observations 404",
        "GET /api/public/traces 200",
        "GET /api/public/traces 404",
        "GET /api/public/sessions/s 200",
        "POST /api/public/scores 200",
        "POST /api/public/scores 400",
    } <= checked


def test_the_validator_rejects_what_the_spec_forbids(openapi: Any) -> None:
    """The checks above can fail: a response missing a required field is caught."""
    from openapi_core.testing import MockResponse

    entry = LoggedRequest("GET", "/api/public/v3/scores", {"limit": ["10"]}, 200)
    entry.request_headers = {"authorization": "Basic eDp5"}
    bad = {"data": [{"id": "x", "name": "n", "dataType": "BOOLEAN", "value": True}], "meta": {"limit": 10}}
    with pytest.raises(Exception, match="(?i)valid"):
        openapi.validate_response(_request(entry), MockResponse(json.dumps(bad).encode()))
    wrong_param = LoggedRequest("GET", "/api/public/v3/scores", {"limit": ["many"]}, 200)
    wrong_param.request_headers = entry.request_headers
    with pytest.raises(Exception, match="(?i)limit|valid|cast"):
        openapi.validate_request(_request(wrong_param))
