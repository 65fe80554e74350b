"""Statistics: intervals and tests the release watch and calibration share.

Pure maths (no I/O, no records): the release watch (`triage.domain.releases`) rates thumbs-down with
Wilson intervals and compares releases with Fisher's exact test under Holm's correction;
calibration (`triage.calibration.calibrate`) measures agreement with Cohen's kappa and its interval.
Computed here rather than with a statistics package so the job needs no numpy or scipy; the tests
check them against scipy, statsmodels and scikit-learn.

- `wilson`: the Wilson score interval of a proportion. Unlike the normal approximation's it stays
  inside [0, 1] and keeps its coverage at small counts and rates near 0.
- `fisher_greater`: the one-sided Fisher exact test on a 2x2 table, exact at any count and
  conservative. Its tail is summed from the hypergeometric probabilities, in logs (`math.lgamma`)
  for the first term and by the exact ratio of neighbours for the others, so a million trials cost
  no more than a hundred. `min_p_value`: the smallest p-value a table's margins allow (what
  Tarone's screen reads).
- `holm`: Holm's step-down adjusted p-values (family-wise error at most alpha, whatever the
  dependence between the tests).
- `cohen_kappa`: Cohen's kappa from a square table of counts, with its 95% interval from kappa's
  asymptotic standard error in the non-null case (Fleiss, Cohen and Everitt 1969; the `var_kappa`
  of statsmodels' `cohens_kappa`), clamped to [-1, 1].
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: the 97.5% quantile of the standard normal distribution: a two-sided 95% interval
Z95 = 1.959963984540054


def wilson(count: int, total: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of `count` successes in `total` trials (95% by default)."""
    if total <= 0:
        raise ValueError(f"an interval needs at least one trial, not {total}")
    if not 0 <= count <= total:
        raise ValueError(f"{count} successes out of {total} trials")
    p = count / total
    z2 = z * z
    scale = 1 + z2 / total
    centre = (p + z2 / (2 * total)) / scale
    half = z / scale * math.sqrt(p * (1 - p) / total + z2 / (4 * total * total))
    low = 0.0 if count == 0 else max(0.0, centre - half)
    high = 1.0 if count == total else min(1.0, centre + half)
    return low, high


def _margins(a: int, n1: int, b: int, n2: int) -> tuple[int, int, int, int]:
    """The table's failures `k` and answers `n`, and the lowest and highest count its first row
    can hold given those margins."""
    if not (0 <= a <= n1 and 0 <= b <= n2):
        raise ValueError(f"not a 2x2 table: {a} of {n1} against {b} of {n2}")
    k, n = a + b, n1 + n2
    return k, n, max(0, n1 - (n - k)), min(k, n1)


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def _pmf(x: int, n1: int, k: int, n: int) -> float:
    """P(X = x), X hypergeometric: `n1` drawn from `n`, of which `k` are marked."""
    if not max(0, n1 - (n - k)) <= x <= min(k, n1):
        return 0.0
    return math.exp(_log_comb(k, x) + _log_comb(n - k, n1 - x) - _log_comb(n, n1))


def fisher_greater(a: int, n1: int, b: int, n2: int) -> float:
    """One-sided Fisher exact test that the first rate (`a` of `n1`) is higher than the second
    (`b` of `n2`): P(X >= a), X hypergeometric given the margins (`a + b` failures, `n1` and `n2`).

    The tail is summed away from the distribution's mode, where its terms only shrink (and the sum
    stops when they no longer count); a tail that holds the mode is one minus the other tail."""
    k, n, low, high = _margins(a, n1, b, n2)
    if a <= low:
        return 1.0
    mode = (n1 + 1) * (k + 1) // (n + 2)
    if a > mode:  # the upper tail, from a up
        term = total = _pmf(a, n1, k, n)
        for x in range(a, high):
            term *= (k - x) * (n1 - x) / ((x + 1) * (n - k - n1 + x + 1))
            total += term
            if term <= total * 1e-17:
                break
        return min(1.0, total)
    # the lower tail, from a - 1 down: P(X >= a) = 1 - P(X <= a - 1)
    term = total = _pmf(a - 1, n1, k, n)
    for x in range(a - 1, low, -1):
        term *= x * (n - k - n1 + x) / ((k - x + 1) * (n1 - x + 1))
        total += term
        if term <= total * 1e-17:
            break
    return max(0.0, 1.0 - total)


def min_p_value(a: int, n1: int, b: int, n2: int) -> float:
    """The smallest one-sided p-value `fisher_greater` can give a table with these margins (`n1`,
    `n2` and `a + b` failures): all the failures it can hold in the first row."""
    k, n, low, high = _margins(a, n1, b, n2)
    return 1.0 if high <= low else _pmf(high, n1, k, n)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: the i-th smallest p times
    (m - i + 1), never below the one before it, at most 1. Reject where the adjusted p <= alpha."""
    for p in p_values:
        if not 0.0 <= p <= 1.0:  # NaN fails too
            raise ValueError(f"a p-value is in [0, 1], not {p}")
    m = len(p_values)
    adjusted = [1.0] * m
    running = 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda j: p_values[j])):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def cohen_kappa(table: Sequence[Sequence[int]], z: float = Z95) -> tuple[float | None, float | None, float | None]:
    """Cohen's kappa and its interval (95% by default) from a square table of counts (rows: the first
    rater, columns: the second); (None, None, None) where undefined."""
    n = sum(sum(row) for row in table)
    k = len(table)
    if n == 0:
        return None, None, None
    p = [[table[i][j] / n for j in range(k)] for i in range(k)]
    rows = [sum(p[i]) for i in range(k)]
    cols = [sum(p[i][j] for i in range(k)) for j in range(k)]
    observed = sum(p[i][i] for i in range(k))
    expected = sum(rows[i] * cols[i] for i in range(k))
    if math.isclose(expected, 1.0):
        return None, None, None  # both raters used one and the same class: chance explains it all
    kappa = (observed - expected) / (1 - expected)
    a = sum(p[i][i] * (1 - (rows[i] + cols[i]) * (1 - kappa)) ** 2 for i in range(k))
    b = (1 - kappa) ** 2 * sum(p[i][j] * (cols[i] + rows[j]) ** 2 for i in range(k) for j in range(k) if i != j)
    c = (kappa - expected * (1 - kappa)) ** 2
    variance = max((a + b - c) / ((1 - expected) ** 2 * n), 0.0)
    half = z * math.sqrt(variance)
    return kappa, max(-1.0, kappa - half), min(1.0, kappa + half)
