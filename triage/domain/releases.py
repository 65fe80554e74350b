"""The release watch: how each release of the agent fares with its users, and whether one made things worse.

Pure (no I/O). A source gives counts per release, or one row per answer made counts
(`domain.release_counts`); this module gives
the figures `triage releases` and the report show (`watch`) and the release gate (`gate`), as
records, never rendered.

The figures, and why these (the statistics themselves, shared with calibration, are in
`triage.domain.stats`):

- **Rates** are per answer by default (`per="answers"`): a layer's rate is that layer's triaged
  thumbs-down over the release's answers (traces), "how often users hit this failure", and the
  thumbs-down rate is every thumbs-down over the answers, so the layer rates add up to at most the
  thumbs-down rate and one denominator serves every test. A vote is an answer's, so the table of a
  test is a true 2x2 (each answer has the failure or not). Its weakness: a release that changes how
  often users vote (a new feedback button) changes every rate; `ReleaseStats.vote_rate` shows it,
  and `per="votes"` (thumbs-down and layers over the voted answers) is there for that case.
- **Intervals** are Wilson score 95% intervals (`stats.wilson`): unlike the normal approximation's they
  stay inside [0, 1] and keep their coverage at the small counts and rates near 0 that thumbs-down
  rates are.
- **Comparisons**: each release against the one before it (by first seen, at the resolution the
  source's times have: two releases first seen in the same hour bucket of a metrics API are a tie,
  which the version order of their names breaks, `version_key`), on the thumbs-down rate
  and on each failure layer's rate (`COMPARED_LAYERS`: every layer but `ok`), one-sided, "the
  candidate's rate is higher". The test is Fisher's exact test on the 2x2 table (`stats.fisher_greater`):
  exact at any count, so a layer with 4 failures against 12 is tested as honestly as a rate over
  thousands, and conservative (its false alarms stay at or under the level asked), and cheap at a
  million answers.
- **The family**: the tests of one release pair are corrected together with Holm's step-down
  (`stats.holm`): the chance that any of them flags a pair that did not get worse stays at most `alpha`,
  whatever the dependence between them (a layer's failures are thumbs-down too). Fisher's test is
  discrete: from its table's margins alone (the answers, and the failures of both releases together)
  one knows the smallest p-value it can reach (`stats.min_p_value`). A test that could not reach `alpha`
  even alone can never be flagged, and counting it would only raise everyone else's bar, so it is
  left out of the family (Tarone's screen, 1990; `screen=False` keeps every test). The layers with
  no failure in either release are the obvious case; a layer with 1 failure against 0 is another.
- **A flag**: a release is flagged (`Comparison.worse`) when any test of the family rejects at
  `alpha` after Holm; the owners of the layers that grew are named (`owners`: a mapping or a
  callable layer -> owners, from the configuration, given by the caller).
- **The gate** (`gate`: `triage releases --candidate R --baseline R0`): the same comparison between
  two named releases, whatever their order in time; `Gate.worse` is the exit code's decision.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from itertools import pairwise
from typing import TypeAlias, TypedDict, Unpack

from pydantic import (
    Field,
    computed_field,
)

from triage.domain.records import Layer
from triage.domain.release_counts import (
    Per,
    ReleaseCounts,
    ReleaseFigures,
    ReleaseRecord,
    in_order,
)
from triage.domain.stats import fisher_greater, holm, min_p_value, wilson
from triage.domain.tracker import SignatureState
from triage.errors import ExitCode

#: the default level of the flag and the gate: the family-wise false-alarm rate per release pair
ALPHA = 0.05
#: the failure layers compared by default, in the report's order: not `ok` (a thumbs-down the judge
#: found no fault in is no failure a team can fix; its rate is still shown)
COMPARED_LAYERS: tuple[Layer, ...] = tuple(layer for layer in Layer if layer is not Layer.OK)

#: who owns a layer's failures: the configuration's, given by the caller
Owners: TypeAlias = Mapping[Layer, Sequence[str]] | Callable[[Layer], Sequence[str]]


class CompareOptions(TypedDict, total=False):
    """How a release pair is compared besides `alpha`: `compare`'s keywords (and defaults), which
    `watch` and `gate` pass on to it."""

    per: Per
    owners: Owners | None
    layers: Iterable[Layer]
    screen: bool


# -- what the sources give ---------------------------------------------------------------------


# -- what the report needs ---------------------------------------------------------------------


class Rate(ReleaseRecord):
    """`count` of `total`, with its Wilson 95% interval (all None when `total` is 0)."""

    count: int
    total: int
    value: float | None
    low: float | None
    high: float | None


def rate(count: int, total: int) -> Rate:
    if total == 0:
        if count:
            raise ValueError(f"{count} out of nothing")
        return Rate(count=0, total=0, value=None, low=None, high=None)
    low, high = wilson(count, total)
    return Rate(count=count, total=total, value=count / total, low=low, high=high)


class LayerRate(ReleaseRecord):
    layer: Layer
    rate: Rate


class SignatureCount(ReleaseRecord):
    signature: str
    count: int


class ReleaseStats(ReleaseFigures):
    """One release's figures: its counts, its rates over `per`, its failures' layers and signatures."""

    untriaged: int  # thumbs-down without a layer
    per: Per
    vote_rate: Rate  # votes over answers: a change here moves every per-answer rate
    thumbs_down_rate: Rate
    layers: list[LayerRate]  # every layer it has a failure in, in the report's order
    signatures: list[SignatureCount]  # the most failures first


def release_stats(counts: ReleaseCounts, per: Per = "answers") -> ReleaseStats:
    over = counts.over(per)
    return ReleaseStats(
        **counts.model_dump(include=set(ReleaseFigures.model_fields)),  # carried over as counted
        untriaged=counts.untriaged,
        per=per,
        vote_rate=rate(counts.votes, counts.answers),
        thumbs_down_rate=rate(counts.thumbs_down, over),
        layers=[
            LayerRate(layer=layer, rate=rate(counts.layers[layer], over))
            for layer in Layer
            if counts.layers.get(layer, 0) > 0
        ],
        signatures=[SignatureCount(signature=s, count=n) for s, n in _most_first(counts.signatures)],
    )


def _most_first(signatures: Mapping[str, int]) -> list[tuple[str, int]]:
    """The signatures with failures, the most failures first (then by name)."""
    return sorted(((s, n) for s, n in signatures.items() if n > 0), key=lambda item: (-item[1], item[0]))


class RateTest(ReleaseRecord):
    """One comparison: is the candidate's rate higher than the baseline's?"""

    layer: Layer | None  # None: the thumbs-down rate
    candidate: Rate
    baseline: Rate
    p_value: float  # one-sided Fisher exact test
    min_p_value: float  # the smallest p-value these margins allow
    #: Holm-adjusted over the pair's family; None: left out of it (could not reach alpha alone)
    p_adjusted: float | None
    higher: bool  # beyond chance: p_adjusted <= alpha
    owners: list[str]  # the layer's owners (none for the thumbs-down rate)


class Comparison(ReleaseRecord):
    """A release (the candidate) against another (the baseline): the thumbs-down rate and each
    compared layer's, corrected together."""

    candidate: str
    baseline: str
    per: Per
    alpha: float
    tests: list[RateTest]  # the thumbs-down rate first, then the layers in the report's order
    #: the candidate's signatures the baseline has no failure in, the most failures first
    new_signatures: list[str]

    @property
    def overall(self) -> RateTest:
        return self.tests[0]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def family_size(self) -> int:
        """How many tests Holm's correction counted."""
        return sum(t.p_adjusted is not None for t in self.tests)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def flagged_layers(self) -> list[Layer]:
        return [t.layer for t in self.tests if t.layer is not None and t.higher]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def worse(self) -> bool:
        """The thumbs-down rate, or one layer's, higher beyond chance."""
        return any(t.higher for t in self.tests)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def owners(self) -> list[str]:
        """The owners of the layers that grew beyond chance, each once."""
        return list(
            dict.fromkeys(o for t in self.tests if t.layer is not None and t.higher for o in t.owners)
        )


