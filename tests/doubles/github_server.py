"""A local HTTP stand-in for the part of GitHub's REST API that `triage issues sync` uses.

Start it from a test::

    with GitHubStandIn(token="ghp_test") as github:
        httpx.post(f"{github.url}/repos/acme/app/issues", json={"title": "t"},
                   headers={"Authorization": "Bearer ghp_test"})
        github.check_log()  # every exchange, against GitHub's OpenAPI description

It serves the operations of github_openapi.json (a trimmed copy of GitHub's published description,
made by github_openapi_trim.py) and behaves as GitHub does where a client can get it wrong:

- every request is validated against that description first (path and query parameters, JSON
  body): a body that is not JSON is a 400 "Problems parsing JSON", a request the description
  refuses a 422 "Validation Failed" naming why, an unknown path or method a 404 "Not Found";
- auth: `Authorization: Bearer <token>` or `token <token>`; none is a 401 "Requires
  authentication", another token a 401 "Bad credentials" (GitHub's error shape);
- `X-GitHub-Api-Version`, when sent, must be a published version (else 400) and is logged;
- issues numbered per repository from 1; list filters (`state`, `labels` all-of, `since`), sort
  and direction; `per_page` (default 30, silently capped at 100) and `page`, with GitHub's `Link`
  header (`first`/`prev`/`next`/`last`); seeded pull requests are listed as issues, as GitHub does;
- PATCH: `state=closed` sets `closed_at`, `closed_by` and `state_reason` (default `completed`);
  reopening sets `state_reason: reopened`; `state_reason` is ignored unless `state` changes (as
  the description says), and closing with `reopened` is a 422 (the stand-in's choice); a PATCH
  that changes nothing leaves `updated_at` as it was (assumed, not documented by GitHub); labels
  are names in requests (created on first use) and label objects in answers; comments bump the
  issue's `comments` and `updated_at`;
- no anonymous access (GitHub allows some, at 60 requests an hour): a client that forgets its
  token fails at once;
- the primary rate limit: `x-ratelimit-{limit,remaining,used,reset,resource}` on every answer; a
  budget of `limit` requests per hour window (read from `clock`, epoch seconds); when it is spent,
  a 403 (or `primary_limit_status`) "API rate limit exceeded ..." until the window's reset.
  Every authenticated request spends one, refused ones too, except `GET /rate_limit` (free, as
  on GitHub) and the answers of scripted faults other than `drop`;
- scripted faults (`fail_next`), consumed by the next matching requests: `secondary_rate_limit`
  (403 or 429 with `retry-after`), `server_error` (502/503, an HTML or a JSON body), `drop`
  (close the connection without an answer, by default AFTER applying the write: a lost
  response) and `drop_before` (close it without applying anything);
- a log of every exchange (`log`), and `check_log()`, which validates each logged request and
  response against the description with openapi-core (see `validate_exchange` for what is skipped
  and why).
"""

from __future__ import annotations

import base64
import copy
import json
import math
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from tests.doubles.serving import Served, ThreadedServer

SPEC_PATH = Path(__file__).with_name("github_openapi.json")
#: the host of the description's `servers`; requests are matched against it when validated
SPEC_HOST = "https://api.github.com"
DOCS = "https://docs.github.com/rest"
API_VERSIONS = {"2022-11-28", "2026-03-10"}
DEFAULT_API_VERSION = "2022-11-28"
WINDOW_SECONDS = 3600  # GitHub's primary rate-limit window
MAX_PER_PAGE = 100

FaultKind = Literal["secondary_rate_limit", "server_error", "drop", "drop_before"]
FAULT_KINDS = {"secondary_rate_limit", "server_error", "drop", "drop_before"}


class SpecMismatch(AssertionError):
    """An exchange that GitHub's description does not allow."""


# --------------------------------------------------------------------------- log, faults, state


@dataclass
class Exchange:
    """One logged request and its answer (`status` 0: the connection was dropped, no answer)."""

    method: str
    path: str
    query: dict[str, list[str]]
    request_headers: dict[str, str]
    request_body: bytes
    status: int = 0
    response_headers: dict[str, str] = field(default_factory=dict)
    response_body: bytes = b""
    #: the `X-GitHub-Api-Version` the client sent, if any
    api_version: str | None = None
    #: why the stand-in refused the request as invalid (400/404/422), if it did
    refused: str | None = None
    #: the fault that answered it, if one did
    fault: str | None = None


