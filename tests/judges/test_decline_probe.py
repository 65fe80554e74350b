"""The decline probes (evals/declines) are well formed, and bench/declines.py reads them.

The probes' figures are the benchmark's business (bench/README.md); here only their shape: every
line a labelled answer, ids unique, both labels in every split."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBES = sorted((ROOT / "evals" / "declines").glob("*.jsonl"))


@pytest.mark.parametrize("path", PROBES, ids=[p.name for p in PROBES])
def test_a_probe_is_labelled_answers(path: Path) -> None:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert rows
    assert len({r["id"] for r in rows}) == len(rows)
    for r in rows:
        assert set(r) >= {"id", "split", "lang", "declined", "answer"}
        assert isinstance(r["declined"], bool) and r["answer"].strip()
    for split in {r["split"] for r in rows}:
        assert {r["declined"] for r in rows if r["split"] == split} == {True, False}


def test_the_benchmark_reports_every_probe_and_split() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "declines.py")], capture_output=True, text=True, check=True
    ).stdout
    rows = [line for line in out.splitlines() if line.startswith("| ") and ".jsonl" in line]
    expected = {
        (p.name, json.loads(line)["split"])
        for p in PROBES
        for line in p.read_text(encoding="utf-8").splitlines()
        if line.strip()
    }
    assert {(r.split("|")[1].strip(), r.split("|")[2].strip()) for r in rows} == expected


def test_the_probes_stay_read_right() -> None:
    # a regression floor, not the figure: the probes were read while the patterns were written
    # (evals/declines/README.md), so only a drop means something
    from triage.judges.offline.declines import declines

    rows = [json.loads(line) for p in PROBES for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
    right = sum(declines(r["answer"]) == r["declined"] for r in rows)
    assert right / len(rows) >= 0.97