def _owners_of(owners: Owners | None, layer: Layer) -> list[str]:
    if owners is None:
        return []
    if isinstance(owners, Mapping):
        return list(owners.get(layer, ()))
    return list(owners(layer))


def _check_alpha(alpha: float) -> None:
    if not 0.0 < alpha < 1.0:  # NaN fails too
        raise ValueError(f"alpha is in (0, 1), not {alpha}")


def compare(
    candidate: ReleaseCounts,
    baseline: ReleaseCounts,
    *,
    alpha: float = ALPHA,
    per: Per = "answers",
    owners: Owners | None = None,
    layers: Iterable[Layer] = COMPARED_LAYERS,
    screen: bool = True,
) -> Comparison:
    """The candidate against the baseline: the thumbs-down rate and each of `layers`' rates, each
    by the one-sided Fisher exact test, corrected together by Holm's step-down; with `screen`, a
    test that could not reach `alpha` even alone is left out of the correction (never flagged)."""
    _check_alpha(alpha)
    n1, n2 = candidate.over(per), baseline.over(per)
    tables: list[tuple[Layer | None, int, int]] = [(None, candidate.thumbs_down, baseline.thumbs_down)]
    tables += [
        (layer, candidate.layers.get(layer, 0), baseline.layers.get(layer, 0))
        for layer in dict.fromkeys(layers)
    ]
    p_values = [fisher_greater(a, n1, b, n2) for _, a, b in tables]
    floors = [min_p_value(a, n1, b, n2) for _, a, b in tables]
    family = [i for i, floor in enumerate(floors) if not screen or floor <= alpha]
    adjusted: dict[int, float] = dict(zip(family, holm([p_values[i] for i in family]), strict=True))
    tests = [
        RateTest(
            layer=layer,
            candidate=rate(a, n1),
            baseline=rate(b, n2),
            p_value=p_values[i],
            min_p_value=floors[i],
            p_adjusted=adjusted.get(i),
            higher=i in adjusted and adjusted[i] <= alpha,
            owners=[] if layer is None else _owners_of(owners, layer),
        )
        for i, (layer, a, b) in enumerate(tables)
    ]
    new = [s for s, _ in _most_first(candidate.signatures) if baseline.signatures.get(s, 0) == 0]
    return Comparison(
        candidate=candidate.release,
        baseline=baseline.release,
        per=per,
        alpha=alpha,
        tests=tests,
        new_signatures=new,
    )