@dataclass
class Fault:
    """A scripted fault for the next `count` requests matching `method` and `path_suffix`."""

    kind: FaultKind
    method: str | None = None
    path_suffix: str | None = None
    count: int = 1
    retry_after: int = 60  # secondary_rate_limit
    status: int | None = None  # secondary_rate_limit: 403 (default) or 429; server_error: 502 (default)
    json_body: bool = False  # server_error: GitHub's JSON error instead of an HTML page
    apply_then_drop: bool = True  # drop: the write lands before the connection is closed
    skip: int = 0  # matching requests let through before the fault starts

    def matches(self, method: str, path: str) -> bool:
        return (self.method is None or self.method.upper() == method) and (
            self.path_suffix is None or path.endswith(self.path_suffix)
        )


@dataclass
class Label:
    id: int
    name: str
    color: str = "ededed"
    description: str | None = None


@dataclass
class Comment:
    id: int
    body: str
    created_at: float
    updated_at: float


@dataclass
class Issue:
    id: int
    number: int
    title: str
    body: str | None
    labels: list[str]
    created_at: float
    updated_at: float
    state: str = "open"
    state_reason: str | None = None
    closed_at: float | None = None
    comments: list[Comment] = field(default_factory=list)
    pull_request: bool = False


@dataclass
class Repo:
    owner: str
    name: str
    issues: list[Issue] = field(default_factory=list)
    labels: dict[str, Label] = field(default_factory=dict)


class Problem(Exception):
    """An error answer in GitHub's shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        errors: list[dict[str, Any]] | None = None,
        refused: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}
        self.errors = errors
        self.refused = refused

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"message": self.message, "documentation_url": DOCS, "status": str(self.status)}
        if self.errors is not None:
            out["errors"] = self.errors
        return out


@dataclass
class _Answer:
    status: int
    payload: Any
    headers: dict[str, str] = field(default_factory=dict)


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(int(epoch), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _epoch(text: str) -> float:
    stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp()


def _node_id(prefix: str, number: int) -> str:
    return prefix + base64.b64encode(f"standin:{number}".encode()).decode().rstrip("=")


# --------------------------------------------------------------------------- the spec


@lru_cache(maxsize=4)
def load_spec(path: str = str(SPEC_PATH)) -> Any:
    """The description as an openapi-core `OpenAPI` (cached: loading takes a moment).

    The description itself is checked by tests/test_github_standin.py, so not again here."""
    from openapi_core import Config, OpenAPI

    return OpenAPI.from_file_path(path, config=Config(spec_validator_cls=None))


@lru_cache(maxsize=1)
def _basic_error_validator() -> Any:
    from openapi_schema_validator import OAS30Validator

    return OAS30Validator(_raw_spec()["components"]["schemas"]["basic-error"])


def _mock_request(method: str, path: str, query: dict[str, list[str]], body: bytes) -> Any:
    from openapi_core.testing import MockRequest

    return MockRequest(
        SPEC_HOST,
        method.lower(),
        path,
        args={name: values[-1] for name, values in query.items()},
        data=body or None,
        content_type="application/json",
    )


def _schema_errors(exc: BaseException) -> list[Any]:
    """The jsonschema errors under an openapi-core validation error, where it has them."""
    cause: BaseException | None = exc
    while cause is not None:
        errors = getattr(cause, "schema_errors", None)
        if errors:
            return list(errors)
        cause = cause.__cause__
    return []


def _validation_errors(exc: BaseException) -> list[dict[str, Any]]:
    """GitHub's `errors` entries for a request openapi-core refused."""
    name = getattr(exc, "name", None)  # a parameter error names its parameter
    schema_errors = _schema_errors(exc)
    if not schema_errors:
        cause = exc.__cause__
        text = f"{exc}: {cause}" if cause is not None else str(exc)
        return [{"resource": "Issue", "code": "invalid", "field": str(name or ""), "message": text}]
    out: list[dict[str, Any]] = []
    for err in schema_errors:
        if err.validator == "required":
            missing = re.match(r"'([^']+)'", err.message)
            field_name = missing.group(1) if missing else ""
            out.append({"resource": "Issue", "code": "missing_field", "field": field_name, "message": err.message})
        else:
            where = ".".join(str(p) for p in err.absolute_path) or str(name or "")
            out.append({"resource": "Issue", "code": "invalid", "field": where, "message": err.message})
    return out


