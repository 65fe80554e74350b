"""Signatures, trends and issue drafts: the pure grouping, two nights through the engine and the
embedded store (the evaluation set, where ../shared/corpus is present), and the drafts."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.calibration.test_evalset import ev
from triage.app import run_setup
from triage.domain.outcome import RunResult
from triage.domain.worklist import (
    SIMILARITY,
    Member,
    Signature,
    assign,
    question_terms,
    signature_id,
    similarity,
    topic_terms,
)
from triage.engine.run import Sources, run_feedback
from triage.engine.stream import RunOptions
from triage.judges.replay import ReplayJudge
from triage.settings import load_config
from triage.sinks.report import render_report, write_issue_drafts
from triage.sources.store import Store

ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)


# -- the grouping ----------------------------------------------------------------------------


def test_question_terms_drop_stopwords_and_meet_across_inflections() -> None:
    assert question_terms("How do I configure the Katib trials?") == question_terms("configuring katib trial")
    assert "how" not in question_terms("How do I?") and question_terms("") == frozenset()
    assert similarity(frozenset({"a"}), frozenset()) == 0.0
    # Dice, not the overlap coefficient: two words inside a long question are not the same failure
    assert similarity(frozenset({"kfp", "yaml"}), frozenset({"kfp", "yaml", "compile", "cli", "flag", "cache"})) < 0.6


def _m(trace: str, question: str, layer: str = "retrieval", component: str = "katib", minute: int = 0) -> Member:
    return Member(trace, layer, component, question, T0 + timedelta(minutes=minute))


def test_similar_questions_of_one_layer_and_component_share_a_signature_in_any_order() -> None:
    members = [
        _m("t1", "How do I set the maximum number of trials in a Katib experiment?", minute=1),
        _m("t2", "Katib experiment: how to set the maximum number of trials?", minute=2),
        _m("t3", "Katib experiment: how to set the maximum number of trials?", layer="generation", minute=3),
        _m("t4", "Katib experiment: how to set the maximum number of trials?", component="pipelines", minute=4),
        _m("t5", "Why does my notebook server not start?", minute=5),
    ]
    first = {t: s.id for t, s in assign(members, []).items()}
    again = {t: s.id for t, s in assign(list(reversed(members)), []).items()}
    assert first == again  # a fixed order (trace start, id), not arrival order
    assert first["t1"] == first["t2"]
    assert len({first["t1"], first["t3"], first["t4"], first["t5"]}) == 4  # another layer or component: another item
    founder = topic_terms("How do I set the maximum number of trials in a Katib experiment?", "katib")
    assert "katib" not in founder  # the component's own name tells nothing within the component
    assert first["t1"] == signature_id("retrieval", "katib", founder)  # made from the founder's content


def test_a_known_signature_keeps_its_id_and_its_members() -> None:
    known = Signature(
        id="sig-known", layer="retrieval", component="katib",
        terms=question_terms("maximum number of trials katib experiment"), title="old",
        nights={1: {"old-trace"}},
    )  # fmt: skip
    chosen = assign([_m("new", "How many trials at most can a Katib experiment run? maximum number")], [known])
    assert chosen["new"].id == "sig-known" and chosen["new"].status == "recurring"
    assert chosen["new"].count == 2


def test_statuses_follow_the_nights() -> None:
    def sig(*nights: int) -> Signature:
        members = {n: {f"t{n}"} for n in nights}
        return Signature(id="s", layer="ok", component="c", terms=frozenset(), title="", nights=members)

    assert sig(0).status == "new"
    assert sig(0, 1).status == "recurring"
    assert sig(0, 3).status == "regressed"
    assert sig(2, 5).status == "resolved"


# -- two nights of the evaluation set ----------------------------------------------------------


def _night(
    store: Store, cases: list[dict[str, Any]], corpus: Any, verify: Any, now: datetime, facts: Path
) -> RunResult:
    lines = [json.dumps(verify.trace_record(case, corpus, n)) for n, case in enumerate(cases)]
    newest = verify.BASE_TIME + timedelta(minutes=20 * len(cases))
    store.import_lines(lines, f"night-{now:%d}", shift=(now - timedelta(hours=1)) - newest)
    facts.write_text("".join(json.dumps({"trace_id": f"eval-{c['id']}", **c["facts"]}) + "\n" for c in cases))
    config = load_config()
    return asyncio.run(
        run_feedback(
            sources=Sources.of(store),
            judge=ReplayJudge(facts, collections=config.collections),
            config=config,
            options=RunOptions(now=now, write=True, progress_seconds=60.0),
            setup=run_setup(RunOptions(now=now, write=True, progress_seconds=60.0), config),
        )
    )


@pytest.mark.slow
def test_two_nights_keep_signature_ids_and_tell_new_recurring_and_resolved(tmp_path: Path) -> None:
    verify = ev
    if not (verify.DEFAULT_CORPUS / "kubeflow-docs" / "INDEX.jsonl").is_file():
        pytest.skip(f"the shared corpus is not here ({verify.DEFAULT_CORPUS}); it ships beside the project's checkout")
    corpus = verify.Corpus.load(verify.DEFAULT_CORPUS)
    cases = verify.load_cases()
    paraphrases = [json.loads(line) for line in (ROOT / "evals/kubeflow/paraphrases.jsonl").read_text().splitlines()]
    night1 = [c for c in cases if int(c["id"][3:]) <= 60]
    by_id = {c["id"]: c for c in cases}
    repeated = [{**by_id[p["id"]], "id": f"{p['id']}-again", "question": p["question"]} for p in paraphrases]
    # a night's traces are 20 minutes apart and must fit the 24-hour window: 16 repeats and 34 fresh
    fresh = [c for c in cases if 60 < int(c["id"][3:]) <= 94]
    now2 = datetime.now(UTC).replace(microsecond=0)
    now1 = now2 - timedelta(hours=24)
    with Store(tmp_path / "store.sqlite") as store:
        first = _night(store, night1, corpus, verify, now1, tmp_path / "n1.jsonl")
        assert first.worklist is not None and first.signatures_written == len(night1)
        ids1 = {e.trace_id: e.signature for e in first.entries}
        assert len(set(ids1.values())) == len(night1)  # the set has no duplicates: one signature each

        second = _night(store, repeated + fresh, corpus, verify, now2, tmp_path / "n2.jsonl")
        worklist = second.worklist
        assert worklist is not None
        ids2 = {e.trace_id: e.signature for e in second.entries}
        status = {sig.id: sig.status for sig in worklist.signatures}
        for p in paraphrases:
            sig = ids2[f"eval-{p['id']}-again"]
            assert sig == ids1[f"eval-{p['id']}"], p["id"]  # the same failure, in other words, keeps its id
            assert status[sig] == "recurring"
        assert all(status[ids2[f"eval-{c['id']}"]] == "new" for c in fresh)
        resolved = {sig.id for sig in worklist.resolved}
        again = {ids2[f"eval-{p['id']}-again"] for p in paraphrases}
        assert resolved == {ids1[f"eval-{c['id']}"] for c in night1} - again
        assert [night.total for night in worklist.nights[:2]] == [len(repeated) + len(fresh), len(night1)]
        assert worklist.status_counts() == {
            "new": len(fresh), "recurring": len(paraphrases), "regressed": 0, "resolved": len(night1) - len(paraphrases)
        }  # fmt: skip

        # a rerun of the same night changes no id and writes the same signature scores again
        rerun = asyncio.run(
            run_feedback(
                sources=Sources.of(store),
                judge=ReplayJudge(tmp_path / "n2.jsonl"),
                config=load_config(),
                options=RunOptions(now=now2, write=True, force=True, progress_seconds=60.0),
                setup=run_setup(RunOptions(now=now2, write=True, force=True, progress_seconds=60.0), load_config()),
            )
        )
        assert {e.trace_id: e.signature for e in rerun.entries} == ids2
        assert len(store.scores_named("triage_signature")) == len(night1) + len(repeated) + len(fresh)

    report = render_report(second)
    assert "## Trend: tonight and the 7 nights before" in report and "## Resolved (" in report
    drafts = write_issue_drafts(second, tmp_path / "issues", min_size=2)
    names = sorted(p.name for p in drafts)
    assert any(n.startswith("owner-kubeflow-") for n in names)
    assert sum(n.startswith("signature-sig-") for n in names) == len(paraphrases)  # two members each


def test_assign_through_the_word_index_equals_comparing_every_pair() -> None:
    """The word index only skips signatures sharing no word (similarity 0): the signatures chosen
    are those of the plain all-pairs comparison (a threshold of 0 takes that path), on a night of
    overlapping questions across two pools."""
    import random

    rng = random.Random(7)
    vocabulary = [f"word{i}" for i in range(40)]
    members = [
        Member(
            trace_id=f"t{i:03d}",
            layer=rng.choice(["retrieval", "generation"]),
            component="katib",
            question=" ".join(rng.sample(vocabulary, rng.randint(2, 6))),
            start=datetime(2026, 12, 1, tzinfo=UTC) + timedelta(minutes=i),
        )
        for i in range(300)
    ]

    def chosen(threshold: float, brute: bool) -> dict[str, str]:
        if brute:
            # every pair, the definition: a member joins the most similar signature of its pool
            picked: dict[str, str] = {}
            pools: dict[str, list[tuple[str, frozenset[str]]]] = {}
            for m in sorted(members, key=lambda m: (m.start, m.trace_id)):
                pool = pools.setdefault(m.layer, [])
                scored = [(similarity(m.terms, terms), sid) for sid, terms in pool]
                best = max((s for s in scored if s[0] >= threshold), default=None)
                if best is None:
                    sig = assign([m], [])[m.trace_id]  # the founder's id and terms, as assign makes them
                    pool.append((sig.id, sig.terms))
                    picked[m.trace_id] = sig.id
                else:
                    picked[m.trace_id] = best[1]
            return picked
        return {t: s.id for t, s in assign(members, [], threshold).items()}

    fast = chosen(SIMILARITY, brute=False)
    assert fast == chosen(SIMILARITY, brute=True)
    assert 20 < len(set(fast.values())) < 300  # groups formed, and not one big one
