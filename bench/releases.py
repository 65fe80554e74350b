"""The release watch on a seeded simulation: is a real rise flagged, and how often is a release
flagged when nothing changed (`triage.domain.releases`).

    python bench/releases.py                               # the figures below, a few seconds
    python bench/releases.py --seed 7 --power-seeds 2000 --long-run 10000
    python bench/releases.py --answers-per-release 400-1500 --vote-rate 0.3 --rise-to 0.08

Each night has two releases; the second is compared with the first, as `triage releases` does
(`watch`), at `--alpha`. Every answer, independently:

- is voted on with probability `--vote-rate` (0.3), whatever its outcome;
- has a true outcome: a failure of one layer with that layer's rate (`BASE_RATES`: retrieval 3% of
  answers, generation 4%, tool routing 1.5%, skipped retrieval 1%, content gap 2% declined and 1%
  invented), else fine;
- voted, gets a thumbs-down with probability `--down-if-failed` (0.8) after a failure,
  `--down-if-fine` (0.1) after a fine answer;
- a thumbs-down is triaged with probability `--triaged` (0.95), to its true layer with probability
  `--judge-accuracy` (0.85; a fine answer's to `ok`), else to another layer at random.

Each release's answers are drawn uniformly from `--answers-per-release` (400-1500).

(a) The rise: the second release's retrieval failures go from `--base` (3%) to `--rise-to` (8% of
answers); the others stay. The night of `--seed` is shown test by test, then the power (the share
of `--power-seeds` nights where the rise is flagged) at fixed volumes and over the range, with two
alternatives the module offers: rates per vote (`per="votes"`) and Holm over every test (no screen).

(b) No rise: `--nights` nights (100) where both releases have the same true rates; a release
flagged is a false alarm. The family-wise rate must be at most about `--alpha`; `--long-run`
nights (2000) estimate it more tightly (0 skips them).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from triage.domain.records import AGENT_LAYERS, Layer  # noqa: E402
from triage.domain.releases import (  # noqa: E402
    ALPHA,
    COMPARED_LAYERS,
    Comparison,
    ReleaseCounts,
    compare,
    rate,
    watch,
)

#: the true failure rates per answer (the rest is fine)
BASE_RATES: dict[Layer, float] = {
    Layer.GENERATION: 0.04,
    Layer.RETRIEVAL: 0.03,
    Layer.TOOL_ROUTING: 0.015,
    Layer.AGENT_SKIPPED_RETRIEVAL: 0.01,
    Layer.CONTENT_GAP_HALLUCINATION: 0.01,
    Layer.CONTENT_GAP_HANDLED: 0.02,
}
#: who owns what, as a configuration would say
OWNERS: dict[Layer, list[str]] = {
    **{layer: ["agent-team"] for layer in AGENT_LAYERS},
    Layer.CONTENT_GAP_HALLUCINATION: ["agent-team", "docs-wg"],
    Layer.CONTENT_GAP_HANDLED: ["docs-wg"],
    Layer.OK: ["agent-team"],
}
T0 = datetime(2026, 12, 1, tzinfo=UTC)


@dataclass(frozen=True)
class World:
    """How users vote and how well the night's triage sees the failures."""

    vote_rate: float = 0.3
    down_if_failed: float = 0.8
    down_if_fine: float = 0.1
    triaged: float = 0.95
    judge_accuracy: float = 0.85
    topics: int = 5  # signatures per layer


def release(
    rng: random.Random, name: str, answers: int, rates: Mapping[Layer, float], world: World, first: datetime
) -> ReleaseCounts:
    """One release's counts, answer by answer."""
    thresholds: list[tuple[float, Layer]] = []
    total = 0.0
    for layer, p in rates.items():
        total += p
        thresholds.append((total, layer))
    others = {layer: [o for o in Layer if o is not layer] for layer in Layer}
    votes = down = 0
    layers: Counter[Layer] = Counter()
    signatures: Counter[str] = Counter()
    for _ in range(answers):
        if rng.random() >= world.vote_rate:
            continue
        votes += 1
        u = rng.random()
        true = next((layer for threshold, layer in thresholds if u < threshold), Layer.OK)
        if rng.random() >= (world.down_if_fine if true is Layer.OK else world.down_if_failed):
            continue
        down += 1
        if rng.random() >= world.triaged:
            continue
        seen = (
            true
            if rng.random() < world.judge_accuracy
            else others[true][int(rng.random() * len(others[true]))]
        )
        layers[seen] += 1
        if seen is not Layer.OK:
            signatures[f"{seen}-{int(rng.random() * world.topics)}"] += 1
    return ReleaseCounts(
        release=name,
        first_seen=first,
        last_seen=first + timedelta(days=1),
        answers=answers,
        votes=votes,
        thumbs_down=down,
        layers=dict(layers),
        signatures=dict(signatures),
    )


