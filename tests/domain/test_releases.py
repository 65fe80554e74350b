"""The release watch (`triage.domain.releases`): the statistics against known values and brute force,
the flag, the gate, counts from rows, and the seeded simulation of bench/releases.py."""

from __future__ import annotations

import importlib.util
import math
import random
import sys
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from pathlib import Path
from types import ModuleType

import pytest
from pydantic import ValidationError

from triage.domain.records import Layer
from triage.domain.release_counts import ReleaseCounts, TraceRow, from_rows
from triage.domain.releases import COMPARED_LAYERS, compare, gate, rate, release_stats, watch
from triage.domain.stats import fisher_greater, holm, min_p_value, wilson

ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 12, 1, 3, 0, tzinfo=UTC)
OWNERS = {
    Layer.RETRIEVAL: ["agent-team"],
    Layer.GENERATION: ["agent-team"],
    Layer.CONTENT_GAP_HANDLED: ["docs-wg"],
    Layer.CONTENT_GAP_HALLUCINATION: ["agent-team", "docs-wg"],
}


def counts(
    name: str,
    answers: int,
    thumbs_down: int,
    layers: dict[Layer, int] | None = None,
    *,
    votes: int | None = None,
    hours: int = 0,
    signatures: dict[str, int] | None = None,
) -> ReleaseCounts:
    first = T0 + timedelta(hours=hours)
    return ReleaseCounts(
        release=name,
        first_seen=first,
        last_seen=first + timedelta(hours=20),
        answers=answers,
        votes=answers // 3 if votes is None else votes,
        thumbs_down=thumbs_down,
        layers=layers or {},
        signatures=signatures or {},
    )


# -- Fisher's exact test -----------------------------------------------------------------------


def brute_force(a: int, n1: int, b: int, n2: int) -> Fraction:
    """P(X >= a) by summing every hypergeometric probability, in exact integers."""
    k, n = a + b, n1 + n2
    top = sum(math.comb(k, x) * math.comb(n - k, n1 - x) for x in range(a, min(k, n1) + 1))
    return Fraction(top, math.comb(n, n1))


def test_fisher_lady_tasting_tea() -> None:
    # Fisher (1935): 4 cups of each kind, 3 of the milk-first ones named right: 17/70; all 4: 1/70
    assert fisher_greater(3, 4, 1, 4) == pytest.approx(17 / 70, rel=1e-12)
    assert fisher_greater(4, 4, 0, 4) == pytest.approx(1 / 70, rel=1e-12)
    assert fisher_greater(2, 4, 2, 4) == pytest.approx(53 / 70, rel=1e-12)
    assert fisher_greater(0, 4, 4, 4) == 1.0


def test_fisher_against_brute_force_on_every_small_table() -> None:
    for n1 in range(9):
        for n2 in range(9):
            for a in range(n1 + 1):
                for b in range(n2 + 1):
                    expected = float(brute_force(a, n1, b, n2))
                    assert fisher_greater(a, n1, b, n2) == pytest.approx(expected, rel=1e-11, abs=1e-15), (
                        a,
                        n1,
                        b,
                        n2,
                    )


@pytest.mark.parametrize(
    "table",
    [
        (20, 1234, 8, 1329),  # the upper tail (a above the mode)
        (3, 400, 9, 400),  # the lower tail (1 - the other side)
        (60, 10_000, 40, 10_000),
        (45, 10_000, 55, 10_000),  # the mode's neighbourhood, at a large count
        (40, 40_000, 10, 40_000),  # a small p-value at a large count
    ],
)
def test_fisher_against_brute_force_at_realistic_and_large_counts(table: tuple[int, int, int, int]) -> None:
    assert fisher_greater(*table) == pytest.approx(float(brute_force(*table)), rel=1e-8)


def test_fisher_against_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")
    rng = random.Random(29)
    for _ in range(300):
        n1, n2 = rng.choice([(50, 60), (900, 1400), (50_000, 70_000)])
        a, b = int(rng.random() * min(n1, 80)), int(rng.random() * min(n2, 80))
        expected = stats.fisher_exact([[a, n1 - a], [b, n2 - b]], alternative="greater").pvalue
        assert fisher_greater(a, n1, b, n2) == pytest.approx(expected, rel=1e-7, abs=1e-300)


