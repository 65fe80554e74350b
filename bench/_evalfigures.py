"""Figures for bench/evalset.py --figures: re-search recall, the cascade's shortcut precision, and the
offline judge's `high` facts per split (every one must be right: the cascade settles them unasked).

Computed in-process over the same index and traces the CLI runs use (the traces read back from a
store the way the job reads them, the re-search made by the job's own `Researcher`).
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

from triage.domain.ports import JudgeRequest
from triage.domain.records import Facts, Passage, Trace
from triage.judges.cascade import CascadeJudge
from triage.judges.heuristic import HeuristicJudge
from triage.judges.model import prompts
from triage.judges.model.replies import passage_set
from triage.reading.trace import read_trace
from triage.search.index import Index
from triage.search.local import LocalSearcher, Researcher
from triage.settings import load_config
from triage.sources.store import Store

CONTAINMENT_FACTS = ("retrieved_has_answer", "index_has_answer", "answer_collection")
JUDGED_FACTS = ("retrieved_has_answer", "index_has_answer", "answer_grounded", "answer_declined")


def _norm(text: str) -> str:
    return " ".join(text.split()).lower()


def holds_all(needs: list[str], texts: list[str]) -> bool:
    joined = [_norm(t) for t in texts]
    return bool(needs) and all(any(_norm(n) in t for t in joined) for n in needs)


def holds_any(needs: list[str], text: str) -> bool:
    return any(_norm(n) in _norm(text) for n in needs)


def shown_texts(passages: list[Passage], question: str) -> list[str]:
    """The passage texts as the containment prompt shows them (capped, chosen, cleaned)."""
    shown = passage_set("research", "S", passages, prompts.new_nonce(), question)
    return [b.texts[0] for b in shown.blocks.values()]


async def figures(
    cases: list[dict[str, Any]], lines: list[str], config_path: Path, work: Path, shift: timedelta
) -> None:
    config = load_config(config_path)
    index = Index.from_folders(config.index)
    store_path = work / "figures.sqlite"
    with Store(store_path) as db:
        db.import_lines(lines, "evalset", shift=shift)
        observations = db.observations([f"eval-{c['id']}" for c in cases])
    traces: dict[str, Trace] = {}
    for case in cases:
        obs = observations[f"eval-{case['id']}"]
        assert isinstance(obs, list)
        traces[case["id"]] = read_trace(f"eval-{case['id']}", obs, config.tools)
    researcher = Researcher.configured(LocalSearcher(index), config)
    research: dict[str, list[Passage]] = {}
    for case in cases:
        trace = traces[case["id"]]
        if trace.searched:
            research[case["id"]] = await researcher.research(trace, case["comment"] or None)

    # -- re-search recall on the index-has-answer cases the job re-searches
    answerable = [c for c in cases if c["facts"]["index_has_answer"] and c["facts"]["agent_searched"]]
    found = [c for c in answerable if holds_all(c["needs"], [p.text for p in research[c["id"]]])]
    shown = [
        c
        for c in answerable
        if holds_all(c["needs"], shown_texts(research[c["id"]], traces[c["id"]].question))
    ]
    source_in = [
        c for c in answerable if set(c["answer_sources"]) <= {p.source_url for p in research[c["id"]]}
    ]
    sizes = [len(found_) for found_ in research.values()]
    print(
        f"\nre-search (top_k {config.search.top_k}, {researcher.calls} searches): on {len(answerable)} "
        f"index-has-answer cases, every needed string re-searched in {len(found)} "
        f"({len(found) / len(answerable):.2f}), shown to the judge in {len(shown)} "
        f"({len(shown) / len(answerable):.2f}); every answer source among the passages in "
        f"{len(source_in)}; passages per trace {min(sizes)}-{max(sizes)} "
        f"(mean {sum(sizes) / len(sizes):.1f})"
    )
    missed = [case for case in answerable if case not in shown]
    recovered = 0
    for case in missed:
        # what the model judge's own search (`search.judge_queries`) brings where the re-search
        # missed, with the perfect model's queries (the labelled `needs`, the docs' own words); it
        # searches only where the agent's passages lack the answer
        if case["facts"]["retrieved_has_answer"]:
            why = "the agent's passages hold it"
        else:
            more = await researcher.more(case["needs"][:2], research[case["id"]], traces[case["id"]].passages)
            # the follow-up is shown the re-searched passages that held part of the answer again
            carried = [p for p in research[case["id"]] if holds_any(case["needs"], p.text)]
            found_more = holds_all(case["needs"], shown_texts([*carried, *more], traces[case["id"]].question))
            recovered += found_more
            why = "the judge's own search shows it" if found_more else "the judge's own search misses it too"
        print(
            f"  re-search miss: {case['id']} ({case['facts']['answer_collection']}) "
            f"{case['question'][:70]!r}: {why}"
        )
    needed = sum(not c["facts"]["retrieved_has_answer"] for c in missed)
    if missed:
        print(
            f"  after the judge's own search (up to {config.search.judge_queries} queries; the perfect "
            f"model's): shown in {recovered} of the {needed} misses whose agent passages lack the answer"
        )

    # -- the cascade's cheap shortcuts: where each fires, is what it decides the label?
    cheap_judge = HeuristicJudge()
    fired: Counter[str] = Counter()
    right: Counter[str] = Counter()
    wrong: dict[str, list[str]] = {}
    high: Counter[tuple[str, str]] = Counter()  # (split, fact) -> high facts
    high_right: Counter[tuple[str, str]] = Counter()
    high_wrong: list[str] = []
    for case in cases:
        trace = traces[case["id"]]
        truth = case["facts"]
        base = Facts(
            agent_searched=trace.searched, agent_searched_collections=sorted(trace.searched_collections)
        )
        cheap = await cheap_judge.judge(JudgeRequest(trace, research.get(case["id"]), case["comment"] or None, base))
        if trace.searched:
            for name in JUDGED_FACTS:
                held = cheap.evidence.get(name)
                value = getattr(cheap, name)
                if value is None or held is None or held.confidence != "high":
                    continue
                for split in (case["split"], "all"):
                    high[(split, name)] += 1
                    high_right[(split, name)] += value == truth[name]
                if value != truth[name]:
                    high_wrong.append(f"{case['id']} ({case['split']}) {name}")
        # a perfect model's call A returns the labelled containment facts
        model = base.model_copy(update={k: truth[k] for k in CONTAINMENT_FACTS})
        for name, decided in CascadeJudge.settled(trace, cheap, model):
            fired[name] += 1
            ok = all(truth[k] == v for k, v in decided.items())
            right[name] += ok
            if not ok:
                wrong.setdefault(name, []).append(case["id"])
    print("\ncascade shortcuts on the whole set (where the cheap check fires, is what it decides right?):")
    for name in CascadeJudge.SHORTCUTS:
        n = fired[name]
        figure = f"{right[name]}/{n} = {right[name] / n:.2f}" if n else "never fires"
        off = f"; wrong on {', '.join(wrong[name])}" if name in wrong else ""
        print(f"  {name}: {figure}{off}")
    print("\nthe offline judge's `high` facts (searched cases), right of all, per split:")
    for split in ("all", "dev", "test"):
        cells = [f"{name} {high_right[(split, name)]}/{high[(split, name)]}" for name in JUDGED_FACTS]
        print(f"  {split}: " + ", ".join(cells))
    print(f"  wrong: {', '.join(high_wrong) if high_wrong else 'none'}")