def validate_request_of(entry: Exchange, spec: Any | None = None) -> None:
    """Raise openapi-core's error when the logged request breaks the description."""
    (spec or load_spec()).validate_request(_mock_request(entry.method, entry.path, entry.query, entry.request_body))


def _template(path: str) -> str | None:
    """The description's path template that `path` falls under, if any."""
    for template in _raw_spec()["paths"]:
        pattern = "^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template)) + "$"
        if re.match(pattern, path):
            return str(template)
    return None


def _operation_statuses(method: str, path: str) -> set[int] | None:
    """The statuses the description lists for this operation; None when it has no such operation."""
    template = _template(path)
    operation = None if template is None else _raw_spec()["paths"][template].get(method.lower())
    return None if operation is None else {int(code) for code in operation["responses"]}


@lru_cache(maxsize=1)
def _raw_spec() -> dict[str, Any]:
    spec: dict[str, Any] = json.loads(SPEC_PATH.read_text(encoding="utf-8"))
    return spec


def validate_exchange(entry: Exchange, spec: Any | None = None) -> str:
    """Validate one logged exchange against the description; returns what was checked.

    - the request: it must validate, unless the stand-in refused it (400/404/422), in which case
      it must NOT validate, or the refusal would be the stand-in's bug (a 404 for an issue or repo
      that does not exist is a valid request and is checked as one);
    - the answer: with openapi-core when the description lists its status for the operation;
      otherwise, a JSON answer (401, a 403 on a GET, a rate-limit refusal...) against GitHub's
      `basic-error` schema, which every such GitHub error body follows;
    - skipped, with the reason in the returned text: a dropped connection (no answer to check) and
      a non-JSON 5xx page (GitHub's frontends answer HTML there; the description has no schema).
    """
    from openapi_core.testing import MockResponse

    spec = spec or load_spec()
    where = f"{entry.method} {entry.path}?{urlencode(entry.query, doseq=True)}"
    request = _mock_request(entry.method, entry.path, entry.query, entry.request_body)
    if entry.refused is not None and entry.status in {400, 404, 422}:
        try:
            spec.validate_request(request)
        except Exception:  # noqa: BLE001 - any refusal by the validator is what we expect here
            pass
        else:
            raise SpecMismatch(f"{where}: refused ({entry.refused}) but the request is valid")
    else:
        try:
            spec.validate_request(request)
        except Exception as exc:
            raise SpecMismatch(f"{where}: request: {exc} {_schema_errors(exc)}") from exc
    op = _route_template(entry.method, entry.path)
    if entry.status == 0:
        return f"{op} dropped (request only)"
    statuses = _operation_statuses(entry.method, entry.path)
    content_type = entry.response_headers.get("content-type", "")
    if statuses is not None and entry.status in statuses:
        response = MockResponse(
            entry.response_body,
            status_code=entry.status,
            headers=entry.response_headers,
            content_type=content_type.split(";")[0] or "application/json",
        )
        try:
            spec.validate_response(request, response)
        except Exception as exc:
            raise SpecMismatch(f"{where} -> {entry.status}: {exc} {_schema_errors(exc)}") from exc
        return f"{op} {entry.status}"
    if content_type.startswith("application/json"):
        body = json.loads(entry.response_body)
        errors = list(_basic_error_validator().iter_errors(body))
        if errors or not isinstance(body, dict) or "message" not in body:
            raise SpecMismatch(f"{where} -> {entry.status}: not a basic-error: {body!r} {errors}")
        return f"{op} {entry.status} (basic-error)"
    if entry.status >= 500:
        return f"{op} {entry.status} skipped: non-JSON 5xx page"
    raise SpecMismatch(f"{where} -> {entry.status}: not JSON and not in the description")


def _route_template(method: str, path: str) -> str:
    return f"{method} {_template(path) or '(unknown path)'}"


