"""The check judges (`triage.judges.expectations`) against the labelled check set (evals/check).

    python bench/checkeval.py                                # offline and llm-perfect, dev and test
    python bench/checkeval.py --split dev --judge offline    # one judge, one split
    python bench/checkeval.py --split test --figures         # also: by expectation and confidence
    python bench/checkeval.py --judge llm                    # a real model: TRIAGE_JUDGE_MODEL,
                                                             # OPENAI_BASE_URL, OPENAI_API_KEY

Each pair of `evals/check/pairs.jsonl` is a regression case (read by `CheckCase.from_item`, as
`triage check` reads a dataset item) and a new run (`AgentRun`: the answer, its sources, its tool
calls, its retrieved passages with their text loaded from `../shared/corpus` at run time: the set
holds corpus paths and line ranges, never the text). The judge decides every expectation the case
carries; the case's outcome (`CaseResult.outcome_of`: pass, fail, or undecided when one expectation
is undecided) is compared with the human label.

Figures, per judge and split, in `triage eval`'s style: accuracy over every case (an undecided case
counts as a miss), Cohen's kappa with its 95% interval (undecided as a third answer the labels never
give), coverage (the share decided), and the accuracy and kappa of the decided part; per kind
(the expectation that decides the label), accuracy and coverage. Then, for the split shown in
detail, each judge's wrong decisions and its undecided cases (what a person would review).

Judges: `offline` (no model); `llm-perfect`, the LLM judge through the real `openai` client
against the *perfect check model* (tests/doubles/perfect_model.py `PerfectCheckModel`, a local
OpenAI-compatible server that answers each expectation asked from the pair's label, using only what
the prompt shows), which measures the judge's plumbing (prompt, schema, verification, the
expectations code decides) and not a model; `llm`, a real model from the environment.

The perfect check model answers per expectation from a label given per case: in a `mixed` pair
labelled fail it fails every expectation it is asked about, so its figure is exact per case, not a
per-expectation measure.

Measured (2 cores, a few seconds; the offline rules tuned on `dev` only, `test` run once after):

| judge | split | accuracy | kappa (95%) | coverage | decided accuracy |
|---|---|---:|---|---:|---:|
| `offline` | dev | 0.80 | 0.67 (0.49 to 0.84) | 0.80 | 1.00 (32/32) |
| `offline` | test | 0.57 | 0.38 (0.22 to 0.55) | 0.62 | 0.92 (23/25) |
| `llm-perfect` | dev | 1.00 | 1.00 | 1.00 | 1.00 |
| `llm-perfect` | test | 1.00 | 1.00 | 1.00 | 1.00 |

Tuned on dev: a claim's quoted value counts only as code (`bayesian` the value, not Bayesian the
method), a claim is read in prose only (not fenced code), half of its words with every anchor
states it again, a placeholder value (`author=...`) swaps nothing, a correction with every value
present is left undecided (the share of a sentence's words the correction and the passages hold
did not separate an added caveat from a paraphrase), a single unseen specific after a decline is
left undecided. The two test errors: a claim's subject restated with another value (chk-031:
"the default APP_PREFIX is `/models`" against the claim "the default APP_PREFIX of the models web
app is /kserve", whose unquoted `/kserve` is no anchor; the same class hides in dev's chk-060, a
case failed for its other claim), and a decline followed by an invented UI menu in bold prose
(chk-075: "Export → CSV", no specific for strings to catch).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from triage.calibration.calibrate import agreement  # noqa: E402
from triage.domain.checks import AgentRun, CaseResult, CheckCase, CheckJudge, ExpectationCheck, ToolUse  # noqa: E402
from triage.domain.records import Passage  # noqa: E402
from triage.domain.review import Agreement  # noqa: E402
from triage.domain.worklist import DatasetItem  # noqa: E402

EVALS = ROOT / "evals" / "check"
JUDGES = ("offline", "llm-perfect", "llm")
KINDS = ("correction", "must_cite", "must_not_claim", "decline", "tool_behavior", "mixed")
OUTCOMES = ("pass", "fail", "undecided")
MODEL = "perfect-check-model"


def verifier() -> ModuleType:
    """evals/check/verify.py, imported (the corpus reader and the pairs loader)."""
    spec = importlib.util.spec_from_file_location("check_verify", EVALS / "verify.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_verify"] = module
    spec.loader.exec_module(module)
    return module


def default_corpus() -> Path:
    return Path(verifier().DEFAULT_CORPUS)


def corpus_present(root: Path) -> bool:
    return (root / "kubeflow-docs" / "INDEX.jsonl").is_file()


@dataclass
class Pair:
    id: str
    split: str
    kind: str
    label: str
    case: CheckCase
    run: AgentRun
    raw: dict[str, Any]


def load_pairs(split: str = "all", corpus: Path | None = None, file: Path | None = None) -> list[Pair]:
    """The set's pairs of `split` (dev, test or all), each as the case and the run a judge reads,
    the retrieved passages' text read from the corpus."""
    verify = verifier()
    root = corpus or Path(verify.DEFAULT_CORPUS)
    if not corpus_present(root):
        raise FileNotFoundError(f"the corpus is not at {root}")
    reader = verify.Corpus.load(root)
    raw_pairs, broken = verify.load_pairs(file or verify.PAIRS_FILE)
    if broken:
        raise ValueError(f"broken lines in the check set: {broken[:3]}")
    out = []
    for raw in raw_pairs:
        if split != "all" and raw["split"] != split:
            continue
        item = DatasetItem(
            id=raw["id"],
            dataset_name="check-eval",
            input=raw["case"]["input"],
            expected_output=raw["case"]["expected_output"],
            metadata=raw["case"]["metadata"],
        )
        new = raw["new_run"]
        passages = []
        for n, ref in enumerate(new["retrieved"], start=1):
            folder = verify.COLLECTION_DIRS.get(ref["collection"], ref["collection"])
            lines = reader.file_lines(folder, ref["path"]) or []
            first, last = ref["lines"]
            passages.append(
                Passage(
                    id=f"R{n}",
                    source_url=ref["source_url"],
                    collection=ref["collection"],
                    text="\n".join(lines[first - 1 : last]),
                )
            )
        run = AgentRun(
            answer=new["answer"],
            sources=list(new["sources"]),
            retrieved=passages,
            tool_calls=[
                ToolUse(name=c["name"], collection=c["collection"], args=c["args"]) for c in new["tool_calls"]
            ],
        )
        out.append(
            Pair(raw["id"], raw["split"], raw["kind"], raw["label"], CheckCase.from_item(item), run, raw)
        )
    return out


