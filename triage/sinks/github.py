"""GitHub issues as a tracker: the REST client `triage issues sync` keeps one issue per failure
signature with.

Plain JSON over one `httpx.Client` (an injectable transport, as the Langfuse client has); the API
version pinned (`X-GitHub-Api-Version: 2022-11-28`); the token passed in, sent only to `api_url`'s
host (a `Link` to another host is refused) and never written into an error or a log line.

What the sync's guarantees rest on:

- **A write is made once, even when its answer is lost.** A POST whose answer never arrives (a
  dropped connection, a timeout, a 5xx: the write may or may not have landed) is not sent again
  blindly: the issue is looked up again by its marker (the comment among the issue's comments),
  and only when it is not there is the POST repeated. A PATCH is idempotent and simply retried.
- **Rate limits are waited out, in the project's clock, within `max_wait`.** A secondary limit
  (403/429 with `Retry-After`, or GitHub's "secondary rate limit" message) waits as asked (a
  minute, doubling, when nothing is asked); the primary limit (`x-ratelimit-remaining: 0`) waits
  until `x-ratelimit-reset`, and the next request waits before it is sent once the last answer
  said the budget is spent. A wait longer than `max_wait` raises `GitHubRateLimited`, saying how
  long it would have been: the job fails, it does not hang.
- **5xx and transport errors** are retried by the project's one policy (`triage.retry`); what
  still fails is a `GitHubError` (a `SourceError`, exit 1). A refused token (401), a repository
  that cannot be seen (404), issues disabled (410) or a 403 that is not a rate limit are a
  `ConfigError` (exit 3); a 422 is a `GitHubRejected` with GitHub's message, clipped.

Not safe to share between threads (the rate-limit state is the client's own).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from functools import partial
from types import TracebackType
from typing import Any, Literal, NoReturn, TypeVar
from urllib.parse import quote, urlsplit

import httpx
import pydantic

from triage.domain.tracker import TrackerComment, TrackerIssue, marked
from triage.errors import ConfigError, SourceError
from triage.redact import Redactor, printable
from triage.retry import Clock, RetryPolicy, current_clock, retry_after

log = logging.getLogger("triage.sinks.github")

T = TypeVar("T")

API_VERSION = "2022-11-28"
PER_PAGE = 100  # GitHub's largest page
#: for 5xx and transport errors: four attempts, one to eight seconds apart
GITHUB_RETRY = RetryPolicy(attempts=4, initial=1.0, maximum=8.0)
#: waited past `x-ratelimit-reset`: our clock and GitHub's differ
RESET_MARGIN = 1.0
#: a secondary limit that asks for no particular wait: at least a minute (GitHub's advice), doubling
SECONDARY_WAIT = 60.0
#: rate-limit refusals one request may meet before the client gives up (each one waited out)
MAX_LIMITED = 5
#: pages one listing may take (100 each): a server that pages forever ends the listing, not the job
MAX_PAGES = 500
MESSAGE_LIMIT = 300  # characters of GitHub's message kept in an error
_REPO = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})/[A-Za-z0-9._-]{1,100}$")


# -- errors ----------------------------------------------------------------------------------------


class GitHubError(SourceError):
    """GitHub failed, or kept failing, or answered something unusable."""


class GitHubRateLimited(GitHubError):
    """Waiting out a rate limit would take longer than the client may wait (`max_wait`)."""

    def __init__(self, message: str, wait: float) -> None:
        super().__init__(message)
        self.wait = wait


class GitHubRejected(GitHubError):
    """GitHub refused a request as invalid (422), with its message."""


class GitHubIssueGone(GitHubError):
    """The issue is not there any more (404 or 410 on the issue: deleted, transferred)."""

    def __init__(self, message: str, number: int) -> None:
        super().__init__(message)
        self.number = number


# -- GitHub's shapes (only the fields read) ------------------------------------------------------


class _LabelWire(pydantic.BaseModel):
    name: str


class _IssueWire(pydantic.BaseModel):
    number: int
    title: str
    body: str | None = None
    state: Literal["open", "closed"]
    labels: list[_LabelWire | str] = []
    html_url: str
    pull_request: dict[str, Any] | None = None

    def record(self) -> TrackerIssue:
        names = tuple(label if isinstance(label, str) else label.name for label in self.labels)
        return TrackerIssue(self.number, self.title, self.body or "", self.state, names, self.html_url)


class _CommentWire(pydantic.BaseModel):
    id: int
    body: str | None = None

    def record(self) -> TrackerComment:
        return TrackerComment(self.id, self.body or "")


class _ErrorWire(pydantic.BaseModel):
    message: str = ""
    errors: list[Any] | None = None


_issue = pydantic.TypeAdapter(_IssueWire)
_issue_list = pydantic.TypeAdapter(list[_IssueWire])
_comment = pydantic.TypeAdapter(_CommentWire)
_comment_list = pydantic.TypeAdapter(list[_CommentWire])


class _Transient(Exception):
    """An answer that never came, or a 5xx: the request may or may not have been applied
    (`sent` False: the connection was never made, so it was not)."""

    def __init__(self, reason: str, *, sent: bool = True, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.sent = sent
        self.headers = dict(headers or {})


def _transient(ex: BaseException) -> bool:
    return isinstance(ex, _Transient)


def _wait_headers(ex: BaseException) -> Mapping[str, str] | None:
    """A 503's `Retry-After`, when it has one; every other failure backs off."""
    return ex.headers if isinstance(ex, _Transient) else None


