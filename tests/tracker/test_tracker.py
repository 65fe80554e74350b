"""A signature's life and its tracker issue, piece by piece (`triage.domain.tracker`,
`triage.sinks.issues`, `triage.tracker.plan`): releases and regressions, escalation, the trust gate,
what a public issue may carry, and the plan's drafts. The whole loop over HTTP is
tests/tracker/test_issues_sync.py."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from triage.domain.config import TrackerConfig
from triage.domain.tracker import (
    Member,
    SignatureState,
    TrackerComment,
    TrackerIssue,
    escalation,
    fixed,
    issue_marker,
    marked_signature,
    next_state,
    trusted,
)
from triage.sinks.issues import issue_body, issue_title
from triage.tracker import plan

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 12, 3, 4, 0, tzinfo=UTC)


def state(**changes: object) -> SignatureState:
    base = SignatureState(
        signature="sig-abc",
        layer="retrieval",
        component="katib",
        owners=["kubeflow/katib"],
        title="How do I limit parallel trials?",
        status="recurring",
        at=NOW,
        nights=[2, 1, 0, 0, 0, 0, 0, 0],
        share=0.1,
        sure=1,
        judge="heuristic",
        traces=["t1", "t2"],
        questions=["How do I limit parallel trials?"],
        pages=["https://www.kubeflow.org/docs/components/katib/"],
    )
    return base.model_copy(update=changes)


def member(release: str | None, trace: str = "t9") -> Member:
    return Member(trace, "q?", NOW - timedelta(hours=1), release, sure=False, page=None)


def grow(previous: SignatureState | None, members: list[Member], nights: list[int] | None = None) -> SignatureState:
    return next_state(
        previous, signature="sig-abc", layer="retrieval", component="katib", owners=["kubeflow/katib"],
        title="t", status="recurring", nights=nights or [len(members), 1, 0, 0, 0, 0, 0, 0],
        totals=[20, 20, 20, 20, 20, 20, 20, 20], members=members, at=NOW, judge="heuristic", alpha=0.05,
    )  # fmt: skip


# -- the life in releases ------------------------------------------------------------------------


def test_the_first_release_is_kept_and_the_last_follows_the_members() -> None:
    first = grow(None, [member("2026.11.2")])
    later = grow(first, [member("2026.12.0")])
    assert (first.first_release, first.last_release) == ("2026.11.2", "2026.11.2")
    assert (later.first_release, later.last_release) == ("2026.11.2", "2026.12.0")


@pytest.mark.parametrize(
    ("release", "regressed"),
    [("2026.12.0", False), ("2026.12.1", True), ("2026.12.10", True), (None, False)],
)
def test_a_fixed_signature_regresses_only_in_its_release_or_a_later_one(release: str | None, regressed: bool) -> None:
    # version order, not text order: 2026.12.10 is after 2026.12.1
    was = fixed(grow(None, [member("2026.11.2")]), release="2026.12.1", run="check-1", at=NOW - timedelta(days=1))
    assert was.is_fixed and was.status == "fixed"
    now = grow(was, [member(release)])
    assert now.has_regressed is regressed
    assert (now.status == "regressed") is regressed
    assert now.fixed_in == "2026.12.1" and now.fixed_by == "check-1"
    if regressed:
        assert now.regressed_in == release


def test_escalating_needs_tonights_share_above_the_nights_before_beyond_chance() -> None:
    rising, p = escalation([8, 1, 0, 1, 0, 0, 0, 0], [20, 20, 20, 20, 20, 20, 20, 20], alpha=0.05)
    assert rising and p is not None and p < 0.001
    flat, p_flat = escalation([1, 1, 1, 1, 1, 1, 1, 1], [20] * 8, alpha=0.05)
    assert not flat and p_flat is not None and p_flat > 0.5
    assert escalation([3, 0, 0, 0, 0, 0, 0, 0], [20, 0, 0, 0, 0, 0, 0, 0], alpha=0.05) == (False, None)


# -- the trust gate ------------------------------------------------------------------------------


def test_the_trust_gate_takes_sure_confirmed_or_a_measured_judge_and_nothing_else() -> None:
    assert trusted(state(sure=1), None, 0.6) == "1 sure verdict(s)"
    assert trusted(state(sure=0, confirmed=2), None, 0.6) == "2 confirmed by a reviewer"
    assert "0.72" in (trusted(state(sure=0), 0.72, 0.6) or "")
    assert trusted(state(sure=0), 0.59, 0.6) is None
    assert trusted(state(sure=0), None, 0.6) is None


class Seen:
    """A tracker that holds given issues and records nothing (plan only reads)."""

    def __init__(self, issues: dict[str, TrackerIssue] | None = None) -> None:
        self.held = issues or {}

    def issues(self, repo: str, label: str) -> list[TrackerIssue]:
        return list(self.held.values())

    def comments(self, repo: str, number: int) -> list[TrackerComment]:
        return []

    def create(self, *args: object, **kwargs: object) -> TrackerIssue:
        raise AssertionError("plan writes nothing")

    comment = edit = create


def test_the_plan_opens_trusted_issues_and_drafts_the_rest_with_why() -> None:
    config = TrackerConfig(allow=["kubeflow/katib"], min_count=2)
    states = {
        "sig-sure": state(signature="sig-sure"),
        "sig-unsure": state(signature="sig-unsure", sure=0),
        "sig-other": state(signature="sig-other", owners=["kubeflow/pipelines"]),
        "sig-small": state(signature="sig-small", nights=[1, 0, 0, 0, 0, 0, 0, 0]),
        "sig-fixed": state(signature="sig-fixed", status="fixed", fixed_in="1", fixed_at=NOW),
    }
    steps, drafts = plan(states, config, lambda judge: None, Seen(), lambda t: f"https://lf.example/trace/{t}")
    assert [(s.kind, s.signature, s.repo) for s in steps] == [("create", "sig-sure", "kubeflow/katib")]
    why = {d.signature: d.reason for d in drafts}
    assert set(why) == {"sig-unsure", "sig-other"}
    assert "not trusted" in why["sig-unsure"] and "not in [tracker] allow" in why["sig-other"]
    # a measured judge makes the unsure one trusted
    steps, _ = plan(states, config, lambda judge: 0.8, Seen(), lambda t: None)
    assert {s.signature for s in steps} == {"sig-sure", "sig-unsure"}


# -- what a public issue carries -----------------------------------------------------------------

PRIVATE = {
    "email": "write to ana.lopez@example.org please",
    "credentials": "clone https://bob:hunter2pass@git.example.com/repo.git",
    "token": "my token ghp_" + "A" * 36,
    "key": "aws AKIAIOSFODNN7EXAMPLE here",
    "jwt": "cookie eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbmEifQ.c2lnbmF0dXJlLXZhbHVl",
    "openai": "key sk-proj-abcdefghijklmnop",
}
RAW = {
    "email": "ana.lopez@example.org",
    "credentials": "hunter2pass",
    "token": "ghp_" + "A" * 36,
    "key": "AKIAIOSFODNN7EXAMPLE",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbmEifQ",
    "openai": "sk-proj-abcdefghijklmnop",
}


@pytest.mark.parametrize("kind", sorted(PRIVATE))
def test_no_private_text_of_any_kind_reaches_an_issue(kind: str) -> None:
    text = PRIVATE[kind]
    leaky = state(title=text, questions=[text], comments=[text], pages=[f"https://docs.example/{text}"])
    body = issue_body(leaky, trust="sure", trace_url=lambda t: None, include_comments=True)
    title = issue_title(leaky)
    for out in (body, title):
        assert RAW[kind] not in out


def test_users_comments_stay_out_unless_configured() -> None:
    said = state(comments=["this answer was useless"])
    assert "useless" not in issue_body(said, trust="sure", trace_url=lambda t: None, include_comments=False)
    assert "useless" in issue_body(said, trust="sure", trace_url=lambda t: None, include_comments=True)


def test_a_question_cannot_forge_a_marker_or_a_link() -> None:
    hostile = "<!-- triage-signature: sig-other --> [click](https://evil.example) <script>x</script>"
    body = issue_body(state(questions=[hostile]), trust="sure", trace_url=lambda t: None, include_comments=False)
    assert marked_signature(body) == "sig-abc" and issue_marker("sig-other") not in body
    assert "<script>" not in body and "](https://evil" not in body
    assert body.startswith(issue_marker("sig-abc"))


def test_trace_links_are_made_only_of_safe_addresses() -> None:
    body = issue_body(
        state(traces=["t1", "t2"]),
        trust="sure",
        trace_url=lambda t: "https://lf.example/trace/t1" if t == "t1" else "javascript:alert(1)",
        include_comments=False,
    )
    assert "[t1](https://lf.example/trace/t1)" in body
    assert "(javascript:" not in body


# -- the command on embedded defaults -------------------------------------------------------------


@pytest.mark.slow
def test_issues_sync_on_embedded_defaults_prints_its_dry_run_plan(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "triage", "issues", "sync"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("# Issues sync: dry run")
    assert "29 signature(s) read, 29 below the thresholds" in done.stdout
    assert "No GitHub token" in done.stdout
    applied = subprocess.run(
        [sys.executable, "-m", "triage", "issues", "sync", "--apply"], env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert applied.returncode == 3 and "GITHUB_TOKEN" in applied.stderr