def test_fisher_refuses_what_is_no_table() -> None:
    for table in [(5, 4, 0, 4), (-1, 4, 0, 4), (0, 4, 5, 4)]:
        with pytest.raises(ValueError, match="2x2"):
            fisher_greater(*table)


def test_min_p_value_is_the_most_extreme_table_these_margins_allow() -> None:
    assert min_p_value(1, 100, 0, 100) == pytest.approx(0.5)  # one failure: at best a coin
    assert min_p_value(0, 100, 0, 100) == 1.0
    assert min_p_value(2, 4, 2, 4) == pytest.approx(1 / 70)  # all 4 failures in the first row
    assert min_p_value(3, 4, 1, 4) == fisher_greater(4, 4, 0, 4)
    assert min_p_value(0, 0, 3, 10) == 1.0  # no answers: nothing to reach


# -- Wilson intervals and Holm's correction ----------------------------------------------------


@pytest.mark.parametrize(
    ("count", "total", "low", "high"),
    [
        # Newcombe (1998), Stat Med 17:857, table I, method 3 (the score interval)
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
        # 0 of 10: the upper bound is z^2 / (n + z^2); 5 of 10 is symmetric about 0.5
        (0, 10, 0.0, 0.2775),
        (5, 10, 0.2366, 0.7634),
        (10, 10, 0.7225, 1.0),
    ],
)
def test_wilson_known_values(count: int, total: int, low: float, high: float) -> None:
    got = wilson(count, total)
    assert got == pytest.approx((low, high), abs=5e-5)


def test_wilson_against_statsmodels_and_its_edges() -> None:
    proportion = pytest.importorskip("statsmodels.stats.proportion")
    for count, total in [(3, 1000), (47, 1500), (0, 1), (1, 1), (499, 1000)]:
        expected = proportion.proportion_confint(count, total, alpha=0.05, method="wilson")
        assert wilson(count, total) == pytest.approx(tuple(expected), abs=1e-9)
    assert wilson(0, 7)[0] == 0.0 and wilson(7, 7)[1] == 1.0
    with pytest.raises(ValueError):
        wilson(0, 0)
    with pytest.raises(ValueError):
        wilson(3, 2)
    assert rate(0, 0).value is None and rate(0, 0).low is None
    assert rate(3, 10).value == pytest.approx(0.3)


def test_holm_known_values() -> None:
    # sorted: 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 = 0.04 -> kept at 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.4]) == pytest.approx([0.8, 0.8])
    assert holm([0.9, 0.8, 0.7]) == pytest.approx([1.0, 1.0, 1.0])
    assert holm([0.02]) == [0.02]
    assert holm([]) == []
    with pytest.raises(ValueError):
        holm([0.1, float("nan")])


def test_holm_against_statsmodels() -> None:
    multitest = pytest.importorskip("statsmodels.stats.multitest")
    rng = random.Random(7)
    for size in (1, 2, 5, 7):
        p = [rng.random() ** 3 for _ in range(size)]
        _, expected, _, _ = multitest.multipletests(p, alpha=0.05, method="holm")
        assert holm(p) == pytest.approx(list(expected))


# -- the flag, the gate ------------------------------------------------------------------------


def test_a_clear_rise_in_one_layer_is_flagged_with_its_owners() -> None:
    baseline = counts("r1", 1000, 40, {Layer.RETRIEVAL: 8, Layer.GENERATION: 20}, signatures={"ret-a": 8})
    candidate = counts(
        "r2",
        1100,
        75,
        {Layer.RETRIEVAL: 40, Layer.GENERATION: 22},
        hours=24,
        signatures={"ret-a": 10, "ret-b": 30},
    )
    result = compare(candidate, baseline, owners=OWNERS)
    assert result.worse
    assert result.flagged_layers == [Layer.RETRIEVAL]
    assert result.owners == ["agent-team"]
    assert result.overall.higher  # 75 of 1100 against 40 of 1000 too
    retrieval = next(t for t in result.tests if t.layer is Layer.RETRIEVAL)
    assert retrieval.p_value == pytest.approx(float(brute_force(40, 1100, 8, 1000)))
    assert retrieval.p_adjusted is not None and retrieval.p_value <= retrieval.p_adjusted <= 0.05
    assert retrieval.candidate.count == 40 and retrieval.candidate.total == 1100
    generation = next(t for t in result.tests if t.layer is Layer.GENERATION)
    assert not generation.higher
    assert result.new_signatures == ["ret-b"]
    # the owners may come from a callable, as from a mapping
    by_call = compare(candidate, baseline, owners=lambda layer: [f"owner-of-{layer}"])
    assert by_call.owners == ["owner-of-retrieval"]


