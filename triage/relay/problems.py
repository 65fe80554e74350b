"""The one error the relay answers with: an HTTP status and a message that names the field."""

from __future__ import annotations


class Problem(Exception):
    """A request the relay refuses: `status` (400, 401, 403, 404, 409, 413, 422, 429, 502, 503)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


class DeliveryFailed(Exception):
    """A write the sink did not take. `retryable`: Langfuse was down, slow or rate-limiting."""

    def __init__(self, message: str, *, retryable: bool = True, wait: float | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.wait = wait