@dataclass
class Judged:
    pair: Pair
    outcome: str
    checks: list[ExpectationCheck]


@dataclass
class JudgeRun:
    judge: str
    split: str
    judged: list[Judged]
    calls: int = 0
    input_tokens: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def cases(self) -> int:
        return len(self.judged)

    @property
    def decided(self) -> list[Judged]:
        return [j for j in self.judged if j.outcome != "undecided"]

    @property
    def coverage(self) -> float | None:
        return len(self.decided) / self.cases if self.cases else None

    def overall(self) -> Agreement:
        return agreement([(j.pair.label, j.outcome) for j in self.judged], OUTCOMES)

    def decided_part(self) -> Agreement:
        return agreement([(j.pair.label, j.outcome) for j in self.decided], ("pass", "fail"))

    def by_kind(self) -> dict[str, tuple[int, int, int]]:
        """kind -> (cases, decided, right)."""
        out: dict[str, tuple[int, int, int]] = {}
        for kind in KINDS:
            of = [j for j in self.judged if j.pair.kind == kind]
            decided = [j for j in of if j.outcome != "undecided"]
            out[kind] = (len(of), len(decided), sum(j.outcome == j.pair.label for j in decided))
        return out


async def judge_pairs(judge: CheckJudge, pairs: Sequence[Pair], name: str, split: str) -> JudgeRun:
    try:
        found = await asyncio.gather(*(judge.check(p.case, p.run) for p in pairs))
    finally:
        await judge.aclose()
    judged = [
        Judged(p, CaseResult.outcome_of(p.run, checks), checks)
        for p, checks in zip(pairs, found, strict=True)
    ]
    usage = judge.usage
    return JudgeRun(name, split, judged, calls=usage.calls, input_tokens=usage.input_tokens)


def _tools() -> dict[str, str]:
    from triage.settings import load_config

    return dict(load_config().tools)


