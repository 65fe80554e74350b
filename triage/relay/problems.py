"""The relay's errors, in the one error tree: `Problem`, what a request is answered with (an HTTP
status and a message that names the field), and `DeliveryFailed`, a write a sink did not take."""

from __future__ import annotations

from triage.errors import SourceError, TriageError


class Problem(TriageError):
    """A request the relay refuses: `status` (400, 401, 403, 404, 409, 413, 422, 429, 503)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


class DeliveryFailed(SourceError):
    """A write the sink did not take. `retryable`: Langfuse was down, slow or rate-limiting;
    `permanent`: it can never be taken (no retry: set aside at once, alone)."""

    def __init__(
        self, message: str, *, retryable: bool = True, wait: float | None = None, permanent: bool = False
    ) -> None:
        super().__init__(message)
        self.retryable = retryable and not permanent
        self.permanent = permanent
        self.wait = wait
