"""Issue 37 item 2: a request budget every Langfuse call keeps to, paced before sending.

Langfuse Cloud limits each organisation in fixed windows (the general API 30 / 100 / 1,000 requests
a minute on Hobby / Core / Pro). `[langfuse] requests_per_minute` (or `plan`) makes every request of
the process wait for its slot; the stand-in counts on the same virtual clock and answers 429 past
the limit, so a night that keeps the budget meets none.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from tests.doubles.clock import VirtualClock
from tests.doubles.langfuse_server import LangfuseStandIn
from tests.sources.test_langfuse_cli import run, scored, thumbs_down
from triage.domain.config import CLOUD_PLANS, LangfuseConfig, LangfuseLimits
from triage.retry import PaceExceeded, Pacer, Rate, use_clock
from triage.sources.langfuse.http import api_group, pacers


def test_a_pacer_keeps_every_window_and_says_how_long_a_plan_takes() -> None:
    clock = VirtualClock()
    pacer = Pacer([Rate(30, 60.0)], clock=clock)
    sent = []
    for _ in range(95):
        pacer.wait()
        sent.append(clock.monotonic())
    # any 60 s, sliding (so every fixed window too), holds at most 30
    assert max(sum(1 for t in sent if start <= t < start + 60) for start in sent) == 30
    assert sent[29] == 0.0 and sent[30] == 60.0 and sent[94] == 180.0
    assert Pacer([Rate(30, 60.0)]).seconds_for(95) == 180.0 == pacer.waited
    assert Pacer([Rate(30, 60.0)]).seconds_for(30) == 0.0


def test_a_wait_past_the_longest_allowed_is_an_error_not_a_day_of_sleep() -> None:
    clock = VirtualClock()
    pacer = Pacer([Rate(2, 86400.0)], clock=clock, max_wait=120.0)
    pacer.wait()
    pacer.wait()
    with pytest.raises(PaceExceeded, match="2 a day"):
        pacer.wait()
    assert clock.monotonic() == 0.0


def test_requests_are_counted_in_the_group_cloud_counts_them_in() -> None:
    assert api_group("/api/public/v2/observations") == "general"
    assert api_group("/api/public/v3/scores") == "general"
    assert api_group("/api/public/scores") == "general"
    assert api_group("/api/public/v2/datasets") == "datasets"
    assert api_group("/api/public/datasets/regressions/runs") == "datasets"
    assert api_group("/api/public/dataset-run-items") == "datasets"
    assert api_group("/api/public/experiments") == "datasets"
    assert api_group("/api/public/experiment-items") == "datasets"
    assert api_group("/api/public/v2/metrics") == "metrics"
    assert api_group("/api/public/otel/v1/traces") == "ingestion"


def test_a_plan_takes_clouds_limits_and_a_number_overrides_them() -> None:
    assert LangfuseConfig(plan="hobby").limits() == CLOUD_PLANS["hobby"]
    assert LangfuseConfig(plan="hobby", requests_per_minute=20).limits().general_per_minute == 20
    assert LangfuseConfig().limits() == LangfuseLimits()
    groups = pacers(LangfuseConfig(plan="hobby").limits())
    assert set(groups) == {"general", "datasets", "metrics"}
    assert [str(r) for r in groups["metrics"].rates] == ["100 a day"]
    assert pacers(LangfuseLimits()) == {}


@pytest.mark.slow
def test_1200_thumbs_down_at_30_a_minute_meet_no_429_in_the_planned_time(tmp_path: Path) -> None:
    traces = thumbs_down(1200)
    config = tmp_path / "triage.toml"
    config.write_text("[langfuse]\nrequests_per_minute = 30\n", encoding="utf-8")
    clock = VirtualClock()
    with use_clock(clock), LangfuseStandIn(records=traces, rate_limit_per_minute=30, clock=clock.monotonic) as server:
        result = run(server, "--config", str(config))
        assert result.exit_code == 0, result.output
        assert scored(server, [t["traceId"] for t in traces]) == {t["traceId"] for t in traces}
        statuses = Counter(r.status for r in server.log)
        # paced before sending: the limit is (all but) never met, and a 429 met is waited out
        assert statuses[429] <= 2, statuses
        requests = len(server.log)
    plan = re.search(r"about (\d+) requests in all at 30 a minute: about ([\d.]+) minutes", result.output)
    assert plan, result.output
    planned, minutes = int(plan.group(1)), float(plan.group(2))
    # the plan is an estimate of the requests; the time follows from it at the budget
    assert 0.8 * requests <= planned <= 1.25 * requests, (planned, requests)
    taken = clock.monotonic() / 60
    assert minutes * 0.75 <= taken <= minutes * 1.25 + 1, (taken, minutes)