async def run_judge(name: str, pairs: Sequence[Pair], split: str) -> JudgeRun:
    """One judge over `pairs` (`offline`, `llm-perfect` or `llm`)."""
    from triage.judges.expectations import LLMCheckJudge, OfflineCheckJudge

    if name == "offline":
        return await judge_pairs(OfflineCheckJudge(tools=_tools()), pairs, name, split)
    import openai

    if name == "llm-perfect":
        from tests.doubles.perfect_model import PerfectCheckModel

        with PerfectCheckModel([p.raw for p in pairs]) as model:
            client = openai.AsyncOpenAI(base_url=model.url, api_key="perfect", max_retries=0)
            judge = LLMCheckJudge(client=client, model=MODEL, tools=_tools(), backoff_base=0.05)
            run = await judge_pairs(judge, pairs, name, split)
            if model.unknown:
                run.notes.append(
                    f"the perfect model did not know {len(model.unknown)} prompts: {model.unknown[:3]}"
                )
        return run
    model_name = os.environ.get("TRIAGE_JUDGE_MODEL")
    if not model_name:
        raise SystemExit("--judge llm needs TRIAGE_JUDGE_MODEL (and OPENAI_BASE_URL, OPENAI_API_KEY)")
    client = openai.AsyncOpenAI(
        base_url=os.environ.get("OPENAI_BASE_URL"),
        api_key=os.environ.get("OPENAI_API_KEY") or "unused",
        max_retries=0,
    )
    return await judge_pairs(
        LLMCheckJudge(client=client, model=model_name, tools=_tools()), pairs, name, split
    )


async def evaluate(
    judges: Sequence[str], splits: Sequence[str], corpus: Path | None = None
) -> list[JudgeRun]:
    everything = load_pairs("all", corpus)
    runs = []
    for judge in judges:
        for split in splits:
            pairs = [p for p in everything if split == "all" or p.split == split]
            runs.append(await run_judge(judge, pairs, split))
    return runs


# -- rendering -----------------------------------------------------------------------------------------


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _interval(a: Agreement) -> str:
    return "–" if a.kappa_low is None or a.kappa_high is None else f"{a.kappa_low:.2f} to {a.kappa_high:.2f}"


def _kind_cell(cases: int, decided: int, right: int) -> str:
    if not cases:
        return "–"
    return f"{right / cases:.2f} ({decided}/{cases})"


def render(runs: Sequence[JudgeRun], detail: str) -> str:
    out = ["# Evaluation: evals/check (the check judges)", ""]
    head = (
        "| judge | split | cases | decided | coverage | accuracy | kappa | 95% interval | decided accuracy "
        "| decided kappa | " + " | ".join(KINDS) + " | model calls per case |"
    )
    out += [head, "|---|---|---:|---:|---:|---:|---:|---|---:|---:|" + "---:|" * len(KINDS) + "---:|"]
    for run in runs:
        every, part = run.overall(), run.decided_part()
        kinds = run.by_kind()
        out.append(
            f"| `{run.judge}` | {run.split} | {run.cases} | {len(run.decided)} | {_num(run.coverage)} "
            f"| {_num(every.accuracy)} | {_num(every.kappa)} | {_interval(every)} | {_num(part.accuracy)} "
            f"| {_num(part.kappa)} | "
            + " | ".join(_kind_cell(*kinds[k]) for k in KINDS)
            + f" | {_num(run.calls / run.cases if run.cases else None)} |"
        )
    out += [
        "",
        "Accuracy and kappa: every case, an undecided one counted as a miss (kappa with undecided as a third",
        "answer). Decided accuracy and kappa: the cases the judge decided. Per kind: accuracy over the kind's",
        "cases (decided/cases).",
    ]
    for run in runs:
        if run.split != detail:
            continue
        wrong = [j for j in run.decided if j.outcome != j.pair.label]
        open_ = [j for j in run.judged if j.outcome == "undecided"]
        out += [
            "",
            f"## `{run.judge}` ({run.split}): {len(run.decided) - len(wrong)} of {run.cases} right",
            "",
        ]
        out += [f"- note: {n}" for n in run.notes]
        for j in wrong:
            out.append(
                f"- `{j.pair.id}` ({j.pair.kind}): labelled `{j.pair.label}`, found `{j.outcome}`: {_why(j)}"
            )
        if not wrong:
            out.append("No decided case wrong.")
        if open_:
            out += ["", f"Undecided, for a person ({len(open_)}):", ""]
            out += [f"- `{j.pair.id}` ({j.pair.kind}, labelled `{j.pair.label}`): {_why(j)}" for j in open_]
    return "\n".join(out) + "\n"