def night(
    rng: random.Random,
    world: World,
    volumes: tuple[int, int],
    candidate_rates: Mapping[Layer, float],
    baseline_rates: Mapping[Layer, float] = BASE_RATES,
) -> tuple[ReleaseCounts, ReleaseCounts]:
    """The baseline and the candidate (first seen an hour later), each with a volume drawn from
    `volumes` (inclusive)."""
    low, high = volumes
    sizes = [low + int(rng.random() * (high - low + 1)) for _ in range(2)]
    baseline = release(rng, "r1", sizes[0], baseline_rates, world, T0)
    candidate = release(rng, "r2", sizes[1], candidate_rates, world, T0 + timedelta(hours=1))
    return baseline, candidate


@dataclass
class Tally:
    nights: int = 0
    flagged: int = 0  # the candidate flagged, any test
    retrieval: int = 0  # the retrieval layer flagged
    owners_named: int = 0  # retrieval flagged and its owners named
    per_votes: int = 0  # flagged with rates per vote
    per_votes_retrieval: int = 0
    no_screen: int = 0  # flagged with Holm over every test
    no_screen_retrieval: int = 0
    base_failures: int = 0  # retrieval failures counted, baseline
    candidate_failures: int = 0

    def add(self, baseline: ReleaseCounts, candidate: ReleaseCounts, alpha: float) -> Comparison:
        found = watch([candidate, baseline], alpha=alpha, owners=OWNERS)
        (comparison,) = found.comparisons
        votes = compare(candidate, baseline, alpha=alpha, per="votes", owners=OWNERS)
        plain = compare(candidate, baseline, alpha=alpha, owners=OWNERS, screen=False)
        hit = Layer.RETRIEVAL in comparison.flagged_layers
        self.nights += 1
        self.flagged += comparison.worse
        self.retrieval += hit
        self.owners_named += hit and comparison.owners == OWNERS[Layer.RETRIEVAL]
        self.per_votes += votes.worse
        self.per_votes_retrieval += Layer.RETRIEVAL in votes.flagged_layers
        self.no_screen += plain.worse
        self.no_screen_retrieval += Layer.RETRIEVAL in plain.flagged_layers
        self.base_failures += baseline.layers.get(Layer.RETRIEVAL, 0)
        self.candidate_failures += candidate.layers.get(Layer.RETRIEVAL, 0)
        return comparison


def share(count: int, total: int, digits: int = 2) -> str:
    return f"{count / total:.{digits}f}" if total else "-"


def interval(count: int, total: int) -> str:
    r = rate(count, total)
    return f"{r.low:.3f}-{r.high:.3f}" if r.low is not None and r.high is not None else "-"


