"""Issue 26, item 5: the relay against its own OpenAPI description, by schemathesis, over real
HTTP: every call it generates (valid bodies, and bodies that break the schema) is answered with a
status the description lists, never a 5xx, with a body that fits that status's schema. Bounded in
examples per operation, so the whole run takes some seconds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.relay.test_relay import relay_config, serving
from triage.relay.api import Credentials

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is in the test extra")

EXAMPLES = 100
TOKEN = "fuzz-gateway-token-0123456789abcdef"


@pytest.fixture(scope="module")
def relay_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("fuzz")
    # generous rates: the fuzzer is one client sending hundreds of requests
    config = relay_config(rate_per_second=10_000, rate_burst=10_000, mode="monitor")
    with serving(tmp, config=config, credentials=Credentials(gateway_token=TOKEN)) as (client, _):
        yield str(client.base_url).rstrip("/")


def test_every_operation_answers_as_described(relay_url: str) -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis.generation import GenerationMode
    from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

    schema = schemathesis.openapi.from_url(f"{relay_url}/openapi.json")
    failures: list[str] = []
    modes = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    for operation, mode in ((r.ok(), m) for r in schema.get_all_operations() for m in modes):

        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(case=operation.as_strategy(generation_mode=mode))
        def check(case: Any) -> None:
            # not judged: whether a schema-valid body is meaningful (an answer needs a traceId, or a
            # sessionId and a turn; a vote needs a value, a comment or a verdict: else a 4xx that
            # names the field) and whether a schema-violating request is refused (unknown query
            # parameters and the aliases are accepted, as documented). Every other check holds:
            # no 5xx, only described statuses, bodies and content types that fit the description
            case.call_and_validate(
                base_url=relay_url,
                headers={"Authorization": f"Bearer {TOKEN}"},
                excluded_checks=[positive_data_acceptance, negative_data_rejection],
            )

        try:
            check()
        except Unsatisfiable:
            pass  # an operation with nothing to break (no parameter, no body) has no negative case
        except Exception as ex:  # collect every operation's first failure, then fail once
            failures.append(f"{operation.label} ({mode.value}): {str(ex)[:2000]}")
    assert not failures, "\n\n".join(failures)


def test_the_description_is_generated_from_the_models(tmp_path: Path) -> None:
    from triage.relay.bodies import MAX_COMMENT, MAX_ID
    from triage.relay.openapi import openapi_document

    doc = openapi_document()
    feedback = doc["components"]["schemas"]["FeedbackIn"]["properties"]
    assert feedback["comment"]["anyOf"][0]["maxLength"] == MAX_COMMENT
    assert feedback["traceId"]["anyOf"][0]["maxLength"] == MAX_ID
    assert set(doc["components"]["schemas"]) >= {"FeedbackIn", "ScoreIn", "TargetIn", "WrittenOut", "ListingOut"}


def test_the_description_refuses_what_the_relay_refuses() -> None:
    """Issue 37: the description accepted a `sessionId` without its turn and an empty `traceId`
    filter, both refused by the relay (schemathesis's positive-data check: 9 mismatches)."""
    import jsonschema

    from triage.relay.openapi import openapi_document

    document = openapi_document()
    defs = document["components"]["schemas"]

    def valid(model: str, body: dict[str, Any]) -> bool:
        # the model's schema as the root, its `#/components/schemas/...` references resolvable
        root = {**defs[model], "components": document["components"]}
        return bool(jsonschema.validators.Draft202012Validator(root).is_valid(body))

    for model in ("FeedbackIn", "TargetIn", "ScoreIn"):
        assert not valid(model, {"sessionId": "s-1", "value": "down"}), model
        assert not valid(model, {"traceId": "", "value": "down"}), model
        assert not valid(model, {"traceId": None, "value": "down"}), model
        assert not valid(model, {"value": "down"}), model
    assert valid("FeedbackIn", {"traceId": "t-1", "value": "down"})
    assert valid("FeedbackIn", {"sessionId": "s-1", "turn": 0, "value": "down"})
    assert valid("FeedbackIn", {"sessionId": "s-1", "turnNumber": 1, "value": "down"})
    listing = {p["name"]: p["schema"] for p in document["paths"]["/api/feedback"]["get"]["parameters"]}
    assert jsonschema.validators.Draft202012Validator(listing["traceId"]).is_valid("t-1")
    assert not jsonschema.validators.Draft202012Validator(listing["traceId"]).is_valid("")
    assert not jsonschema.validators.Draft202012Validator(listing["turn"]).is_valid("x")
