"""The replies the model must give, as pydantic models, and the strict JSON schemas made from them.

The schemas sent as `response_format` are generated from these models (never written twice):
every property required, no extra ones, references inlined, titles and defaults dropped, as
OpenAI's strict structured outputs want. The containment schema is narrowed per call: only the
passage sets asked about, and the component name limited to the catalogue.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model


class _Reply(BaseModel):
    model_config = ConfigDict(extra="forbid")


Confidence = Literal["high", "medium", "low"]
SetKey = Literal["retrieved", "research"]


class Quote(_Reply):
    passage_id: str
    quote: str


class SetVerdict(_Reply):
    reasoning: str
    verdict: Literal["contains_answer", "partial", "no_answer"]
    evidence: list[Quote]
    confidence: Confidence


class ComponentPick(_Reply):
    reasoning: str
    name: str


class SearchAgain(_Reply):
    reasoning: str
    queries: list[str]


class ContainmentReply(_Reply):
    injection_note: str
    injection_suspected: bool
    retrieved: SetVerdict | None = None
    research: SetVerdict | None = None
    component: ComponentPick
    #: asked for only where the judge may search again (`containment_schema(search_again=True)`)
    search_again: SearchAgain | None = None


class Claim(_Reply):
    claim: str
    status: Literal["supported", "contradicted", "unsupported"]
    source_id: str
    quote: str


class GroundingVerdict(_Reply):
    reasoning: str
    verdict: Literal["grounded", "ungrounded", "no_factual_claims"]
    confidence: Confidence


class DeclineVerdict(_Reply):
    reasoning: str
    verdict: Literal["declined", "not_declined"]
    quote: str
    confidence: Confidence


class GroundingReply(_Reply):
    injection_note: str
    injection_suspected: bool
    claims: list[Claim]
    grounding: GroundingVerdict
    declined: DeclineVerdict


def strict_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema in the strict structured-output form."""
    schema = model.model_json_schema()
    definitions = schema.pop("$defs", {})

    def strict(node: Any) -> Any:
        if isinstance(node, list):
            return [strict(item) for item in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            return strict(definitions[node["$ref"].rsplit("/", 1)[-1]])
        out = {k: strict(v) for k, v in node.items() if k not in {"title", "default", "description"}}
        if "const" in out and "enum" not in out:  # a one-name catalogue: enum is what servers know
            out["enum"] = [out.pop("const")]
        if out.get("type") == "object":
            out["required"] = list(out.get("properties", {}))
            out["additionalProperties"] = False
        return out

    result = strict(schema)
    assert isinstance(result, dict)
    return result


def containment_schema(
    sets: Sequence[SetKey], components: Sequence[str], search_again: bool = False
) -> dict[str, Any]:
    """The containment reply's schema for the sets asked about, the component from the catalogue,
    and (`search_again`) the queries the model would search where no set holds the answer.

    Built once per (sets, catalogue, search_again) and copied per call: building it makes two
    pydantic models (about 3 ms of CPU per trace); a run sees a handful of combinations."""
    return copy.deepcopy(_containment_schema(tuple(sets), tuple(components), search_again))


@functools.lru_cache(maxsize=16)
def _containment_schema(
    sets: tuple[SetKey, ...], components: tuple[str, ...], search_again: bool
) -> dict[str, Any]:
    names: Any = Literal[tuple(components)]  # a Literal built at run time, from the catalogue
    pick = create_model("ComponentPick", __base__=_Reply, reasoning=(str, ...), name=(names, ...))
    fields: dict[str, Any] = {"injection_note": (str, ...), "injection_suspected": (bool, ...)}
    fields.update({key: (SetVerdict, ...) for key in sets})
    fields["component"] = (pick, Field(...))
    if search_again:
        fields["search_again"] = (SearchAgain, ...)
    return strict_schema(create_model("ContainmentReply", __base__=_Reply, **fields))


def grounding_schema() -> dict[str, Any]:
    return copy.deepcopy(_grounding_schema())


@functools.cache
def _grounding_schema() -> dict[str, Any]:
    return strict_schema(GroundingReply)