class ReleaseWatch(ReleaseRecord):
    """Every release of a window, by first seen, and each against the one before it."""

    per: Per
    alpha: float
    releases: list[ReleaseStats]
    comparisons: list[Comparison]  # one per release but the first, in the same order

    @computed_field  # type: ignore[prop-decorator]
    @property
    def flagged(self) -> list[str]:
        """The releases worse than the one before them beyond chance."""
        return [c.candidate for c in self.comparisons if c.worse]

    def comparison_of(self, release: str) -> Comparison | None:
        """The release against the one before it (None: the first, or not in the window)."""
        return next((c for c in self.comparisons if c.candidate == release), None)


def watch(
    releases: Iterable[ReleaseCounts],
    *,
    alpha: float = ALPHA,
    resolution: timedelta = timedelta(0),
    **options: Unpack[CompareOptions],
) -> ReleaseWatch:
    """Each release's figures, and each release against the previous one (by first seen at
    `resolution`, the source's `ReleaseAnswers.resolution`; then in version order, `in_order`).
    The false-alarm rate is held at `alpha` per pair, not over the window's pairs."""
    _check_alpha(alpha)
    ordered = in_order(releases, resolution)
    per = options.get("per", "answers")
    # read once: `layers` may be an iterator, and every pair compares them
    options["layers"] = tuple(dict.fromkeys(options.get("layers", COMPARED_LAYERS)))
    return ReleaseWatch(
        per=per,
        alpha=alpha,
        releases=[release_stats(r, per) for r in ordered],
        comparisons=[
            compare(current, previous, alpha=alpha, **options) for previous, current in pairwise(ordered)
        ],
    )


class Gate(ReleaseRecord):
    """`triage releases --candidate R --baseline R0`: the two releases' figures and their comparison."""

    candidate: ReleaseStats
    baseline: ReleaseStats
    comparison: Comparison

    @computed_field  # type: ignore[prop-decorator]
    @property
    def worse(self) -> bool:
        """The candidate is worse than the baseline beyond chance: the gate fails."""
        return self.comparison.worse


def gate(
    candidate: ReleaseCounts, baseline: ReleaseCounts, alpha: float = ALPHA, **options: Unpack[CompareOptions]
) -> Gate:
    """The release gate: the candidate against the named baseline, whichever was seen first."""
    if candidate.release == baseline.release:
        raise ValueError(f"the candidate and the baseline are the same release ({candidate.release!r})")
    per = options.get("per", "answers")
    return Gate(
        candidate=release_stats(candidate, per),
        baseline=release_stats(baseline, per),
        comparison=compare(candidate, baseline, alpha=alpha, **options),
    )


# -- what a source reads, and the window a command or the report shows -------------------------


class ReleaseWindow(ReleaseRecord):
    """`triage releases` and the report's Releases section: the window, how its answers were
    counted, every release's figures and comparisons (`watch`), the gate when one was asked."""

    start: datetime
    end: datetime
    counted_by: str
    unreleased: int  # answers that carry no release
    watch: ReleaseWatch
    gate: Gate | None = None
    #: what was read but not counted, and why (votes on answers from before the window, ...)
    notes: list[str] = Field(default_factory=list)
    #: the failure signatures whose life touches the window's releases: first seen in one, fixed in
    #: one by a check run, or regressed in one (`domain.tracker.SignatureState`)
    signatures: list[SignatureState] = Field(default_factory=list)

    @property
    def exit_code(self) -> ExitCode:
        """`triage releases`'s: REGRESSED (7) when the gate was asked and failed (`Gate.worse`), else
        OK. A release the watch flagged without a gate is shown, not an exit code."""
        return ExitCode.REGRESSED if self.gate is not None and self.gate.worse else ExitCode.OK