def test_the_owners_of_a_content_layer_that_grew() -> None:
    baseline = counts("r1", 1000, 10, {Layer.CONTENT_GAP_HALLUCINATION: 2})
    candidate = counts("r2", 1000, 40, {Layer.CONTENT_GAP_HALLUCINATION: 30}, hours=1)
    assert compare(candidate, baseline, owners=OWNERS).owners == ["agent-team", "docs-wg"]


def test_equal_rates_are_not_flagged() -> None:
    layers = {Layer.RETRIEVAL: 12, Layer.GENERATION: 20, Layer.TOOL_ROUTING: 3}
    baseline = counts("r1", 1200, 50, layers)
    candidate = counts("r2", 1200, 50, layers, hours=24)
    result = compare(candidate, baseline, owners=OWNERS)
    assert not result.worse and result.flagged_layers == [] and result.owners == []
    assert all(t.p_value > 0.5 for t in result.tests if t.p_adjusted is not None)


def test_a_rise_that_is_within_chance_is_not_flagged() -> None:
    # 6 against 3 in a thousand: higher, but nothing a thousand answers can tell from chance
    result = compare(
        counts("r2", 1000, 30, {Layer.RETRIEVAL: 6}), counts("r1", 1000, 27, {Layer.RETRIEVAL: 3})
    )
    assert not result.worse
    retrieval = next(t for t in result.tests if t.layer is Layer.RETRIEVAL)
    assert 0.05 < retrieval.p_value < 0.5


def test_a_fall_is_never_flagged() -> None:
    result = compare(
        counts("r2", 1000, 10, {Layer.RETRIEVAL: 2}), counts("r1", 1000, 60, {Layer.RETRIEVAL: 40})
    )
    assert not result.worse
    assert result.overall.p_value > 0.99


def test_holm_counts_every_test_that_could_be_flagged_and_only_those() -> None:
    baseline = counts("r1", 1000, 40, {Layer.RETRIEVAL: 8, Layer.GENERATION: 20, Layer.TOOL_ROUTING: 1})
    candidate = counts("r2", 1000, 60, {Layer.RETRIEVAL: 24, Layer.GENERATION: 20}, hours=1)
    result = compare(candidate, baseline)
    by_layer = {t.layer: t for t in result.tests}
    assert [t.layer for t in result.tests] == [None, *COMPARED_LAYERS]
    # no failure in either release, or one alone (at best p = 0.5): out of the family
    assert by_layer[Layer.CONTENT_GAP_HANDLED].p_adjusted is None
    assert by_layer[Layer.TOOL_ROUTING].p_adjusted is None
    assert by_layer[Layer.TOOL_ROUTING].min_p_value == pytest.approx(0.5)
    assert result.family_size == 3  # thumbs-down, generation, retrieval
    in_family = [t for t in result.tests if t.p_adjusted is not None]
    assert [t.p_adjusted for t in in_family] == pytest.approx(holm([t.p_value for t in in_family]))
    # without the screen every test counts, so each adjusted p-value is at least as high
    plain = compare(candidate, baseline, screen=False)
    assert plain.family_size == 1 + len(COMPARED_LAYERS)
    assert all(
        p.p_adjusted is not None and s.p_adjusted is not None and p.p_adjusted >= s.p_adjusted
        for p, s in zip(plain.tests, result.tests, strict=True)
        if s.p_adjusted is not None
    )