# -- the client ----------------------------------------------------------------------------------


class GitHubIssues:
    """Issues and comments of GitHub repositories ("owner/name"), through the REST API."""

    def __init__(
        self,
        *,
        token: str,
        api_url: str = "https://api.github.com",
        transport: httpx.BaseTransport | None = None,
        clock: Clock | None = None,
        retry: RetryPolicy | None = None,
        max_wait: float = 900.0,
        user_agent: str = "triage",
        timeout: float = 30.0,
    ) -> None:
        if not token.strip():
            raise ConfigError("no GitHub token was given")
        self.api_url = api_url.rstrip("/")
        self.max_wait = max_wait
        self._clock = clock
        policy = retry or GITHUB_RETRY
        self.retry = policy if policy.clock is not None or clock is None else policy.with_(clock=clock)
        self._mask = Redactor([token])
        self._requests = 0
        #: what the last answer said of the primary limit: requests left, and when the window resets
        self._remaining: int | None = None
        self._reset: float | None = None
        self._http = httpx.Client(
            base_url=self.api_url,
            transport=transport,
            timeout=timeout,
            headers={
                "Accept": "application/vnd.github+json",
                "X-GitHub-Api-Version": API_VERSION,
                "Authorization": f"Bearer {token.strip()}",
                "User-Agent": user_agent,
            },
            event_hooks={"request": [self._count]},
        )

    # -- lifecycle

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> GitHubIssues:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    @property
    def requests(self) -> int:
        """HTTP requests sent, retries and look-ups included."""
        return self._requests

    @property
    def clock(self) -> Clock:
        return self._clock or self.retry.clock or current_clock()

    def _count(self, request: httpx.Request) -> None:
        self._requests += 1

    # -- reads

    def issues(self, repo: str, label: str) -> list[TrackerIssue]:
        """Every issue of `repo` with `label`, open and closed, oldest first; pull requests left out."""
        path = f"{_repo_path(repo)}/issues"
        params = {
            "state": "all",
            "labels": label,
            "sort": "created",
            "direction": "asc",
            "per_page": PER_PAGE,
        }
        seen: dict[int, TrackerIssue] = {}
        for page in self._pages(repo, path, params):
            for wire in self._parsed(f"listing the issues of {repo}", _issue_list, page):
                if wire.pull_request is None:  # GitHub lists pull requests as issues too
                    seen.setdefault(wire.number, wire.record())
        return list(seen.values())

    def find(self, repo: str, label: str, marker: str) -> TrackerIssue | None:
        """The issue of `repo` with `label` whose body contains `marker` (the lowest number if
        several do), open or closed; None when there is none."""
        if not marker:
            raise ValueError("an empty marker matches every issue")
        return marked(self.issues(repo, label), marker)

    def comments(self, repo: str, number: int) -> list[TrackerComment]:
        """Every comment of issue `number`, oldest first."""
        path = f"{_repo_path(repo)}/issues/{number}/comments"
        out: list[TrackerComment] = []
        for page in self._pages(repo, path, {"per_page": PER_PAGE}, number=number):
            out += [
                wire.record()
                for wire in self._parsed(f"listing the comments of {repo}#{number}", _comment_list, page)
            ]
        return out

    # -- writes

    def create(self, repo: str, *, title: str, body: str, labels: Sequence[str], marker: str) -> TrackerIssue:
        """Open an issue whose `body` holds `marker`, once: after a lost answer the issue is looked
        up by `marker` (among the issues with the first label) before it is posted again."""
        if not labels:
            raise ValueError("an issue needs a label to be found again by its marker")
        if not marker or marker not in body:
            raise ValueError("the marker must be in the body: it is how a lost write is found again")
        path = f"{_repo_path(repo)}/issues"
        payload = {"title": title, "body": body, "labels": list(labels)}

        def post() -> TrackerIssue:
            answer = self._exchange("POST", path, repo=repo, json_body=payload)
            return self._parsed(
                f"creating an issue in {repo}", _issue, _json(answer, f"creating an issue in {repo}")
            ).record()

        return self._write_once(
            f"creating an issue in {repo}", post, lambda: self.find(repo, labels[0], marker)
        )

    def comment(self, repo: str, number: int, body: str, marker: str) -> TrackerComment | None:
        """Add a comment holding `marker` to issue `number`, once: after a lost answer the issue's
        comments are listed, and the one holding `marker` is returned instead of posting again.
        (Never None at present: the comment posted or the one found.)"""
        if not marker or marker not in body:
            raise ValueError("the marker must be in the body: it is how a lost write is found again")
        path = f"{_repo_path(repo)}/issues/{number}/comments"

        def post() -> TrackerComment:
            answer = self._exchange("POST", path, repo=repo, number=number, json_body={"body": body})
            return self._parsed(
                f"commenting on {repo}#{number}", _comment, _json(answer, f"commenting on {repo}#{number}")
            ).record()

        def recover() -> TrackerComment | None:
            return next((c for c in self.comments(repo, number) if marker in c.body), None)

        return self._write_once(f"commenting on {repo}#{number}", post, recover)

    def edit(
        self,
        repo: str,
        number: int,
        *,
        body: str | None = None,
        state: Literal["open", "closed"] | None = None,
        state_reason: Literal["completed", "not_planned", "reopened"] | None = None,
    ) -> TrackerIssue:
        """Change an issue's body and/or state (a PATCH: the same request twice is the same change,
        so it is retried as it is)."""
        payload: dict[str, str] = {}
        if body is not None:
            payload["body"] = body
        if state is not None:
            payload["state"] = state
        if state_reason is not None:
            payload["state_reason"] = state_reason
        if not payload:
            raise ValueError("nothing to edit")
        what = f"editing {repo}#{number}"
        path = f"{_repo_path(repo)}/issues/{number}"
        answer = self._retrying(
            what, lambda: self._exchange("PATCH", path, repo=repo, number=number, json_body=payload)
        )
        return self._parsed(what, _issue, _json(answer, what)).record()

    # -- the plumbing

    def _write_once(self, what: str, post: Callable[[], T], recover: Callable[[], T | None]) -> T:
        """`post()`, retried after a lost answer only when `recover()` does not find the write."""
        lost = False

        def attempt() -> T:
            nonlocal lost
            if lost:
                found = recover()
                if found is not None:
                    log.info("github %s: the answer was lost, but the write landed", what)
                    return found
            try:
                return post()
            except _Transient as ex:
                lost = lost or ex.sent  # a connection never made wrote nothing: no look-up needed
                raise

        return self._retrying(what, attempt)

    def _retrying(self, what: str, fn: Callable[[], T]) -> T:
        def before_sleep(state: Any) -> None:
            error = state.outcome.exception() if state.outcome else None
            reason = error.reason if isinstance(error, _Transient) else type(error).__name__
            log.info("github %s: retrying after %s (attempt %d)", what, reason, state.attempt_number)

        retrying = self.retry.retrying(_transient, retry_after=_wait_headers, before_sleep=before_sleep)
        try:
            return retrying(fn)
        except _Transient as ex:
            raise GitHubError(self._mask(f"GitHub: {what} failed: {ex.reason} (gave up)")) from None

    def _pages(
        self, repo: str, path: str, params: Mapping[str, Any], number: int | None = None
    ) -> Iterator[Any]:
        """The decoded body of each page of a listing, following `Link: rel="next"`."""
        url: str = path
        query: Mapping[str, Any] | None = params
        seen: set[str] = set()
        for _ in range(MAX_PAGES):
            send = partial(self._exchange, "GET", url, repo=repo, number=number, params=query)
            answer = self._retrying(f"listing {path}", send)
            yield _json(answer, f"listing {path}")
            following = answer.links.get("next", {}).get("url")
            if following is None:
                return
            self._same_host(following)
            if following in seen:
                raise GitHubError(f"GitHub: listing {path}: the server repeated a page")
            seen.add(following)
            url, query = following, None  # the link holds the query
        raise GitHubError(f"GitHub: listing {path}: more than {MAX_PAGES} pages")

    def _same_host(self, url: str) -> None:
        # the token goes with every request: never to a host a Link header names
        mine, theirs = urlsplit(self.api_url), urlsplit(url)
        if (mine.scheme, mine.netloc) != (theirs.scheme, theirs.netloc):
            raise GitHubError(f"GitHub: a page link points at another host ({printable(theirs.netloc, 80)})")

    def _exchange(
        self,
        method: str,
        url: str,
        *,
        repo: str,
        number: int | None = None,
        params: Mapping[str, Any] | None = None,
        json_body: Any = None,
    ) -> httpx.Response:
        """One request, with the rate limits waited out: a 2xx answer; `_Transient` when the answer
        was lost or a 5xx; the error a 4xx stands for."""
        limited = 0
        while True:
            self._wait_for_reset()
            try:
                answer = self._http.request(method, url, params=params, json=json_body)
            except (httpx.ConnectError, httpx.ConnectTimeout) as ex:
                raise _Transient(f"{type(ex).__name__} (not sent)", sent=False) from None
            except httpx.TransportError as ex:
                raise _Transient(type(ex).__name__) from None
            self._note_limit(answer.headers)
            if answer.is_success:
                return answer
            if answer.status_code >= 500:
                raise _Transient(f"HTTP {answer.status_code}", headers=answer.headers)
            wait = self._limit_wait(answer, limited)
            if wait is None:
                self._refused(answer, method, repo, number)
            limited += 1
            if limited > MAX_LIMITED:
                raise GitHubError(
                    f"GitHub: {method} {_path_of(url)}: still rate limited after {MAX_LIMITED} waits"
                )
            self._sleep(wait, f"{method} {_path_of(url)}: rate limited (HTTP {answer.status_code})")

    def _note_limit(self, headers: httpx.Headers) -> None:
        remaining, reset = headers.get("x-ratelimit-remaining"), headers.get("x-ratelimit-reset")
        if remaining is not None and remaining.strip().isdigit():
            self._remaining = int(remaining)
        if reset is not None and reset.strip().isdigit():
            self._reset = float(reset)

    def _now(self) -> float:
        return self.clock.now().timestamp()

    def _wait_for_reset(self) -> None:
        """Before a request: once the last answer said the budget is spent, wait for the window."""
        if self._remaining == 0 and self._reset is not None and self._reset > self._now():
            self._sleep(self._reset - self._now() + RESET_MARGIN, "the primary rate limit is spent")
            self._remaining = None

    def _limit_wait(self, answer: httpx.Response, limited: int) -> float | None:
        """How long a 403/429 asks to wait; None when it is not a rate limit."""
        if answer.status_code not in {403, 429}:
            return None
        asked = retry_after(dict(answer.headers), now=self.clock.now())
        if asked is not None:
            return asked
        if answer.headers.get("x-ratelimit-remaining") == "0" and self._reset is not None:
            return max(self._reset - self._now(), 0.0) + RESET_MARGIN
        # GitHub's "secondary rate limit" (or a primary one whose headers were lost)
        if answer.status_code == 429 or "rate limit" in _message(answer).lower():
            return SECONDARY_WAIT * 2.0**limited
        return None

    def _sleep(self, seconds: float, why: str) -> None:
        budget = self.retry.budget
        if seconds > self.max_wait or (budget is not None and budget.spent(seconds)):
            until = datetime.fromtimestamp(self._now() + seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            allowed = "the run's budget" if seconds <= self.max_wait else f"the {self.max_wait:.0f} s allowed"
            raise GitHubRateLimited(
                f"GitHub: {why}: waiting {seconds:.0f} s (until {until}) would take longer than {allowed}",
                seconds,
            )
        log.warning("github: %s; waiting %.0f s", why, seconds, extra={"event": "github_rate_limited"})
        if budget is not None:
            budget.sleep(self.clock, seconds)
        else:
            self.clock.sleep(seconds)

    def _refused(self, answer: httpx.Response, method: str, repo: str, number: int | None) -> NoReturn:
        """Raise what a 4xx (other than a rate limit) stands for."""
        status, message = answer.status_code, self._mask(printable(_message(answer), MESSAGE_LIMIT))
        said = f" ({message})" if message else ""
        where = repo if number is None else f"{repo}#{number}"
        if status == 401:
            raise ConfigError(f"GitHub refused the token (HTTP 401{said}): check the token given for {repo}")
        if status == 403:
            raise ConfigError(
                f"GitHub refused {method} on {where} (HTTP 403{said}): the token lacks the permission "
                "(issues: write)"
            )
        if status in {404, 410} and number is not None:
            raise GitHubIssueGone(
                f"GitHub: {where} is not there, or the token cannot see the repository (HTTP {status}{said})",
                number,
            )
        if status == 404:
            raise ConfigError(f"GitHub repository {repo} not found, or the token cannot see it (HTTP 404)")
        if status == 410:
            raise ConfigError(f"GitHub: issues are disabled in {repo} (HTTP 410{said})")
        if status == 422:
            raise GitHubRejected(
                f"GitHub rejected {method} on {where} (HTTP 422{said}{_details(answer, self._mask)})"
            )
        raise GitHubError(f"GitHub: {method} on {where} failed (HTTP {status}{said})")

    def _parsed(self, what: str, shape: pydantic.TypeAdapter[T], body: Any) -> T:
        try:
            return shape.validate_python(body)
        except pydantic.ValidationError as ex:
            raise GitHubError(
                f"GitHub: {what}: the answer does not match the API ({ex.error_count()} errors)"
            ) from None


def _repo_path(repo: str) -> str:
    if not _REPO.match(repo) or repo.split("/")[1] in {".", ".."}:
        raise ConfigError(f"a GitHub repository is named 'owner/name', not {printable(repo, 80)!r}")
    owner, name = repo.split("/")
    return f"/repos/{quote(owner, safe='')}/{quote(name, safe='')}"


def _path_of(url: str) -> str:
    return urlsplit(url).path


def _message(answer: httpx.Response) -> str:
    """GitHub's `message`, or the start of a body that is not its JSON error."""
    try:
        return _ErrorWire.model_validate(answer.json()).message
    except (ValueError, pydantic.ValidationError):
        return answer.text[:MESSAGE_LIMIT]


def _details(answer: httpx.Response, mask: Callable[[str], str]) -> str:
    """A 422's `errors`, clipped: which field, and why."""
    try:
        errors = _ErrorWire.model_validate(answer.json()).errors
    except (ValueError, pydantic.ValidationError):
        return ""
    if not errors:
        return ""
    return ": " + mask(printable("; ".join(str(e) for e in errors), MESSAGE_LIMIT))


def _json(answer: httpx.Response, what: str) -> Any:
    try:
        return answer.json()
    except ValueError:  # a proxy's page, a truncated body
        raise GitHubError(f"GitHub: {what}: the answer is not JSON (HTTP {answer.status_code})") from None
