"""The labelled Kubeflow thumbs-down set (evals/kubeflow): it verifies against the shared corpus, its
counts meet the minimums, and the verifier catches a broken case."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import REPO
from triage.domain.records import Layer

VERIFY = REPO / "evals" / "kubeflow" / "verify.py"


def _load_verifier() -> ModuleType:
    """evals/ is not a package: load verify.py from its path."""
    spec = importlib.util.spec_from_file_location("evals_kubeflow_verify", VERIFY)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    # registered before it runs: dataclasses look their module up while the class is built
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


ev = _load_verifier()


def _first(cases: list[dict[str, Any]], layer: str, with_results: bool = True) -> dict[str, Any]:
    for case in cases:
        if case["layer"] == layer and (not with_results or any("results" in c for c in case["tool_calls"])):
            return copy.deepcopy(case)
    raise AssertionError(f"no {layer} case to break")


def _failures_of(case: dict[str, Any], corpus: Path) -> list[str]:
    report = ev.verify([case], ev.Corpus.load(corpus, ev.ISSUES_DIR))
    return [f for f in report.failures if f.startswith(f"{case['id']}:")]


@pytest.mark.corpus
def test_the_set_verifies_and_meets_the_minimums(corpus: Path) -> None:
    report = ev.verify(ev.load_cases(), ev.Corpus.load(corpus, ev.ISSUES_DIR))
    assert report.failures == []
    counts = report.counts()
    assert counts["cases"] >= 72
    for layer in Layer:
        assert counts["layers"].get(layer.value, 0) >= 8, layer
        assert set(counts["splits"][layer.value]) == {"dev", "test"}, layer
    assert counts["adversarial"] >= 12
    assert counts["near_miss"] >= 10
    assert counts["disputed"], "the disputed cases are listed"


@pytest.mark.corpus
def test_a_layer_that_disagrees_with_the_facts_is_caught(corpus: Path) -> None:
    case = _first(ev.load_cases(), "ok")
    case["layer"] = "generation"
    failures = _failures_of(case, corpus)
    assert any("layer 'generation' disagrees with the facts, which decide 'ok'" in f for f in failures), failures


@pytest.mark.corpus
def test_a_line_range_past_the_end_of_the_file_is_caught(corpus: Path) -> None:
    case = _first(ev.load_cases(), "retrieval")
    call = next(c for c in case["tool_calls"] if "results" in c)
    call["results"][0]["lines"] = [1, 100_000]
    path = call["results"][0]["path"]
    failures = _failures_of(case, corpus)
    assert any(path in f and "lines 1-100000 do not exist" in f for f in failures), failures


@pytest.mark.corpus
def test_a_needs_string_absent_from_the_retrieved_passages_is_caught(corpus: Path) -> None:
    case = _first(ev.load_cases(), "ok")
    case["needs"].append("a string that no retrieved passage holds")
    failures = _failures_of(case, corpus)
    assert any("retrieved_has_answer is True, but the retrieved passages say otherwise" in f for f in failures)


@pytest.mark.corpus
def test_searched_collections_must_match_the_tool_log(corpus: Path) -> None:
    case = _first(ev.load_cases(), "tool_routing")
    case["facts"]["agent_searched_collections"] = ["docs", "issues"]
    failures = _failures_of(case, corpus)
    assert any("agent_searched_collections" in f for f in failures), failures


@pytest.mark.corpus
def test_the_command_line_exits_1_on_a_broken_set(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    case = _first(ev.load_cases(), "generation")
    case["facts"]["answer_grounded"] = True
    case["facts"]["answer_declined"] = False  # now the rule says ok
    broken = tmp_path / "cases.jsonl"
    broken.write_text(json.dumps(case) + "\n", encoding="utf-8")
    assert ev.main(["--corpus", str(corpus), "--cases", str(broken)]) == 1
    assert "disagrees with the facts" in capsys.readouterr().err


def test_the_command_line_skips_without_the_corpus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert ev.main(["--corpus", str(tmp_path / "no-corpus")]) == 0
    assert capsys.readouterr().out.startswith("skipped: the corpus is not at")


# The set through the real CLI (replay at 100%, the heuristic measured): tests/calibration/test_eval.py and
# tests/judges/test_ceiling.py, through `triage eval`.
