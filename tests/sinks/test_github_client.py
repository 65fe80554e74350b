"""The GitHub issues client (triage/sinks/github.py) against the GitHub stand-in, over real HTTP.

Time is virtual (tests/doubles/clock.py): the stand-in's rate-limit window and every wait of the
client read the same clock, so an hour's reset takes no time. Every exchange is validated against
GitHub's OpenAPI description when each test ends (the `github` fixture's `check_log()`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import httpx
import pytest

from tests.doubles.clock import VirtualClock
from tests.doubles.github_server import GitHubStandIn
from triage.domain.tracker import TrackerComment, TrackerIssue
from triage.errors import ConfigError, SourceError
from triage.retry import RetryPolicy
from triage.sinks.github import GitHubError, GitHubIssueGone, GitHubIssues, GitHubRateLimited, GitHubRejected

TOKEN = "ghp_s3cretTokenValue42"
REPO = "acme/app"
MARKER = "<!-- triage:signature=abc123 -->"
BODY = f"Flaky retrieval on page X\n\n{MARKER}"
#: no jitter: the back-offs a test sees are the policy's, exactly
RETRY = RetryPolicy(attempts=4, initial=1.0, maximum=8.0, jitter=0.0)


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
def github(clock: VirtualClock) -> Iterator[GitHubStandIn]:
    with GitHubStandIn(token=TOKEN, repos=[REPO], clock=lambda: clock.now().timestamp()) as server:
        yield server
        server.check_log()  # every exchange of every test, against GitHub's description


@pytest.fixture
def client(github: GitHubStandIn, clock: VirtualClock) -> Iterator[GitHubIssues]:
    with GitHubIssues(token=TOKEN, api_url=github.url, clock=clock, retry=RETRY) as issues:
        yield issues


def posts(github: GitHubStandIn, suffix: str) -> int:
    return len(github.requests("POST", suffix))


# --------------------------------------------------------------------------- the round trip


def test_create_find_comment_edit_round_trip(github: GitHubStandIn, client: GitHubIssues) -> None:
    created = client.create(
        REPO, title="Flaky: retrieval", body=BODY, labels=["triage", "flaky"], marker=MARKER
    )
    assert created == TrackerIssue(
        1, "Flaky: retrieval", BODY, "open", ("triage", "flaky"), "https://github.com/acme/app/issues/1"
    )
    assert client.find(REPO, "triage", MARKER) == created
    assert client.find(REPO, "triage", "<!-- triage:signature=other -->") is None
    assert client.find(REPO, "docs", MARKER) is None  # filtered by the label

    first = client.comment(REPO, 1, f"seen again\n{MARKER}:1", marker=f"{MARKER}:1")
    second = client.comment(REPO, 1, f"and again\n{MARKER}:2", marker=f"{MARKER}:2")
    assert isinstance(first, TrackerComment) and isinstance(second, TrackerComment)
    assert client.comments(REPO, 1) == [first, second]

    closed = client.edit(REPO, 1, body=BODY + "\nfixed", state="closed", state_reason="not_planned")
    assert closed.state == "closed" and closed.body.endswith("fixed")
    assert github.issues("acme", "app")[0]["state_reason"] == "not_planned"
    assert client.find(REPO, "triage", MARKER) == closed  # closed issues are found too
    assert client.edit(REPO, 1, state="open").state == "open"

    sent = github.log
    assert client.requests == len(sent) == 10
    headers = sent[0].request_headers
    assert headers["accept"] == "application/vnd.github+json" and headers["user-agent"] == "triage"
    assert headers["authorization"] == f"Bearer {TOKEN}" and sent[0].api_version == "2022-11-28"
    listing = github.requests("GET", "/issues")[0].query
    assert listing["state"] == ["all"] and listing["labels"] == ["triage"] and listing["per_page"] == ["100"]


def test_find_reads_every_page_and_skips_pull_requests(github: GitHubStandIn, client: GitHubIssues) -> None:
    for i in range(1, 151):
        body = MARKER if i in (120, 140) else f"<!-- triage:signature={i} -->"
        github.add_issue(
            "acme", "app", f"t{i}", body=body, labels=["triage"], state="closed" if i == 120 else "open"
        )
    github.add_issue(
        "acme", "app", "a pull request", body=MARKER, labels=["triage"], pull_request=True
    )  # 151
    github.add_issue("acme", "app", "another label", body=MARKER, labels=["docs"])  # 152

    found = client.find(REPO, "triage", MARKER)
    assert found is not None and found.number == 120 and found.state == "closed"  # the lowest number
    assert len(github.requests("GET", "/issues")) == 2  # 100 + 51 rows, by the Link header
    listed = client.issues(REPO, "triage")
    assert [i.number for i in listed] == list(range(1, 151))  # no pull request, no duplicate


def test_comments_read_every_page(github: GitHubStandIn, client: GitHubIssues) -> None:
    number = github.add_issue("acme", "app", "t", body=MARKER, labels=["triage"])
    for i in range(105):
        client.comment(REPO, number, f"run {i} {MARKER}:{i}", marker=f"{MARKER}:{i}")
    assert [c.body.split()[1] for c in client.comments(REPO, number)] == [str(i) for i in range(105)]
    assert len(github.requests("GET", "/comments")) == 2


# --------------------------------------------------------------------------- writes made once


FAULTS = [
    pytest.param({"kind": "drop"}, id="drop-after-apply"),
    pytest.param({"kind": "drop_before"}, id="drop-before"),
    pytest.param({"kind": "server_error", "status": 502}, id="502"),
    pytest.param({"kind": "server_error", "status": 503, "json_body": True}, id="503-json"),
    pytest.param({"kind": "secondary_rate_limit", "retry_after": 30}, id="secondary-403"),
    pytest.param({"kind": "secondary_rate_limit", "retry_after": 30, "status": 429}, id="secondary-429"),
]


@pytest.mark.parametrize("fault", FAULTS)
def test_a_fault_mid_create_ends_with_exactly_one_issue(
    github: GitHubStandIn, client: GitHubIssues, clock: VirtualClock, fault: dict[str, object]
) -> None:
    github.add_issue("acme", "app", "someone else's", body="<!-- triage:signature=zzz -->", labels=["triage"])
    github.fail_next(method="POST", path_suffix="/issues", **fault)  # type: ignore[arg-type]
    issue = client.create(REPO, title="Flaky", body=BODY, labels=["triage"], marker=MARKER)
    stored = github.issues("acme", "app")
    assert [i["body"] for i in stored].count(BODY) == 1 and len(stored) == 2
    assert issue.number == 2 and issue.body == BODY
    if fault["kind"] == "drop":
        # the write landed: it was found by its marker, never posted again
        assert posts(github, "/issues") == 1 and len(github.requests("GET", "/issues")) == 1
    elif fault["kind"] == "secondary_rate_limit":
        # refused, not lost: waited as asked, in virtual time, and sent again without a look-up
        assert clock.sleeps == [30] and posts(github, "/issues") == 2
        assert github.requests("GET") == []
    else:  # lost and not applied: looked up, not found, posted again
        assert posts(github, "/issues") == 2 and len(github.requests("GET", "/issues")) == 1
        assert clock.sleeps == [1.0]  # the policy's first back-off


@pytest.mark.parametrize("fault", FAULTS)
def test_a_fault_mid_comment_ends_with_exactly_one_comment(
    github: GitHubStandIn, client: GitHubIssues, clock: VirtualClock, fault: dict[str, object]
) -> None:
    number = github.add_issue("acme", "app", "t", body=MARKER, labels=["triage"])
    client.comment(REPO, number, "an earlier run", marker="earlier")
    marker = f"{MARKER}:run-7"
    github.fail_next(method="POST", path_suffix="/comments", **fault)  # type: ignore[arg-type]
    made = client.comment(REPO, number, f"seen again in run 7 {marker}", marker=marker)
    bodies = [c["body"] for c in github.issues("acme", "app")[0]["comments"]]
    assert len(bodies) == 2 and sum(marker in b for b in bodies) == 1
    assert made is not None and marker in made.body
    assert made.id == github.issues("acme", "app")[0]["comments"][1]["id"]
    expected_posts = 2 if fault["kind"] == "drop" else 3  # the earlier comment's, and this one's
    assert posts(github, "/comments") == expected_posts


def test_a_lost_answer_on_every_attempt_is_found_not_duplicated(
    github: GitHubStandIn, client: GitHubIssues
) -> None:
    github.fail_next("drop", method="POST", path_suffix="/issues", count=5)
    issue = client.create(REPO, title="Flaky", body=BODY, labels=["triage"], marker=MARKER)
    assert len(github.issues("acme", "app")) == 1 and issue.number == 1
    assert posts(github, "/issues") == 1


def test_a_write_that_keeps_failing_gives_up_as_a_github_error(
    github: GitHubStandIn, client: GitHubIssues, clock: VirtualClock
) -> None:
    github.fail_next("server_error", method="POST", path_suffix="/issues", count=10)
    with pytest.raises(GitHubError, match="HTTP 502 .gave up") as caught:
        client.create(REPO, title="Flaky", body=BODY, labels=["triage"], marker=MARKER)
    assert isinstance(caught.value, SourceError)
    assert posts(github, "/issues") == RETRY.attempts and clock.sleeps == [1.0, 2.0, 4.0]
    assert github.issues("acme", "app") == []


def test_a_connection_never_made_is_posted_again_without_a_look_up() -> None:
    sent: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request.method)
        if len(sent) == 1:
            raise httpx.ConnectError("refused", request=request)
        issue = {"number": 1, "title": "t", "body": BODY, "state": "open", "labels": [], "html_url": "h"}
        return httpx.Response(201, json=issue)

    clock = VirtualClock()
    with GitHubIssues(token=TOKEN, transport=httpx.MockTransport(answer), clock=clock, retry=RETRY) as client:
        assert client.create(REPO, title="t", body=BODY, labels=["triage"], marker=MARKER).number == 1
        assert sent == ["POST", "POST"] and client.requests == 2


def test_edit_is_retried_directly_after_a_lost_answer(
    github: GitHubStandIn, client: GitHubIssues, clock: VirtualClock
) -> None:
    number = github.add_issue("acme", "app", "t", body=MARKER, labels=["triage"])
    github.fail_next("drop", method="PATCH")
    github.fail_next("server_error", method="PATCH")
    closed = client.edit(REPO, number, state="closed", state_reason="completed")
    assert closed.state == "closed" and github.issues("acme", "app")[0]["state_reason"] == "completed"
    assert len(github.requests("PATCH")) == 3 and github.requests("GET") == []
    assert clock.sleeps == [1.0, 2.0]


# --------------------------------------------------------------------------- rate limits


def test_primary_limit_spent_elsewhere_waits_for_the_reset_then_succeeds(clock: VirtualClock) -> None:
    with GitHubStandIn(token=TOKEN, limit=2, clock=lambda: clock.now().timestamp()) as github:
        for _ in range(2):  # another client spends the budget
            httpx.get(f"{github.url}/repos/acme/app/issues", headers={"Authorization": f"Bearer {TOKEN}"})
        with GitHubIssues(token=TOKEN, api_url=github.url, clock=clock, max_wait=4000) as client:
            issue = client.create(REPO, title="t", body=BODY, labels=["triage"], marker=MARKER)
        assert issue.number == 1
        refused = github.requests("POST")[0]
        assert refused.status == 403 and refused.response_headers["x-ratelimit-remaining"] == "0"
        reset = float(refused.response_headers["x-ratelimit-reset"])
        assert clock.sleeps == [pytest.approx(reset - 1767225600.0 + 1.0)]  # to the reset, and a second
        assert [e.status for e in github.requests("POST")] == [403, 201]
        github.check_log()


def test_a_spent_budget_is_waited_out_before_the_request_is_sent(clock: VirtualClock) -> None:
    with GitHubStandIn(token=TOKEN, limit=2, clock=lambda: clock.now().timestamp()) as github:
        with GitHubIssues(token=TOKEN, api_url=github.url, clock=clock, max_wait=4000) as client:
            for i in range(3):
                client.create(REPO, title="t", body=f"{BODY}{i}", labels=["triage"], marker=f"{MARKER}{i}")
        assert [e.status for e in github.log] == [201, 201, 201]  # no request was refused
        assert len(clock.sleeps) == 1 and 3600 <= clock.sleeps[0] <= 3602
        github.check_log()


@pytest.mark.parametrize("limit", ["primary", "secondary"])
def test_a_wait_beyond_max_wait_raises_without_sleeping(clock: VirtualClock, limit: str) -> None:
    with GitHubStandIn(token=TOKEN, limit=1, clock=lambda: clock.now().timestamp()) as github:
        if limit == "primary":
            httpx.get(f"{github.url}/repos/acme/app/issues", headers={"Authorization": f"Bearer {TOKEN}"})
        else:
            github.fail_next("secondary_rate_limit", retry_after=3600)
        with GitHubIssues(token=TOKEN, api_url=github.url, clock=clock) as client:
            with pytest.raises(
                GitHubRateLimited, match=r"waiting 360\d s .* longer than the 900 s allowed"
            ) as caught:
                client.find(REPO, "triage", MARKER)
        assert clock.sleeps == [] and caught.value.wait >= 3600
        assert isinstance(caught.value, SourceError)
        github.check_log()


def test_a_secondary_limit_without_retry_after_waits_a_minute_then_doubles(
    github: GitHubStandIn, client: GitHubIssues, clock: VirtualClock
) -> None:
    original = github._fault_answer

    def no_retry_after(fault: object) -> object:
        answer = original(fault)  # type: ignore[arg-type]
        answer.headers.pop("retry-after", None)
        return answer

    github._fault_answer = no_retry_after  # type: ignore[method-assign,assignment]
    github.fail_next("secondary_rate_limit", count=2)
    assert client.issues(REPO, "triage") == []
    assert clock.sleeps == [60.0, 120.0]


# --------------------------------------------------------------------------- refusals


def test_a_refused_token_is_a_config_error_without_the_token(
    github: GitHubStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = "ghp_wrongButSecretValue99"
    with GitHubIssues(token=wrong, api_url=github.url, clock=VirtualClock()) as client:
        with pytest.raises(ConfigError, match="GitHub refused the token") as caught:
            client.create(REPO, title="t", body=BODY, labels=["triage"], marker=MARKER)
    assert wrong not in str(caught.value) and TOKEN not in str(caught.value)
    assert len(github.log) == 1  # a refusal is not retried
    assert wrong not in caplog.text


def test_an_unknown_repository_is_a_config_error_naming_it(
    github: GitHubStandIn, client: GitHubIssues
) -> None:
    with pytest.raises(ConfigError, match="acme/nope not found, or the token cannot see it") as caught:
        client.find("acme/nope", "triage", MARKER)
    assert TOKEN not in str(caught.value)
    with pytest.raises(ConfigError, match="acme/nope"):
        client.create("acme/nope", title="t", body=BODY, labels=["triage"], marker=MARKER)
    assert len(github.log) == 2


def test_a_missing_issue_and_an_invalid_edit(github: GitHubStandIn, client: GitHubIssues) -> None:
    with pytest.raises(GitHubIssueGone, match="acme/app#9") as gone:
        client.comments(REPO, 9)
    assert gone.value.number == 9
    number = github.add_issue("acme", "app", "t", body=MARKER, labels=["triage"])
    with pytest.raises(GitHubRejected, match="Validation Failed") as rejected:
        client.edit(REPO, number, state="closed", state_reason="reopened")
    assert "state_reason" in str(rejected.value) and TOKEN not in str(rejected.value)


def test_arguments_that_would_break_the_guarantees_are_refused(client: GitHubIssues) -> None:
    with pytest.raises(ValueError, match="marker must be in the body"):
        client.create(REPO, title="t", body="no marker", labels=["triage"], marker=MARKER)
    with pytest.raises(ValueError, match="needs a label"):
        client.create(REPO, title="t", body=BODY, labels=[], marker=MARKER)
    with pytest.raises(ConfigError, match="owner/name"):
        client.issues("acme/app/../other", "triage")
    assert client.requests == 0


def test_a_page_link_to_another_host_is_not_followed() -> None:
    hosts: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        hosts.append(request.url.host)
        link = '<https://evil.example/repos/acme/app/issues?page=2>; rel="next"'
        return httpx.Response(200, json=[], headers={"link": link})

    with GitHubIssues(token=TOKEN, transport=httpx.MockTransport(answer), clock=VirtualClock()) as client:
        with pytest.raises(GitHubError, match="another host") as caught:
            client.issues(REPO, "triage")
    assert hosts == ["api.github.com"] and TOKEN not in str(caught.value)


def test_retries_are_logged_without_the_token(
    github: GitHubStandIn, client: GitHubIssues, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="triage")
    github.fail_next("server_error", method="GET")
    github.fail_next("secondary_rate_limit", method="GET", retry_after=5)
    assert client.issues(REPO, "triage") == []
    assert "retrying after HTTP 502" in caplog.text and "waiting 5 s" in caplog.text
    assert TOKEN not in caplog.text


def test_a_message_that_echoes_the_token_is_masked() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        echoed = {
            "message": f"Invalid request: {request.headers['authorization']}",
            "errors": [{"token": TOKEN}],
        }
        return httpx.Response(422, json=echoed)

    with GitHubIssues(token=TOKEN, transport=httpx.MockTransport(answer), clock=VirtualClock()) as client:
        with pytest.raises(GitHubRejected, match="Invalid request") as caught:
            client.edit(REPO, 1, state="closed")
    assert TOKEN not in str(caught.value) and "***" in str(caught.value)


@pytest.mark.parametrize(
    ("status", "message", "error", "says"),
    [
        (410, "Issues are disabled for this repo", ConfigError, "issues are disabled in acme/app"),
        (403, "Resource not accessible by integration", ConfigError, "lacks the permission"),
        (400, "Bad request", GitHubError, "HTTP 400"),
    ],
)
def test_other_refusals_are_classified(status: int, message: str, error: type[Exception], says: str) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            status, json={"message": message, "documentation_url": "https://docs.github.com"}
        )

    with GitHubIssues(token=TOKEN, transport=httpx.MockTransport(answer), clock=VirtualClock()) as client:
        with pytest.raises(error, match=says) as caught:
            client.issues(REPO, "triage")
        assert client.requests == 1  # refused, not retried
    assert message in str(caught.value)