def _why(j: Judged) -> str:
    """The checks that made the outcome: the failing ones for a fail, the undecided for undecided."""
    want = {"fail": False, "undecided": None}.get(j.outcome, True)
    shown = [c for c in j.checks if c.passed is want] or j.checks
    return "; ".join(f"{c.name} ({c.confidence}): {c.evidence}" for c in shown).replace("\n", " ")


def render_figures(runs: Sequence[JudgeRun]) -> str:
    """Per expectation: how often decided and, on the cases whose label it decides alone (the kind),
    how often right; and the decided cases' accuracy by the weakest confidence among their checks."""
    out = ["", "## By expectation and by confidence", ""]
    out += [
        "| judge | split | expectation | checks | decided | on its own kind: right/decided |",
        "|---|---|---|---:|---:|---:|",
    ]
    for run in runs:
        for name in ("correction", "must_cite", "must_not_claim", "decline", "tool_behavior"):
            checks = [(j, c) for j in run.judged for c in j.checks if c.name == name]
            if not checks:
                continue
            decided = [(j, c) for j, c in checks if c.passed is not None]
            own = [(j, c) for j, c in decided if j.pair.kind == name]
            agreed = sum((c.passed is True) == (j.pair.label == "pass") for j, c in own)
            out.append(
                f"| `{run.judge}` | {run.split} | {name} | {len(checks)} | {len(decided)} | {agreed}/{len(own)} |"
            )
    out += ["", "| judge | split | weakest confidence | decided cases | right |", "|---|---|---|---:|---:|"]
    order = {"low": 0, "medium": 1, "high": 2}
    for run in runs:
        bands: Counter[str] = Counter()
        right: Counter[str] = Counter()
        for j in run.decided:
            weakest = min(
                (c.confidence for c in j.checks if c.passed is not None),
                key=order.__getitem__,
                default="high",
            )
            if j.outcome == "fail":  # a fail rests on its failing checks alone
                weakest = max((c.confidence for c in j.checks if c.passed is False), key=order.__getitem__)
            bands[weakest] += 1
            right[weakest] += j.outcome == j.pair.label
        for band in ("high", "medium", "low"):
            if bands[band]:
                out.append(f"| `{run.judge}` | {run.split} | {band} | {bands[band]} | {right[band]} |")
    return "\n".join(out) + "\n"


def figures_json(runs: Sequence[JudgeRun]) -> list[dict[str, Any]]:
    rows = []
    for run in runs:
        every, part = run.overall(), run.decided_part()
        rows.append(
            {
                "judge": run.judge,
                "split": run.split,
                "cases": run.cases,
                "decided": len(run.decided),
                "coverage": run.coverage,
                "accuracy": every.accuracy,
                "kappa": every.kappa,
                "kappa_low": every.kappa_low,
                "kappa_high": every.kappa_high,
                "decided_accuracy": part.accuracy,
                "decided_kappa": part.kappa,
                "by_kind": run.by_kind(),
                "outcomes": {j.pair.id: j.outcome for j in run.judged},
                "model_calls": run.calls,
            }
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--split", choices=("dev", "test", "all"), help="default: dev, test and all")
    parser.add_argument(
        "--judge", action="append", choices=JUDGES, help="repeatable; default: offline, llm-perfect"
    )
    parser.add_argument("--figures", action="store_true", help="by expectation and by confidence")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    parser.add_argument("--corpus", type=Path, help="default: ../shared/corpus")
    args = parser.parse_args(argv)
    corpus = args.corpus or default_corpus()
    if not corpus_present(corpus):
        print(f"skipped: the shared corpus is not here ({corpus})")
        return 0
    splits = [args.split] if args.split else ["dev", "test", "all"]
    runs = asyncio.run(evaluate(args.judge or ["offline", "llm-perfect"], splits, corpus))
    print(render(runs, args.split or "all"), end="")
    if args.figures:
        print(render_figures(runs), end="")
    if args.json:
        args.json.write_text(json.dumps(figures_json(runs), indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
