"""`triage relay`: the feedback service in front of Langfuse (or the embedded store).

`app` (HTTP), `service` (the operations), `requests` (bodies), `ledger` (ledger and outbox),
`sinks` (embedded store, Langfuse), `worker` (delivery), `tokens` (feedback tokens for browsers:
`issue_token`), `server` (assembly, uvicorn). It writes through `triage.sources` and never imports
the engine.
"""

from triage.relay.tokens import issue_token, verify_token

__all__ = ["issue_token", "verify_token"]
