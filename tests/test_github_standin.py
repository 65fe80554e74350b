"""The GitHub REST API stand-in (tests/doubles/github_server.py) and its trimmed description.

Real HTTP with httpx against the stand-in on 127.0.0.1; time is virtual (tests/doubles/clock.py),
so the rate-limit window resets without waiting. Every test that talks to the server ends with
`check_log()`, which validates each exchange against tests/doubles/github_openapi.json.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.doubles.clock import VirtualClock
from tests.doubles.github_openapi_trim import OPERATIONS, dump, trim
from tests.doubles.github_server import SPEC_PATH, Exchange, GitHubStandIn, SpecMismatch, validate_exchange

TOKEN = "ghp_test"
REPO = "/repos/acme/app"


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
def github(clock: VirtualClock) -> Iterator[GitHubStandIn]:
    with GitHubStandIn(token=TOKEN, clock=lambda: clock.now().timestamp()) as server:
        yield server


@pytest.fixture
def client(github: GitHubStandIn) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {TOKEN}", "X-GitHub-Api-Version": "2022-11-28"}
    with httpx.Client(base_url=github.url, headers=headers, timeout=5) as http:
        yield http


def links(answer: httpx.Response) -> dict[str, str]:
    """rel -> URL of a Link header."""
    return {rel: url for url, rel in re.findall(r'<([^>]+)>; rel="(\w+)"', answer.headers.get("link", ""))}


def create(client: httpx.Client, title: str, **fields: Any) -> dict[str, Any]:
    answer = client.post(f"{REPO}/issues", json={"title": title, **fields})
    assert answer.status_code == 201, answer.text
    issue: dict[str, Any] = answer.json()
    return issue


# --------------------------------------------------------------------------- the description


def test_the_trimmed_description_holds_exactly_the_sync_operations_and_is_valid() -> None:
    from openapi_spec_validator import validate

    text = SPEC_PATH.read_text(encoding="utf-8")
    spec = json.loads(text)
    assert dump(spec) == text  # deterministic: regenerating gives the same bytes
    assert len(text.encode()) < 300_000
    methods = {"get", "put", "post", "patch", "delete", "head", "options", "trace"}
    kept = {path: {m for m in item if m in methods} for path, item in spec["paths"].items()}
    assert kept == {path: set(ops) for path, ops in OPERATIONS.items()}
    pointers = set(re.findall(r'"\$ref": "#/components/(\w+)/([^"]+)"', text))
    assert pointers and all(name in spec["components"][section] for section, name in pointers)
    assert "examples" not in spec["components"] and '"x-octokit":' not in text
    assert None in spec["components"]["schemas"]["issue"]["properties"]["state_reason"]["enum"]
    validate(spec)  # a valid OpenAPI 3.0 document


def test_trim_keeps_referenced_components_transitively_and_nothing_else() -> None:
    ref = {"$ref": "#/components/schemas/a"}
    examples = {"x": {"$ref": "#/components/examples/e"}}
    op = {"responses": {"200": {"content": {"application/json": {"schema": ref, "examples": examples}}}}}
    full: dict[str, Any] = {
        "openapi": "3.0.3",
        "info": {"title": "t", "version": "1"},
        "paths": {path: {m: op for m in methods} | {"delete": op} for path, methods in OPERATIONS.items()},
        "components": {
            "schemas": {
                "a": {"properties": {"b": {"$ref": "#/components/schemas/b"}, "examples": {"type": "string"}}},
                "b": {"type": "string", "nullable": True, "enum": ["x"], "x-octokit": {}},
                "unused": {"type": "string"},
            },
            "examples": {"e": {"value": 1}},
        },
        "x-webhooks": {},
    }
    out = trim(full)
    assert set(out["components"]) == {"schemas"} and set(out["components"]["schemas"]) == {"a", "b"}
    assert "examples" in out["components"]["schemas"]["a"]["properties"]  # a property so named stays
    assert out["components"]["schemas"]["b"] == {"type": "string", "nullable": True, "enum": ["x", None]}
    assert all("delete" not in item for item in out["paths"].values())
    assert "examples" not in json.dumps(out["paths"])


# --------------------------------------------------------------------------- issues


def test_create_get_and_labels_as_objects(github: GitHubStandIn, client: httpx.Client) -> None:
    answer = client.post(f"{REPO}/issues", json={"title": "Flaky: x", "body": "<!-- sig:1 -->", "labels": ["triage"]})
    assert answer.status_code == 201
    issue = answer.json()
    assert issue["number"] == 1 and issue["state"] == "open" and issue["state_reason"] is None
    assert answer.headers["location"] == issue["url"] == f"{github.url}{REPO}/issues/1"
    assert [label["name"] for label in issue["labels"]] == ["triage"] and issue["labels"][0]["id"] > 0
    assert create(client, "second")["number"] == 2  # numbered per repository
    other = client.post("/repos/acme/other/issues", json={"title": "elsewhere"}).json()
    assert other["number"] == 1 and other["id"] != issue["id"]
    got = client.get(f"{REPO}/issues/1").json()
    assert got["body"] == "<!-- sig:1 -->" and got["comments"] == 0
    assert client.get(f"{REPO}/issues/9").status_code == 404
    assert github.issues("acme", "app")[0] | {"updated_at": 0} == {
        "number": 1, "title": "Flaky: x", "body": "<!-- sig:1 -->", "state": "open", "state_reason": None,
        "labels": ["triage"], "closed_at": None, "updated_at": 0, "comments": [],
    }  # fmt: skip
    assert github.log[0].api_version == "2022-11-28"
    assert "POST /repos/{owner}/{repo}/issues 201" in github.check_log()


def test_list_filters_by_labels_and_pages_with_link_headers(
    github: GitHubStandIn, client: httpx.Client, clock: VirtualClock
) -> None:
    for i in range(5):
        github.add_issue("acme", "app", f"t{i}", labels=["triage", "flaky"] if i % 2 else ["triage"])
        clock.sleep(1)
    github.add_issue("acme", "app", "unrelated", labels=["docs"])
    github.add_issue("acme", "app", "closed one", labels=["triage"], state="closed")
    github.add_issue("acme", "app", "a pull request", labels=["triage"], pull_request=True)

    first = client.get(f"{REPO}/issues", params={"state": "all", "labels": "triage", "per_page": 3})
    assert first.status_code == 200 and len(first.json()) == 3
    rels = links(first)
    assert set(rels) == {"next", "last"} and "page=2" in rels["next"] and "page=3" in rels["last"]
    assert "labels=triage" in rels["next"] and "state=all" in rels["next"]
    numbers = [i["number"] for i in first.json()]
    url: str | None = rels["next"]
    while url:
        page = client.get(url)
        numbers += [i["number"] for i in page.json()]
        url = links(page).get("next")
    assert set(links(page)) == {"prev", "first"}
    assert numbers == [8, 7, 5, 4, 3, 2, 1]  # newest first, the pull request included, as GitHub does
    both = client.get(f"{REPO}/issues", params={"labels": "triage,flaky"}).json()
    assert [i["number"] for i in both] == [4, 2]  # state defaults to open; labels are all-of
    assert "link" not in client.get(f"{REPO}/issues").headers  # one page: no Link
    since = client.get(f"{REPO}/issues", params={"since": "2026-01-01T00:00:03Z"}).json()
    assert [i["number"] for i in since] == [8, 6, 5, 4]  # updated at or after 00:00:03
    asc = client.get(f"{REPO}/issues", params={"state": "all", "direction": "asc", "per_page": 2}).json()
    assert [i["number"] for i in asc] == [1, 2]
    assert "pull_request" in client.get(f"{REPO}/issues/8").json()
    assert [i["title"] for i in github.issues("acme", "app")][-1] == "closed one"  # pull requests left out
    github.check_log()


def test_per_page_is_capped_at_100(github: GitHubStandIn, client: httpx.Client) -> None:
    for i in range(101):
        github.add_issue("acme", "app", f"t{i}")
    answer = client.get(f"{REPO}/issues", params={"per_page": 500})
    assert len(answer.json()) == 100
    assert "page=2" in links(answer)["last"] and "per_page=100" in links(answer)["next"]
    github.check_log()


def test_patch_close_reopen_and_state_reasons(github: GitHubStandIn, client: httpx.Client, clock: VirtualClock) -> None:
    issue = create(client, "t", labels=["triage"])
    clock.sleep(60)
    closed = client.patch(f"{REPO}/issues/1", json={"state": "closed"}).json()
    assert closed["state"] == "closed" and closed["state_reason"] == "completed"
    assert closed["closed_at"] == closed["updated_at"] != issue["updated_at"]
    assert closed["closed_by"]["login"] == github.login
    clock.sleep(60)
    reopened = client.patch(f"{REPO}/issues/1", json={"state": "open"}).json()
    assert reopened["state"] == "open" and reopened["state_reason"] == "reopened" and reopened["closed_at"] is None
    not_planned = client.patch(f"{REPO}/issues/1", json={"state": "closed", "state_reason": "not_planned"}).json()
    assert not_planned["state_reason"] == "not_planned"
    same_state = client.patch(f"{REPO}/issues/1", json={"state": "closed", "state_reason": "completed"}).json()
    assert same_state["state_reason"] == "not_planned"  # ignored unless the state changes
    bad = client.patch(f"{REPO}/issues/1", json={"state": "closed", "state_reason": "reopened"})
    assert bad.status_code == 422 and bad.json()["message"] == "Validation Failed"
    clock.sleep(60)
    edited = client.patch(
        f"{REPO}/issues/1", json={"title": "new", "body": "b2", "labels": ["triage", "fresh"], "state_reason": None}
    ).json()
    assert edited["title"] == "new" and edited["body"] == "b2" and edited["state"] == "closed"
    assert [label["name"] for label in edited["labels"]] == ["triage", "fresh"]
    assert edited["updated_at"] > not_planned["updated_at"]
    clock.sleep(60)
    unchanged = client.patch(f"{REPO}/issues/1", json={"title": "new"}).json()
    assert unchanged["updated_at"] == edited["updated_at"]  # nothing changed, nothing stamped
    github.check_log()


def test_comments_count_and_pages(github: GitHubStandIn, client: httpx.Client, clock: VirtualClock) -> None:
    create(client, "t")
    clock.sleep(5)
    for text in ("one", "two", "three"):
        answer = client.post(f"{REPO}/issues/1/comments", json={"body": text})
        assert answer.status_code == 201 and answer.headers["location"] == answer.json()["url"]
    issue = client.get(f"{REPO}/issues/1").json()
    assert issue["comments"] == 3 and issue["updated_at"] != issue["created_at"]
    page = client.get(f"{REPO}/issues/1/comments", params={"per_page": 2})
    assert [c["body"] for c in page.json()] == ["one", "two"]  # oldest first
    assert [c["body"] for c in client.get(links(page)["next"]).json()] == ["three"]
    assert [c["body"] for c in github.issues("acme", "app")[0]["comments"]] == ["one", "two", "three"]
    assert client.post(f"{REPO}/issues/7/comments", json={"body": "x"}).status_code == 404
    assert client.post(f"{REPO}/issues/1/comments", json={}).status_code == 422
    github.check_log()


def test_rate_limit_endpoint_is_free_and_matches_headers(github: GitHubStandIn, client: httpx.Client) -> None:
    create(client, "t")
    answer = client.get("/rate_limit")
    core = answer.json()["resources"]["core"]
    assert core == answer.json()["rate"]
    assert core["used"] == 1 and core["remaining"] == 4999
    assert answer.headers["x-ratelimit-used"] == "1" and answer.headers["x-ratelimit-resource"] == "core"
    assert github.check_log()[-1] == "GET /rate_limit 200"


# --------------------------------------------------------------------------- auth and refusals


def test_auth_bearer_or_token_else_401(github: GitHubStandIn) -> None:
    url = f"{github.url}{REPO}/issues"
    assert httpx.get(url, headers={"Authorization": f"token {TOKEN}"}).status_code == 200
    missing = httpx.get(url)
    assert missing.status_code == 401 and missing.json()["message"] == "Requires authentication"
    wrong = httpx.post(url, json={"title": "t"}, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert wrong.json()["message"] == "Bad credentials" and wrong.json()["documentation_url"].startswith("https://")
    assert "x-ratelimit-remaining" in wrong.headers
    assert github.issues("acme", "app") == []
    assert github.check_log()[1:] == [
        "GET /repos/{owner}/{repo}/issues 401 (basic-error)",
        "POST /repos/{owner}/{repo}/issues 401 (basic-error)",
    ]


def test_requests_the_description_refuses_are_answered_like_github(
    github: GitHubStandIn, client: httpx.Client
) -> None:
    no_title = client.post(f"{REPO}/issues", json={"body": "x"})
    assert no_title.status_code == 422
    assert no_title.json()["errors"][0] | {"message": ""} == {
        "resource": "Issue", "code": "missing_field", "field": "title", "message": "",
    }  # fmt: skip
    assert client.patch(f"{REPO}/issues/1", json={"state": "done"}).status_code == 422
    assert client.get(f"{REPO}/issues", params={"per_page": "many"}).status_code == 422
    assert client.get(f"{REPO}/issues", params={"since": "yesterday"}).status_code == 422
    assert client.post(f"{REPO}/issues", content=b"{not json").status_code == 400
    assert client.get(f"{REPO}/pulls").status_code == 404  # not an operation of the description
    assert client.delete(f"{REPO}/issues/1").status_code == 404
    unsupported = client.get(f"{REPO}/issues", headers={"X-GitHub-Api-Version": "2020-01-01"})
    assert unsupported.status_code == 400
    assert github.issues("acme", "app") == []
    assert all(entry.refused for entry in github.log[:-1])
    github.check_log()


# --------------------------------------------------------------------------- the primary rate limit


def test_primary_rate_limit_exhausts_then_resets_in_virtual_time(clock: VirtualClock) -> None:
    with GitHubStandIn(token=TOKEN, limit=3, clock=lambda: clock.now().timestamp()) as github:
        http = httpx.Client(base_url=github.url, headers={"Authorization": f"Bearer {TOKEN}"})
        answers = [http.post(f"{REPO}/issues", json={"title": f"t{i}"}) for i in range(4)]
        assert [a.status_code for a in answers] == [201, 201, 201, 403]
        refused = answers[-1]
        assert refused.json()["message"].startswith("API rate limit exceeded")
        assert refused.headers["x-ratelimit-remaining"] == "0" and refused.headers["x-ratelimit-used"] == "3"
        reset = int(refused.headers["x-ratelimit-reset"])
        assert reset == int(clock.now().timestamp()) + 3600
        assert [a.headers["x-ratelimit-remaining"] for a in answers[:3]] == ["2", "1", "0"]
        assert http.get("/rate_limit").json()["resources"]["core"]["remaining"] == 0  # still answers
        assert len(github.issues("acme", "app")) == 3
        clock.sleep(reset - clock.now().timestamp() - 1)
        assert http.get(f"{REPO}/issues").status_code == 403  # a second before the reset
        clock.sleep(1)
        again = http.get(f"{REPO}/issues")
        assert again.status_code == 200 and again.headers["x-ratelimit-remaining"] == "2"
        assert int(again.headers["x-ratelimit-reset"]) == reset + 3600
        http.close()
        github.check_log()
    with GitHubStandIn(token=TOKEN, limit=1, primary_limit_status=429) as github:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        statuses = [httpx.get(f"{github.url}{REPO}/issues", headers=auth).status_code for _ in range(2)]
        assert statuses == [200, 429]


# --------------------------------------------------------------------------- faults


def test_secondary_rate_limit_fault_with_retry_after(github: GitHubStandIn, client: httpx.Client) -> None:
    github.fail_next("secondary_rate_limit", method="POST", path_suffix="/issues", retry_after=30)
    assert client.get(f"{REPO}/issues").status_code == 200  # does not match: the fault waits
    refused = client.post(f"{REPO}/issues", json={"title": "t"})
    assert refused.status_code == 403 and refused.headers["retry-after"] == "30"
    assert refused.json()["message"].startswith("You have exceeded a secondary rate limit")
    assert "x-ratelimit-limit" in refused.headers
    assert github.issues("acme", "app") == []  # nothing applied
    assert client.post(f"{REPO}/issues", json={"title": "t"}).status_code == 201  # consumed
    github.fail_next("secondary_rate_limit", status=429, retry_after=5, count=2)
    assert [client.get(f"{REPO}/issues").status_code for _ in range(3)] == [429, 429, 200]
    assert github.pending_faults() == []
    checked = github.check_log()
    assert "POST /repos/{owner}/{repo}/issues 403" in checked  # the description lists 403 for a create
    assert "GET /repos/{owner}/{repo}/issues 429 (basic-error)" in checked


def test_server_error_fault_html_page(github: GitHubStandIn, client: httpx.Client) -> None:
    github.fail_next("server_error", method="PATCH")
    create(client, "t")
    answer = client.patch(f"{REPO}/issues/1", json={"state": "closed"})
    assert answer.status_code == 502 and answer.headers["content-type"].startswith("text/html")
    assert github.issues("acme", "app")[0]["state"] == "open"
    github.check_log()


def test_server_error_json_503(github: GitHubStandIn, client: httpx.Client) -> None:
    github.fail_next("server_error", status=503, json_body=True)
    answer = client.post(f"{REPO}/issues", json={"title": "t"})
    assert answer.status_code == 503 and answer.json()["message"] == "Server Error"
    assert "x-ratelimit-remaining" in answer.headers
    assert github.issues("acme", "app") == []
    assert github.check_log() == ["POST /repos/{owner}/{repo}/issues 503"]


def test_drop_after_apply_leaves_the_write_without_an_answer(github: GitHubStandIn, client: httpx.Client) -> None:
    github.fail_next("drop", method="POST", path_suffix="/issues")
    with pytest.raises(httpx.RemoteProtocolError):
        client.post(f"{REPO}/issues", json={"title": "lost answer", "body": "<!-- sig:9 -->"})
    assert [i["title"] for i in github.issues("acme", "app")] == ["lost answer"]  # it landed
    listed = client.get(f"{REPO}/issues").json()
    assert [i["body"] for i in listed] == ["<!-- sig:9 -->"]  # a client that lists first finds it
    assert github.log[0].status == 0 and github.log[0].fault == "drop"
    github.fail_next("drop", method="POST", path_suffix="/comments")
    with pytest.raises(httpx.RemoteProtocolError):
        client.post(f"{REPO}/issues/1/comments", json={"body": "c"})
    assert client.get(f"{REPO}/issues/1").json()["comments"] == 1
    assert github.check_log()[0] == "POST /repos/{owner}/{repo}/issues dropped (request only)"


def test_drop_before_applies_nothing(github: GitHubStandIn, client: httpx.Client) -> None:
    create(client, "t")
    github.fail_next("drop_before", method="PATCH")
    with pytest.raises(httpx.RemoteProtocolError):
        client.patch(f"{REPO}/issues/1", json={"state": "closed"})
    assert github.issues("acme", "app")[0]["state"] == "open"
    github.fail_next("drop", method="POST", apply_then_drop=False)
    with pytest.raises(httpx.RemoteProtocolError):
        client.post(f"{REPO}/issues", json={"title": "never"})
    assert len(github.issues("acme", "app")) == 1
    assert client.get("/rate_limit").json()["resources"]["core"]["used"] == 1  # never reached "GitHub"
    github.check_log()


def test_fail_next_refuses_unknown_kinds(github: GitHubStandIn) -> None:
    with pytest.raises(ValueError, match="unknown fault"):
        github.fail_next("timeout")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- check_log can fail


def test_check_log_catches_a_response_missing_a_required_field(
    github: GitHubStandIn, client: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    create(client, "t")
    github.check_log()
    original = GitHubStandIn._issue_out

    def without_number(self: GitHubStandIn, repo: Any, item: Any) -> dict[str, Any]:
        out = original(self, repo, item)
        del out["number"]
        return out

    monkeypatch.setattr(GitHubStandIn, "_issue_out", without_number)
    assert client.get(f"{REPO}/issues/1").status_code == 200
    with pytest.raises(SpecMismatch, match="'number' is a required property"):
        github.check_log()


def test_validate_exchange_catches_bad_requests_and_unjustified_refusals(github: GitHubStandIn) -> None:
    headers = {"content-type": "application/json; charset=utf-8"}
    accepted_bad = Exchange("POST", f"{REPO}/issues", {}, {}, b'{"body": "no title"}', 201, headers, b"{}")
    with pytest.raises(SpecMismatch, match="request"):
        validate_exchange(accepted_bad)
    refused_good = Exchange(
        "POST", f"{REPO}/issues", {}, {}, b'{"title": "fine"}', 422, headers,
        b'{"message": "Validation Failed", "documentation_url": "x"}', refused="Validation Failed",
    )  # fmt: skip
    with pytest.raises(SpecMismatch, match="refused"):
        validate_exchange(refused_good)
    wrong_type = Exchange("GET", "/rate_limit", {}, {}, b"", 200, headers, b'{"rate": {}, "resources": {}}')
    with pytest.raises(SpecMismatch):
        validate_exchange(wrong_type)
    not_an_error = Exchange("GET", "/rate_limit", {}, {}, b"", 401, headers, b'{"message": 1}')
    with pytest.raises(SpecMismatch, match="basic-error"):
        validate_exchange(not_an_error)
