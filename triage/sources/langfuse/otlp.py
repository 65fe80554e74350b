"""OTLP/JSON: spans as `POST /api/public/otel/v1/traces` takes them (an `ExportTraceServiceRequest`
in the JSON encoding of the OTLP/HTTP specification).

JSON, not protobuf: Langfuse's OpenAPI file documents the endpoint's request body as
`application/json` (`resourceSpans`, ...), and its description names both encodings; the
SDK's exporter (`opentelemetry-exporter-otlp-proto-http`) sends protobuf, which would make
`protobuf` and the OpenTelemetry packages runtime dependencies of triage for a few spans a run
(the reason `http` imports no part of the SDK). The JSON encoding's rules, as the OTLP
specification states them: trace and span ids are lowercase hex (16 and 8 bytes), not base64;
64-bit integers (times in nanoseconds) are decimal strings; enums are integers.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from triage.domain.kernel import as_utc

#: OTLP's span kind INTERNAL: work inside one process, neither a server nor a client call
KIND_INTERNAL = 1

AttributeValue = str | bool | int | float


def hex_id(parts: Sequence[str], length: int) -> str:
    """A deterministic OTel id of `length` hex digits (32: a trace, 16: a span) from `parts`: the
    same parts give the same id on every run, so a span written again replaces itself."""
    digest = hashlib.sha256(json.dumps(list(parts), ensure_ascii=False).encode()).hexdigest()[:length]
    # an all-zero id is invalid in OTel; a sha256 prefix of zeros only is never met, but never sent
    return digest if digest.strip("0") else "1".rjust(length, "0")


def nanos(stamp: datetime) -> str:
    """A time as OTLP/JSON takes it: nanoseconds since the epoch, as a decimal string."""
    stamp = as_utc(stamp)
    whole = int(stamp.timestamp())
    return str(whole * 1_000_000_000 + stamp.microsecond * 1_000)


def attribute(key: str, value: AttributeValue) -> dict[str, Any]:
    """One `KeyValue`. An integer is sent as text (`stringValue`): OTLP/JSON's `intValue` is a
    decimal string, Langfuse's OpenAPI file says a number, and no attribute triage sends is one."""
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, float):
        return {"key": key, "value": {"doubleValue": value}}
    return {"key": key, "value": {"stringValue": str(value)}}


@dataclass(frozen=True)
class Span:
    """One finished span, with its attributes."""

    trace_id: str
    span_id: str
    name: str
    start: datetime
    end: datetime
    attributes: Mapping[str, AttributeValue] = field(default_factory=dict)
    parent_span_id: str | None = None

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "traceId": self.trace_id,
            "spanId": self.span_id,
            "name": self.name,
            "kind": KIND_INTERNAL,
            "startTimeUnixNano": nanos(self.start),
            "endTimeUnixNano": nanos(max(self.end, self.start)),
            "attributes": [attribute(k, v) for k, v in self.attributes.items()],
            "status": {},
        }
        if self.parent_span_id is not None:
            out["parentSpanId"] = self.parent_span_id
        return out

    def size(self) -> int:
        """Bytes of its JSON, to keep a request under the body limit."""
        return len(json.dumps(self.wire(), ensure_ascii=False).encode())


def export_request(
    spans: Sequence[Span], *, service: str, scope: str, version: str | None = None
) -> dict[str, Any]:
    """The `ExportTraceServiceRequest` of `spans`: one resource (`service.name`), one scope."""
    scope_body: dict[str, Any] = {"name": scope}
    if version:
        scope_body["version"] = version
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [attribute("service.name", service)]},
                "scopeSpans": [{"scope": scope_body, "spans": [s.wire() for s in spans]}],
            }
        ]
    }


def chunked(spans: Sequence[tuple[str, Span]], limit: int) -> list[list[tuple[str, Span]]]:
    """`spans` (each with the key it is written for) in requests of at most `limit` bytes of spans
    each (a span larger than `limit` goes alone)."""
    out: list[list[tuple[str, Span]]] = []
    size = 0
    for pair in spans:
        bytes_ = pair[1].size()
        if not out or size + bytes_ > limit:
            out.append([])
            size = 0
        out[-1].append(pair)
        size += bytes_
    return out
