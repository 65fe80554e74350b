"""Counters for `/metrics`, in Prometheus' text format (no client library needed for a handful)."""

from __future__ import annotations

import threading
from collections import Counter

from triage.redact import printable, redact


def _labels(labels: tuple[tuple[str, str], ...]) -> str:
    if not labels:
        return ""
    # label values can come from clients (a monitor-mode score name): never a secret, never a control
    labels = tuple((k, printable(redact(v))) for k, v in labels)
    inner = ",".join(f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"' for k, v in labels)
    return "{" + inner + "}"


class Metrics:
    HELP = {
        "relay_requests_total": ("counter", "HTTP requests by route and status"),
        "relay_outcomes_total": ("counter", "what accepted writes became: stored, queued, direct, refused"),
        "relay_undeclared_scores_total": ("counter", "scores whose name the model does not declare (monitor mode)"),
    }

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, tuple[tuple[str, str], ...]]] = Counter()

    def inc(self, metric: str, amount: int = 1, **labels: str) -> None:
        with self._lock:
            self._counts[(metric, tuple(sorted(labels.items())))] += amount

    def value(self, metric: str, **labels: str) -> int:
        with self._lock:
            return self._counts[(metric, tuple(sorted(labels.items())))]

    def render(self, gauges: dict[str, tuple[str, float]]) -> str:
        lines: list[str] = []
        with self._lock:
            counts = sorted(self._counts.items())
        for name, (kind, text) in self.HELP.items():
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
            lines += [f"{n}{_labels(labels)} {v}" for (n, labels), v in counts if n == name]
        for name, (text, value) in gauges.items():
            kind = "counter" if name.endswith("_total") else "gauge"
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name} {value:g}"]
        return "\n".join(lines) + "\n"
