"""`triage relay`: the feedback service in front of Langfuse (or the embedded store).

`api` (HTTP: auth, limits, statuses), `web` (the frame: routing, CORS, the protocol's head limits,
problems, metrics), `bodies` (the request bodies as models, the OpenAPI description), `access`
(feedback tokens for browsers: `issue_token`; session JWTs; rate limits), `service` (the
operations), `commits` (the one group commit) over `storage` (the port) and its `sqlite` and
`postgres` implementations, `outbox` (the sinks: embedded store, Langfuse; the delivery worker),
`server` (assembly, uvicorn). It writes through `triage.sources` and never imports the engine.
"""

from triage.relay.access import issue_token, verify_token

__all__ = ["issue_token", "verify_token"]