def test_rates_per_vote() -> None:
    baseline = counts("r1", 1000, 30, {Layer.RETRIEVAL: 10}, votes=300)
    candidate = counts("r2", 1000, 30, {Layer.RETRIEVAL: 10}, votes=150, hours=1)
    # the same failures over half the votes: per vote the rate doubled, per answer nothing changed
    assert not compare(candidate, baseline).worse
    per_vote = compare(candidate, baseline, per="votes")
    assert per_vote.worse and per_vote.overall.candidate.total == 150
    stats = release_stats(candidate, "votes")
    assert stats.thumbs_down_rate.value == pytest.approx(0.2)
    assert stats.vote_rate.value == pytest.approx(0.15)


def test_the_gate_decides_on_the_named_pair() -> None:
    good = counts("v1", 1500, 45, {Layer.RETRIEVAL: 12, Layer.GENERATION: 25})
    bad = counts("v2", 1500, 90, {Layer.RETRIEVAL: 50, Layer.GENERATION: 25}, hours=48)
    result = gate(bad, good, 0.05, owners=OWNERS)
    assert result.worse and result.comparison.flagged_layers == [Layer.RETRIEVAL]
    assert result.candidate.release == "v2" and result.baseline.release == "v1"
    assert result.candidate.thumbs_down_rate.count == 90
    assert result.model_dump(mode="json")["worse"] is True  # what --json prints
    # one-sided: the better release passes against the worse, whatever was seen first
    assert not gate(good, bad).worse
    # the level is the gate's: a rise that passes at 0.05 fails at 1e-9
    assert not gate(bad, good, 1e-9).worse
    with pytest.raises(ValueError, match="same release"):
        gate(good, good)
    with pytest.raises(ValueError, match="alpha"):
        gate(bad, good, 0.0)


def test_watch_compares_each_release_with_the_one_seen_before() -> None:
    r1 = counts("r1", 1000, 30, {Layer.RETRIEVAL: 8})
    r2 = counts("r2", 1000, 31, {Layer.RETRIEVAL: 9}, hours=24)
    r3 = counts("r3", 1000, 80, {Layer.RETRIEVAL: 50}, hours=48)
    found = watch([r3, r1, r2], owners=OWNERS)  # in any order
    assert [s.release for s in found.releases] == ["r1", "r2", "r3"]
    assert [(c.candidate, c.baseline) for c in found.comparisons] == [("r2", "r1"), ("r3", "r2")]
    assert found.flagged == ["r3"]
    assert found.comparison_of("r1") is None
    r3_vs_r2 = found.comparison_of("r3")
    assert r3_vs_r2 is not None and r3_vs_r2.owners == ["agent-team"]
    assert found.releases[2].layers[0].layer is Layer.RETRIEVAL
    assert found.releases[2].layers[0].rate.value == pytest.approx(0.05)
    with pytest.raises(ValueError, match="more than once"):
        watch([r1, r1])


def test_counts_that_do_not_add_up_are_refused() -> None:
    with pytest.raises(ValidationError, match="thumbs-down <= votes <= answers"):
        counts("r", 100, 40, votes=30)
    with pytest.raises(ValidationError, match="triaged"):
        counts("r", 100, 5, {Layer.RETRIEVAL: 6})
    with pytest.raises(ValidationError, match="timezone"):
        ReleaseCounts(
            release="r",
            first_seen=datetime(2026, 1, 1),
            last_seen=datetime(2026, 1, 2),
            answers=1,
            votes=0,
            thumbs_down=0,
        )
    with pytest.raises(ValidationError):
        counts("", 10, 0)


# -- counts from rows --------------------------------------------------------------------------


def row(trace: str, release: str | None, minutes: int, vote: float | None = None, **more: object) -> TraceRow:
    return TraceRow.model_validate(
        {
            "trace_id": trace,
            "release": release,
            "timestamp": T0 + timedelta(minutes=minutes),
            "vote": vote,
            **more,
        }
    )