def volumes_of(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    pair = (int(low), int(high or low))
    if not 0 < pair[0] <= pair[1]:
        raise argparse.ArgumentTypeError(f"not a volume or a range of volumes: {text}")
    return pair


def label(volumes: tuple[int, int]) -> str:
    return str(volumes[0]) if volumes[0] == volumes[1] else f"{volumes[0]}-{volumes[1]}"


def show_night(seed: int, comparison: Comparison, baseline: ReleaseCounts, candidate: ReleaseCounts) -> None:
    print(
        f"The night of seed {seed}: `{candidate.release}` ({candidate.answers} answers, {candidate.votes} votes) "
        f"against "
        f"`{baseline.release}` ({baseline.answers} answers, {baseline.votes} votes); "
        f"flagged: **{'yes' if comparison.worse else 'no'}**, layers {[str(x) for x in comparison.flagged_layers]}, "
        f"owners {comparison.owners}, family of {comparison.family_size} tests.\n"
    )
    print("| rate per answer | candidate | baseline | p (Fisher, one-sided) | p (Holm) | flagged |")
    print("| --- | ---: | ---: | ---: | ---: | :---: |")
    for t in comparison.tests:
        adjusted = "screened out" if t.p_adjusted is None else f"{t.p_adjusted:.4f}"
        print(
            f"| {t.layer or 'thumbs-down'} | {t.candidate.count}/{t.candidate.total} | {t.baseline.count}/"
            f"{t.baseline.total} | {t.p_value:.4f} | {adjusted} | {'yes' if t.higher else ''} |"
        )
    print()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--nights", type=int, default=100, help="no-rise nights counted for false alarms")
    parser.add_argument("--long-run", type=int, default=2000, help="more no-rise nights, for a tighter rate")
    parser.add_argument("--power-seeds", type=int, default=500, help="nights with the rise, per volume")
    parser.add_argument("--answers-per-release", type=volumes_of, default=(400, 1500), help="N or LOW-HIGH")
    parser.add_argument(
        "--power-volumes", default="400,1000,1500,5000", help="fixed volumes for the power table"
    )
    parser.add_argument("--vote-rate", type=float, default=World.vote_rate)
    parser.add_argument("--down-if-failed", type=float, default=World.down_if_failed)
    parser.add_argument("--down-if-fine", type=float, default=World.down_if_fine)
    parser.add_argument("--triaged", type=float, default=World.triaged)
    parser.add_argument("--judge-accuracy", type=float, default=World.judge_accuracy)
    parser.add_argument("--base", type=float, default=BASE_RATES[Layer.RETRIEVAL], help="retrieval, before")
    parser.add_argument("--rise-to", type=float, default=0.08, help="retrieval failures per answer, after")
    parser.add_argument("--alpha", type=float, default=ALPHA)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    world = World(
        vote_rate=args.vote_rate,
        down_if_failed=args.down_if_failed,
        down_if_fine=args.down_if_fine,
        triaged=args.triaged,
        judge_accuracy=args.judge_accuracy,
    )
    before = {**BASE_RATES, Layer.RETRIEVAL: args.base}
    after = {**BASE_RATES, Layer.RETRIEVAL: args.rise_to}
    volumes: tuple[int, int] = args.answers_per_release

    print("## Release watch: simulation\n")
    print(
        f"Seed {args.seed}; alpha {args.alpha}; answers per release {label(volumes)}; vote rate {world.vote_rate}; "
        f"thumbs-down after a failure {world.down_if_failed}, after a fine answer {world.down_if_fine}; "
        f"triaged {world.triaged}, judge accuracy {world.judge_accuracy}; compared layers: {len(COMPARED_LAYERS)} "
        "and the thumbs-down rate.\n"
    )

    print(f"### (a) Retrieval failures rise from {args.base:.0%} to {args.rise_to:.0%} of answers\n")
    baseline, candidate = night(random.Random(args.seed), world, volumes, after, before)
    example = Tally().add(baseline, candidate, args.alpha)
    show_night(args.seed, example, baseline, candidate)

    rows = [volumes_of(v) for v in args.power_volumes.split(",") if v.strip()] + [volumes]
    print(
        "| answers per release | nights | retrieval failures counted (mean, before -> after) | "
        "flagged | retrieval flagged, owners named | per vote: flagged | no screen: flagged |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for k, row in enumerate(rows):
        rng = random.Random(args.seed * 1_000 + 100 + k)
        tally = Tally()
        for _ in range(args.power_seeds):
            tally.add(*night(rng, world, row, after, before), args.alpha)
        n = tally.nights
        print(
            f"| {label(row)} | {n} | {tally.base_failures / n:.1f} -> {tally.candidate_failures / n:.1f} | "
            f"{share(tally.flagged, n)} | {share(tally.owners_named, n)} | {share(tally.per_votes, n)} | "
            f"{share(tally.no_screen, n)} |"
        )

    print("\n### (b) No rise: the same true rates for both releases\n")
    print(
        "| nights | releases flagged (false alarms) | rate | Wilson 95% | per vote: flagged | no screen: flagged |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for k, nights in enumerate(n for n in (args.nights, args.long_run) if n > 0):
        rng = random.Random(args.seed * 1_000 + 900 + k)
        tally = Tally()
        for _ in range(nights):
            tally.add(*night(rng, world, volumes, before, before), args.alpha)
        print(
            f"| {nights} | {tally.flagged} | {share(tally.flagged, nights, 3)} | {interval(tally.flagged, nights)} | "
            f"{tally.per_votes} | {tally.no_screen} |"
        )
    print(f"\nalpha = {args.alpha}: the false-alarm rate per release pair must be at most about that.")
    print(f"Ran in {time.perf_counter() - started:.1f} s.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
