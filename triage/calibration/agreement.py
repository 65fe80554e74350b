"""Agreement between two raters: raw agreement, Cohen's kappa with its 95% interval, per-class scores.

Computed here rather than with a statistics package so the job needs no numpy or scipy; the
tests check every figure against scikit-learn and statsmodels on labelled fixtures.

The interval uses kappa's asymptotic standard error in the non-null case (Fleiss, Cohen and
Everitt 1969; the `var_kappa` of statsmodels' `cohens_kappa`), clamped to [-1, 1].
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

from triage.domain.calibration import Agreement, ClassScores

Z_95 = NormalDist().inv_cdf(0.975)


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def agreement(pairs: Sequence[tuple[str, str]], classes: Sequence[str] = ()) -> Agreement:
    """How far the first rater (people) and the second (the judge) agree on `pairs`.

    `classes` fixes the order of the confusion matrix; classes seen in `pairs` but not listed
    are appended in sorted order.
    """
    seen = {c for pair in pairs for c in pair}
    order = list(dict.fromkeys(classes)) + sorted(seen - set(classes))
    index = {c: i for i, c in enumerate(order)}
    k = len(order)
    table = [[0] * k for _ in range(k)]
    for first, second in pairs:
        table[index[first]][index[second]] += 1
    n = len(pairs)
    agreed = sum(table[i][i] for i in range(k))
    rows = [sum(table[i]) for i in range(k)]
    cols = [sum(table[i][j] for i in range(k)) for j in range(k)]
    per_class = []
    for i, label in enumerate(order):
        precision = _ratio(table[i][i], cols[i])
        recall = _ratio(table[i][i], rows[i])
        f1 = (
            2 * precision * recall / (precision + recall)
            if precision is not None and recall is not None and precision + recall
            else (0.0 if precision is not None and recall is not None else None)
        )
        per_class.append(
            ClassScores(label=label, support=rows[i], predicted=cols[i], precision=precision, recall=recall, f1=f1)
        )
    kappa, low, high = cohen_kappa(table)
    return Agreement(
        n=n,
        agreed=agreed,
        accuracy=_ratio(agreed, n),
        kappa=kappa,
        kappa_low=low,
        kappa_high=high,
        classes=order,
        confusion=table,
        per_class=per_class,
    )


def cohen_kappa(table: Sequence[Sequence[int]], z: float = Z_95) -> tuple[float | None, float | None, float | None]:
    """Kappa and its interval from a square table of counts; (None, None, None) where undefined."""
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