# --------------------------------------------------------------------------- the stand-in


class GitHubStandIn(Served):
    """The stand-in server; see the module docstring. Knobs may be changed while it runs."""

    methods = ("GET", "POST", "PATCH", "PUT", "DELETE")

    def __init__(
        self,
        *,
        token: str = "ghp_standin",
        login: str = "triage-bot",
        repos: Iterable[str] | None = None,
        limit: int = 5000,
        primary_limit_status: int = 403,
        clock: Callable[[], float] = time.time,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.token = token
        self.login = login
        #: "owner/name" of the repositories that exist; None: every one does
        self.known_repos = None if repos is None else set(repos)
        self.limit = limit
        self.primary_limit_status = primary_limit_status
        self.clock = clock
        self._listener = ThreadedServer(host, port, name="github-standin", queue_size=5)
        self.log: list[Exchange] = []
        self._faults: list[Fault] = []
        self._repos: dict[tuple[str, str], Repo] = {}
        self._ids = 1000  # ids are global on GitHub, numbers per repository
        self._window_reset: float | None = None
        self._used = 0
        self._lock = threading.RLock()

    # ----------------------------------------------------------------- lifecycle


    # ----------------------------------------------------------------- scripting and inspection

    def fail_next(
        self,
        kind: FaultKind,
        *,
        method: str | None = None,
        path_suffix: str | None = None,
        count: int = 1,
        retry_after: int = 60,
        status: int | None = None,
        json_body: bool = False,
        apply_then_drop: bool = True,
        skip: int = 0,
    ) -> None:
        """Script a fault for the next `count` requests matching `method` and `path_suffix`, after
        `skip` of them go through (faults are tried in the order scripted; the first that matches
        is used)."""
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}")
        with self._lock:
            self._faults.append(
                Fault(kind, method, path_suffix, count, retry_after, status, json_body, apply_then_drop, skip)
            )

    def pending_faults(self) -> list[Fault]:
        with self._lock:
            return list(self._faults)

    def add_issue(
        self,
        owner: str,
        repo: str,
        title: str,
        *,
        body: str | None = None,
        labels: Iterable[str] = (),
        state: str = "open",
        state_reason: str | None = None,
        pull_request: bool = False,
    ) -> int:
        """Seed an issue (or, `pull_request=True`, a pull request, which the issue list returns
        too); returns its number. Not logged and not counted against the rate limit."""
        with self._lock:
            item = self._new_issue(self._repo(owner, repo), title, body, list(labels))
            item.pull_request = pull_request
            if state == "closed":
                item.state, item.closed_at = "closed", item.created_at
                item.state_reason = state_reason or "completed"
            return item.number

    def repositories(self) -> list[str]:
        """`owner/name` of every repository that holds an issue or was asked about."""
        with self._lock:
            return sorted(f"{owner}/{name}" for owner, name in self._repos)

    def issues(self, owner: str, repo: str) -> list[dict[str, Any]]:
        """A snapshot of the repository's issues (pull requests left out), by number: number,
        title, body, state, state_reason, labels (names), closed_at, updated_at (epoch) and
        comments (dicts of id, body, created_at)."""
        with self._lock:
            stored = self._repos.get((owner, repo))
            items = [] if stored is None else [i for i in stored.issues if not i.pull_request]
            return [
                {
                    "number": i.number,
                    "title": i.title,
                    "body": i.body,
                    "state": i.state,
                    "state_reason": i.state_reason,
                    "labels": list(i.labels),
                    "closed_at": i.closed_at,
                    "updated_at": i.updated_at,
                    "comments": [{"id": c.id, "body": c.body, "created_at": c.created_at} for c in i.comments],
                }
                for i in items
            ]

    def requests(self, method: str | None = None, path_suffix: str | None = None) -> list[Exchange]:
        with self._lock:
            return [
                e
                for e in self.log
                if (method is None or e.method == method) and (path_suffix is None or e.path.endswith(path_suffix))
            ]

    def check_log(self) -> list[str]:
        """Validate every logged exchange (see `validate_exchange`); raises `SpecMismatch` on the
        first that breaks the description, else returns what was checked, one line each."""
        with self._lock:
            entries = list(self.log)
        spec = load_spec()
        return [validate_exchange(entry, spec) for entry in entries]

    @property
    def rate_remaining(self) -> int:
        with self._lock:
            self._roll_window()
            return self.limit - self._used

    # ----------------------------------------------------------------- request handling

    def handle(
        self, method: str, target: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes] | None:
        """Answer one request; None means close the connection without an answer."""
        parts = urlsplit(target)
        path = unquote(parts.path)
        query = parse_qs(parts.query, keep_blank_values=True)
        entry = Exchange(method, path, query, headers, body, api_version=headers.get("x-github-api-version"))
        with self._lock:
            self.log.append(entry)
            fault = next((f for f in self._faults if f.matches(method, path)), None)
            if fault is not None and fault.skip > 0:
                fault.skip -= 1
                fault = None
            if fault is not None:
                fault.count -= 1
                if fault.count <= 0:
                    self._faults.remove(fault)
                entry.fault = fault.kind
        if fault is not None and (fault.kind == "drop_before" or (fault.kind == "drop" and not fault.apply_then_drop)):
            return None
        with self._lock:  # one request at a time: numbering and the budget stay consistent
            answer = self._answer(entry, fault)
        if fault is not None and fault.kind == "drop":
            return None
        data = self._encode(answer, entry)
        return entry.status, entry.response_headers, data

    def _encode(self, answer: _Answer, entry: Exchange) -> bytes:
        if isinstance(answer.payload, bytes):
            data = answer.payload
        else:
            data = json.dumps(answer.payload).encode()
            answer.headers.setdefault("content-type", "application/json; charset=utf-8")
        entry.status = answer.status
        entry.response_headers = answer.headers
        entry.response_body = data
        return data

    def _answer(self, entry: Exchange, fault: Fault | None) -> _Answer:
        version = entry.api_version or DEFAULT_API_VERSION
        try:
            self._check_auth(entry.request_headers)
            if fault is not None and fault.kind in {"secondary_rate_limit", "server_error"}:
                answer = self._fault_answer(fault)
            else:
                if entry.api_version is not None and entry.api_version not in API_VERSIONS:
                    raise Problem(400, f"API version {entry.api_version} is not supported.")
                self._spend(entry.path)
                self._validate(entry)
                answer = self._route(entry)
        except Problem as problem:
            if problem.refused:
                entry.refused = problem.message
            answer = _Answer(problem.status, problem.body(), dict(problem.headers))
        answer.headers.update(self._rate_headers())
        answer.headers.setdefault("x-github-media-type", "github.v3; format=json")
        answer.headers["x-github-api-version-selected"] = version
        answer.headers["x-github-request-id"] = f"STANDIN:{len(self.log):05d}"
        return answer

    def _fault_answer(self, fault: Fault) -> _Answer:
        if fault.kind == "secondary_rate_limit":
            message = (
                "You have exceeded a secondary rate limit. Please wait a few minutes before you try "
                "again. If you reach out to GitHub Support for help, please include the request ID "
                "STANDIN:SECONDARY."
            )
            return _Answer(
                fault.status or 403,
                {"message": message, "documentation_url": f"{DOCS}/overview/rate-limits-for-the-rest-api"},
                {"retry-after": str(fault.retry_after)},
            )
        status = fault.status or 502
        if fault.json_body:
            return _Answer(status, {"message": "Server Error", "documentation_url": DOCS})
        page = f"<html><body><h1>{status} Server Error</h1>Unicorn!</body></html>\n".encode()
        return _Answer(status, page, {"content-type": "text/html; charset=utf-8"})

    def _check_auth(self, headers: dict[str, str]) -> None:
        auth = headers.get("authorization")
        if not auth:
            raise Problem(401, "Requires authentication")
        scheme, _, value = auth.partition(" ")
        if scheme.lower() not in {"bearer", "token"} or value.strip() != self.token:
            raise Problem(401, "Bad credentials")

    # ----------------------------------------------------------------- the primary rate limit

    def _roll_window(self) -> None:
        now = self.clock()
        if self._window_reset is None or now >= self._window_reset:
            self._window_reset = math.floor(now) + WINDOW_SECONDS
            self._used = 0

    def _spend(self, path: str) -> None:
        self._roll_window()
        if path == "/rate_limit":
            return  # free, as on GitHub
        if self._used >= self.limit:
            raise Problem(
                self.primary_limit_status,
                "API rate limit exceeded for user ID 1. If you reach out to GitHub Support for help, "
                "please include the request ID STANDIN:PRIMARY and timestamp "
                f"{_iso(self.clock())}.",
            )
        self._used += 1

    def _rate_headers(self) -> dict[str, str]:
        self._roll_window()
        return {
            "x-ratelimit-limit": str(self.limit),
            "x-ratelimit-remaining": str(self.limit - self._used),
            "x-ratelimit-used": str(self._used),
            "x-ratelimit-reset": str(int(self._window_reset or 0)),
            "x-ratelimit-resource": "core",
        }

    # ----------------------------------------------------------------- validation and routing

    def _validate(self, entry: Exchange) -> None:
        from openapi_core.templating.paths.exceptions import PathError

        if entry.request_body:
            try:
                json.loads(entry.request_body)
            except ValueError as exc:
                raise Problem(400, "Problems parsing JSON", refused=True) from exc
        try:
            validate_request_of(entry)
        except PathError as exc:
            raise Problem(404, "Not Found", refused=True) from exc
        except Exception as exc:  # noqa: BLE001 - every other openapi-core refusal is a 422
            raise Problem(422, "Validation Failed", errors=_validation_errors(exc), refused=True) from exc

    def _route(self, entry: Exchange) -> _Answer:
        parts = entry.path.strip("/").split("/")
        method = entry.method
        if parts == ["rate_limit"]:
            return _Answer(200, self._rate_limit_body())
        # validation already matched one of the description's paths
        owner, name = parts[1], parts[2]
        repo = self._existing_repo(owner, name)
        payload = json.loads(entry.request_body) if entry.request_body else {}
        if len(parts) == 4:
            if method == "GET":
                return self._list_issues(repo, entry)
            return self._create_issue(repo, payload)
        item = self._issue(repo, int(parts[4]))
        if len(parts) == 5:
            if method == "GET":
                return _Answer(200, self._issue_out(repo, item))
            return self._update_issue(repo, item, payload)
        if method == "GET":
            return self._list_comments(repo, item, entry)
        return self._create_comment(repo, item, payload)

    def _repo(self, owner: str, name: str) -> Repo:
        key = (owner, name)
        if key not in self._repos:
            self._repos[key] = Repo(owner, name)
        return self._repos[key]

    def _existing_repo(self, owner: str, name: str) -> Repo:
        if self.known_repos is not None and f"{owner}/{name}" not in self.known_repos:
            raise Problem(404, "Not Found")
        return self._repo(owner, name)

    def _issue(self, repo: Repo, number: int) -> Issue:
        for item in repo.issues:
            if item.number == number:
                return item
        raise Problem(404, "Not Found")

    def _next_id(self) -> int:
        self._ids += 1
        return self._ids

    def _new_issue(self, repo: Repo, title: str, body: str | None, labels: list[str]) -> Issue:
        now = self.clock()
        item = Issue(self._next_id(), len(repo.issues) + 1, title, body, [], now, now)
        item.labels = self._labels(repo, labels)
        repo.issues.append(item)
        return item

    def _labels(self, repo: Repo, names: list[Any]) -> list[str]:
        """Label names from a request (names or {name} objects); unknown ones are created."""
        out: list[str] = []
        for value in names:
            name = value if isinstance(value, str) else str(value.get("name", ""))
            if not name:
                invalid = {"resource": "Label", "code": "invalid", "field": "name"}
                raise Problem(422, "Validation Failed", errors=[invalid])
            if name not in repo.labels:
                repo.labels[name] = Label(self._next_id(), name)
            if name not in out:
                out.append(name)
        return out

    def _create_issue(self, repo: Repo, payload: dict[str, Any]) -> _Answer:
        item = self._new_issue(repo, str(payload["title"]), payload.get("body"), list(payload.get("labels") or []))
        out = self._issue_out(repo, item)
        return _Answer(201, out, {"location": str(out["url"])})

    def _update_issue(self, repo: Repo, item: Issue, payload: dict[str, Any]) -> _Answer:
        now = self.clock()
        before = copy.deepcopy(item)
        if payload.get("title") is not None:
            item.title = str(payload["title"])
        if "body" in payload:
            item.body = payload["body"]
        if "labels" in payload:
            item.labels = self._labels(repo, list(payload["labels"] or []))
        state = payload.get("state")
        reason = payload.get("state_reason")
        if state == "closed" and reason == "reopened":
            # the description does not say; a 422 makes such a client bug visible in tests
            raise Problem(
                422, "Validation Failed", errors=[{"resource": "Issue", "code": "invalid", "field": "state_reason"}]
            )
        # `state_reason` is "ignored unless `state` is changed" (the description)
        if state == "closed" and item.state != "closed":
            item.state, item.state_reason, item.closed_at = "closed", reason or "completed", now
        elif state == "open" and item.state == "closed":
            item.state, item.state_reason, item.closed_at = "open", "reopened", None
        if item != before:
            item.updated_at = now
        return _Answer(200, self._issue_out(repo, item))

    def _create_comment(self, repo: Repo, item: Issue, payload: dict[str, Any]) -> _Answer:
        now = self.clock()
        comment = Comment(self._next_id(), str(payload["body"]), now, now)
        item.comments.append(comment)
        item.updated_at = now
        out = self._comment_out(repo, item, comment)
        return _Answer(201, out, {"location": str(out["url"])})

    def _list_issues(self, repo: Repo, entry: Exchange) -> _Answer:
        q = {name: values[-1] for name, values in entry.query.items()}
        state = q.get("state", "open")
        wanted = [name.strip() for name in q.get("labels", "").split(",") if name.strip()]
        since = _epoch(q["since"]) if q.get("since") else None
        rows = [
            i
            for i in repo.issues
            if (state == "all" or i.state == state)
            and all(name in i.labels for name in wanted)
            and (since is None or i.updated_at >= since)
        ]
        sort = q.get("sort", "created")
        keys: dict[str, Callable[[Issue], Any]] = {
            "created": lambda i: (i.created_at, i.number),
            "updated": lambda i: (i.updated_at, i.number),
            "comments": lambda i: (len(i.comments), i.number),
        }
        rows.sort(key=keys[sort], reverse=q.get("direction", "desc") == "desc")
        return self._page(entry, rows, lambda i: self._issue_out(repo, i))

    def _list_comments(self, repo: Repo, item: Issue, entry: Exchange) -> _Answer:
        since_text = entry.query.get("since", [""])[-1]
        since = _epoch(since_text) if since_text else None
        rows = [c for c in item.comments if since is None or c.updated_at >= since]
        return self._page(entry, rows, lambda c: self._comment_out(repo, item, c))

    def _page(self, entry: Exchange, rows: list[Any], render: Callable[[Any], dict[str, Any]]) -> _Answer:
        q = {name: values[-1] for name, values in entry.query.items()}
        per_page = min(max(int(q.get("per_page", "30")), 1), MAX_PER_PAGE)
        page = max(int(q.get("page", "1")), 1)
        last = max(math.ceil(len(rows) / per_page), 1)
        chunk = rows[(page - 1) * per_page : page * per_page]
        links: list[str] = []

        def link(number: int, rel: str) -> None:
            params = dict(q, page=str(number))
            if "per_page" in q:
                params["per_page"] = str(per_page)
            links.append(f'<{self.url}{entry.path}?{urlencode(params)}>; rel="{rel}"')

        if page > 1:
            link(min(page - 1, last), "prev")
        if page < last:
            link(page + 1, "next")
            link(last, "last")
        if page > 1:
            link(1, "first")
        headers = {"link": ", ".join(links)} if links else {}
        return _Answer(200, [render(row) for row in chunk], headers)

    # ----------------------------------------------------------------- answer bodies

    def _rate_limit_body(self) -> dict[str, Any]:
        self._roll_window()
        core = {
            "limit": self.limit,
            "remaining": self.limit - self._used,
            "reset": int(self._window_reset or 0),
            "used": self._used,
        }
        search = {"limit": 30, "remaining": 30, "reset": int(self.clock()) + 60, "used": 0}
        return {"resources": {"core": core, "search": search}, "rate": core}

    def _user(self) -> dict[str, Any]:
        api = f"{self.url}/users/{self.login}"
        return {
            "login": self.login,
            "id": 1,
            "node_id": _node_id("U_", 1),
            "avatar_url": "https://avatars.githubusercontent.com/u/1?v=4",
            "gravatar_id": "",
            "url": api,
            "html_url": f"https://github.com/{self.login}",
            "followers_url": f"{api}/followers",
            "following_url": f"{api}/following{{/other_user}}",
            "gists_url": f"{api}/gists{{/gist_id}}",
            "starred_url": f"{api}/starred{{/owner}}{{/repo}}",
            "subscriptions_url": f"{api}/subscriptions",
            "organizations_url": f"{api}/orgs",
            "repos_url": f"{api}/repos",
            "events_url": f"{api}/events{{/privacy}}",
            "received_events_url": f"{api}/received_events",
            "type": "Bot",
            "user_view_type": "public",
            "site_admin": False,
        }

    def _reactions(self, url: str) -> dict[str, Any]:
        counts = dict.fromkeys(["+1", "-1", "laugh", "confused", "heart", "hooray", "eyes", "rocket"], 0)
        return {"url": f"{url}/reactions", "total_count": 0, **counts}

    def _label_out(self, repo: Repo, name: str) -> dict[str, Any]:
        label = repo.labels[name]
        return {
            "id": label.id,
            "node_id": _node_id("LA_", label.id),
            "url": f"{self.url}/repos/{repo.owner}/{repo.name}/labels/{quote(name, safe='')}",
            "name": label.name,
            "description": label.description,
            "color": label.color,
            "default": False,
        }

    def _issue_out(self, repo: Repo, item: Issue) -> dict[str, Any]:
        base = f"{self.url}/repos/{repo.owner}/{repo.name}"
        url = f"{base}/issues/{item.number}"
        html = f"https://github.com/{repo.owner}/{repo.name}/{'pull' if item.pull_request else 'issues'}/{item.number}"
        out: dict[str, Any] = {
            "id": item.id,
            "node_id": _node_id("PR_" if item.pull_request else "I_", item.id),
            "url": url,
            "repository_url": base,
            "labels_url": f"{url}/labels{{/name}}",
            "comments_url": f"{url}/comments",
            "events_url": f"{url}/events",
            "html_url": html,
            "number": item.number,
            "state": item.state,
            "state_reason": item.state_reason,
            "title": item.title,
            "body": item.body,
            "user": self._user(),
            "labels": [self._label_out(repo, name) for name in item.labels],
            "assignee": None,
            "assignees": [],
            "milestone": None,
            "locked": False,
            "active_lock_reason": None,
            "comments": len(item.comments),
            "closed_at": None if item.closed_at is None else _iso(item.closed_at),
            "created_at": _iso(item.created_at),
            "updated_at": _iso(item.updated_at),
            "closed_by": self._user() if item.state == "closed" else None,
            "author_association": "OWNER",
            "performed_via_github_app": None,
            "timeline_url": f"{url}/timeline",
            "reactions": self._reactions(url),
        }
        if item.pull_request:
            pull = f"{base}/pulls/{item.number}"
            out["draft"] = False
            out["pull_request"] = {
                "url": pull,
                "html_url": html,
                "diff_url": f"{html}.diff",
                "patch_url": f"{html}.patch",
                "merged_at": None,
            }
        return out

    def _comment_out(self, repo: Repo, item: Issue, comment: Comment) -> dict[str, Any]:
        url = f"{self.url}/repos/{repo.owner}/{repo.name}/issues/comments/{comment.id}"
        return {
            "id": comment.id,
            "node_id": _node_id("IC_", comment.id),
            "url": url,
            "html_url": f"https://github.com/{repo.owner}/{repo.name}/issues/{item.number}#issuecomment-{comment.id}",
            "body": comment.body,
            "user": self._user(),
            "created_at": _iso(comment.created_at),
            "updated_at": _iso(comment.updated_at),
            "issue_url": f"{self.url}/repos/{repo.owner}/{repo.name}/issues/{item.number}",
            "author_association": "OWNER",
            "performed_via_github_app": None,
            "reactions": self._reactions(url),
        }