def test_counts_from_rows() -> None:
    rows = [
        row("t1", "r1", 0, 0.0, layer="retrieval", signature="sig-1", version="1.0"),
        row("t2", "r1", 5, 1.0, version="1.0"),
        row("t3", "r1", 9),  # an answer no one voted on
        row("t4", "r1", 7, 0.0, version="1.1"),  # a thumbs-down not triaged yet: no layer
        row("t5", None, 3, 0.0, layer="generation"),  # no release: counted apart
        row("t6", "  ", 4),  # a blank release is none
        row("t7", "r0", -60, 1.0),  # an earlier release
        # one answer in two rows: the vote, then its verdict (that row does not repeat the release)
        row("t8", "r0", -50, 0.0),
        row("t8", None, -50, layer="generation", signature="sig-2"),
    ]
    made = from_rows(rows)
    assert made.unreleased == 2
    assert made.notes == []
    r0, r1 = made.releases  # by first seen
    assert (r0.release, r0.answers, r0.votes, r0.thumbs_down, r0.layers) == (
        "r0",
        2,
        2,
        1,
        {Layer.GENERATION: 1},
    )
    assert r0.signatures == {"sig-2": 1} and r0.version is None
    assert (r1.release, r1.answers, r1.votes, r1.thumbs_down) == ("r1", 4, 3, 2)
    assert r1.layers == {Layer.RETRIEVAL: 1} and r1.untriaged == 1
    assert r1.signatures == {"sig-1": 1}
    assert r1.version == "1.0"  # the most common
    assert (r1.first_seen, r1.last_seen) == (T0, T0 + timedelta(minutes=9))


def test_rows_that_disagree_are_noted_never_a_crash() -> None:
    rows = [
        row("a", "r1", 0, 1.0, layer="retrieval"),  # a layer on a thumbs-up
        row("b", "r1", 1, layer="generation"),  # a layer without any vote
        row("c", "r1", 2, 0.0, layer="retrieval"),
        row("c", "r1", 2, layer="generation"),  # two verdicts on one answer
        row("d", "r1", 3, 0.0),
        row("d", "r2", 3),  # one answer, two releases
        row("e", "r2", 4, 1.0),
        row("e", "r2", 4, 0.0),  # two votes, one of them down: a thumbs-down
    ]
    made = from_rows(rows)
    reasons = {(n.trace_id, n.reason) for n in made.notes}
    assert ("a", "a layer without a thumbs-down: not counted") in reasons
    assert ("b", "a layer without a thumbs-down: not counted") in reasons
    assert ("c", "layers generation, retrieval on one answer: counted as none") in reasons
    assert ("d", "named by releases r1, r2: counted in none") in reasons
    assert len(made.notes) == 4
    r1, r2 = made.releases
    assert (r1.answers, r1.votes, r1.thumbs_down, r1.layers, r1.untriaged) == (3, 2, 1, {}, 1)
    assert (r2.answers, r2.votes, r2.thumbs_down) == (1, 1, 1)


def test_rows_refuse_what_cannot_be_read() -> None:
    with pytest.raises(ValidationError):
        row("t", "r", 0, float("nan"))
    with pytest.raises(ValidationError):
        row("t", "r", 0, 0.0, layer="not-a-layer")
    with pytest.raises(ValidationError):
        TraceRow(trace_id="t", release="r", timestamp=datetime(2026, 1, 1))


# -- the simulation (bench/releases.py) ---------------------------------------------------------


def load_bench() -> ModuleType:
    # a script, not a module of the package: load it from its file
    spec = importlib.util.spec_from_file_location("bench_releases", ROOT / "bench" / "releases.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_simulated_rise_is_flagged_and_quiet_nights_are_not() -> None:
    bench = load_bench()
    world = bench.World()
    after = {**bench.BASE_RATES, Layer.RETRIEVAL: 0.08}
    baseline, candidate = bench.night(random.Random(1), world, (5000, 5000), after)
    found = watch([baseline, candidate], owners=bench.OWNERS)
    assert found.flagged == ["r2"]
    (comparison,) = found.comparisons
    assert Layer.RETRIEVAL in comparison.flagged_layers and "agent-team" in comparison.owners
    rng = random.Random(2)
    alarms = sum(
        bool(watch(bench.night(rng, world, (400, 1500), bench.BASE_RATES)).flagged) for _ in range(100)
    )
    assert alarms <= 10


def test_the_benchmark_prints_its_tables(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_bench()
    assert (
        bench.main(["--power-seeds", "5", "--nights", "10", "--long-run", "0", "--power-volumes", "400"]) == 0
    )
    out = capsys.readouterr().out
    assert "| answers per release | nights |" in out
    assert "| nights | releases flagged (false alarms) |" in out
    assert "flagged: **" in out
