"""The check judges (`triage.judges.CHECK_JUDGES`) against the labelled check set (evals/check).

    python bench/checkeval.py                                # offline and llm-perfect, dev and test
    python bench/checkeval.py --split dev --judge offline    # one judge, one split
    python bench/checkeval.py --split test --figures         # also: by expectation and confidence
    python bench/checkeval.py --judge llm                    # a real model: TRIAGE_JUDGE_MODEL,
                                                             # OPENAI_BASE_URL, OPENAI_API_KEY

Each pair of `evals/check/pairs.jsonl` is a regression case (read by `CheckCase.from_item`, as
`triage check` reads a dataset item) and a new run: the pair's `new_run` as an agent would reply
in the agent answer format (`agent_reply`: the answer, its sources, its tool calls, its retrieved
passages with their text loaded from `../shared/corpus` at run time: the set holds corpus paths
and line ranges, never the text), read by the same function `triage check` reads an agent's reply
with (`triage.sources.agents.read_reply`), so the judge sees here what it sees there
(tests/sources/test_agents.py checks both give the same verdict on every pair). The judge decides
every expectation the case carries; the case's outcome (`CaseResult.outcome_of`: pass, fail, or
undecided when one expectation is undecided) is compared with the human label.

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

Measured (2 cores, a few seconds; the offline rules chosen on `dev` only), 2026-12-07, on the 152
pairs (chk-001 to chk-080, and the blind batch chk-081 to chk-152 with `answers` and `rests_on`):

| judge | split | cases | accuracy | kappa (95%) | coverage | decided accuracy |
|---|---|---:|---:|---|---:|---:|
| `offline` | dev | 76 | 0.76 | 0.62 (0.49 to 0.74) | 0.76 | 1.00 (58/58) |
| `offline` | test | 76 | 0.58 | 0.40 (0.29 to 0.51) | 0.59 | 0.98 (44/45) |
| `offline` | dev, blind batch | 36 | 0.61 | | 0.61 | 1.00 (22/22) |
| `offline` | test, blind batch | 36 | 0.44 | | 0.44 | 1.00 (16/16) |
| `llm-perfect` | dev | 76 | 0.96 | 0.92 (0.84 to 1.00) | 0.96 | 1.00 |
| `llm-perfect` | test | 76 | 0.95 | 0.90 (0.81 to 0.99) | 0.95 | 1.00 |

The offline judge's `high` decisions: 34/34 right on dev, 28/28 on test (the rest `medium`, 24/24
and 16/17). On chk-001 to chk-080 alone: dev 36/36 decided (0.90), test 28/29 (0.72); before a
correction with every value was passed, dev 54/54 and test 42/42 decided (0.71, 0.55); before
`answers` and `rests_on` were decided, dev 32/32 and test 23/25 on chk-001 to chk-080. The
correction rule decides 4 dev cases (4 right) and 5 test cases (4 right); the injection guard,
reading the question as the LLM judge does, leaves 2 test passes decided before to a person (four
test questions address the judge).

What the offline judge leaves undecided is what strings cannot tell: a correction whose every value
is there beside a sentence holding one that negates, hedges or turns it (an added caveat may
contradict it: "even after the imports", "**not** counted"), a claim reworded, a single unseen name after a
decline, an answer that partly declines, an answer whose values are on its page while a sentence
says otherwise ("parallelism=0 runs one at a time"), and every pass of an answer that talks to the
judge (the injection guard). The rules (tuned on dev; see `triage.judges.check_offline`): a correction's
every value there and no sentence holding one turning it passes (medium); a decline
and nothing else does not answer; values on the page, none seen nowhere, rest on it; words joined
by a slash and a correction's number words are no values; a scheme-less link to the project is a
pointer; declines read in German, French, Spanish, Portuguese, Italian, Chinese and Japanese by
cue (no false decline on the 420 answers of evals/declines); a claim's anchors found in code or
prose, an expression's names one by one, numbers and paths needed to make it again; a claim
without anchors never made again by its words. The two test errors of the earlier version are gone
as classes: a claim's subject stated with another value (chk-031, `/models` against the claim's
`/kserve`; dev's chk-059, `Never` against `LongRunning`) is not the claim, and a decline followed
by an invented UI menu (chk-075) is undecided: a UI path (`Export → CSV`) is a specific.
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
from triage.domain.checks import AgentRun, CaseResult, CheckCase, CheckJudge, ExpectationCheck  # noqa: E402
from triage.domain.config import AgentEndpointConfig  # noqa: E402
from triage.domain.review import Agreement  # noqa: E402
from triage.domain.worklist import DatasetItem  # noqa: E402
from triage.sources.agents import read_reply  # noqa: E402

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
    tools = _tools()
    for raw in raw_pairs:
        if split != "all" and raw["split"] != split:
            continue
        item = pair_item(raw)
        run = pair_run(agent_reply(raw["new_run"], reader, verify), tools)
        out.append(
            Pair(raw["id"], raw["split"], raw["kind"], raw["label"], CheckCase.from_item(item), run, raw)
        )
    return out


def pair_item(raw: dict[str, Any], dataset: str = "check-eval") -> DatasetItem:
    """A pair's case as the dataset item `triage promote` would have written."""
    return DatasetItem(
        id=raw["id"],
        dataset_name=dataset,
        input=raw["case"]["input"],
        expected_output=raw["case"]["expected_output"],
        metadata=raw["case"]["metadata"],
    )


#: an agent replying in the agent answer format, read with the default pointers (`kind = "http"`)
ANSWER_FORMAT = AgentEndpointConfig(kind="http", url="http://agent.invalid/ask")


def agent_reply(new_run: dict[str, Any], reader: Any, verify: ModuleType) -> dict[str, Any]:
    """A pair's new run as an agent replies in the agent answer format (docs/commands.md): the
    retrieved passages' text read from the corpus (`reader`: verify.py's `Corpus`)."""
    retrieved = []
    for n, ref in enumerate(new_run["retrieved"], start=1):
        folder = verify.COLLECTION_DIRS.get(ref["collection"], ref["collection"])
        lines = reader.file_lines(folder, ref["path"]) or []
        first, last = ref["lines"]
        retrieved.append(
            {
                "id": f"R{n}",
                "source_url": ref["source_url"],
                "collection": ref["collection"],
                "text": "\n".join(lines[first - 1 : last]),
            }
        )
    return {
        "answer": new_run["answer"],
        "sources": list(new_run["sources"]),
        "retrieved": retrieved,
        "tool_calls": [
            {"name": c["name"], "collection": c["collection"], "args": c["args"]} for c in new_run["tool_calls"]
        ],
    }


def pair_run(reply: dict[str, Any], tools: dict[str, str]) -> AgentRun:
    """The run `triage check` reads from this reply (`read_reply`, the default pointers)."""
    return read_reply(reply, ANSWER_FORMAT, tools)


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
    from triage.judges.check_llm import LLMCheckJudge
    from triage.judges.check_offline import OfflineCheckJudge

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
