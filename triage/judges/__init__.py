"""The judges by name: the one registry `feedback`, `eval`, `calibrate` and `check` read.

Two families share it: `JUDGES` (a trace to facts, `domain.ports.Judge`) and `CHECK_JUDGES` (a
regression case's new run to verdicts on its expectations, `domain.checks.CheckJudge`). A spec is a
judge's name, or `name:ARGUMENT` for a judge that takes one (`replay:FILE`), parsed here once. Each
entry builds its judge from a `JudgeSetup` (the configuration, and the model server's address and key
that `triage.app` reads from the settings), importing its module only when it is chosen.

The wing has three floors: the thin judges, a module each, on top; below them the evidence floor
(`offline/`, no model) and the model floor (`model/`: the exchange, prompts, replies, the Batch
API), which do not import each other; below both the injection guard (`guard`). A new judge is a
module on the top floor implementing its family's port and one entry in its family here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from triage.domain.checks import CheckJudge
from triage.domain.config import TriageConfig
from triage.domain.ports import Judge
from triage.errors import ConfigError
from triage.retry import Budget

if TYPE_CHECKING:
    import openai

    from triage.judges.llm import LLMJudge
    from triage.judges.model.rounds import BatchCollector

J = TypeVar("J")


@dataclass(frozen=True)
class JudgeSetup:
    """What a judge is built from: the configuration, and the model server a model judge asks."""

    config: TriageConfig
    #: the judge's model (TRIAGE_JUDGE_MODEL), None when none is configured; the OpenAI-compatible
    #: server that serves it, and its key
    model: str | None
    base_url: str | None
    api_key: str | None
    #: the run's budget for waiting on outside systems
    budget: Budget | None = None
    #: batch mode (`triage feedback --batch`): a model judge asks its calls through this collector
    batch: BatchCollector | None = None


@dataclass(frozen=True)
class JudgeKind(Generic[J]):
    """One judge of the registry."""

    name: str
    #: builds the judge from the setup and the spec's argument (None when the judge takes none)
    build: Callable[[JudgeSetup, str | None], J]
    #: what it is, in a line: `--help` lists the family with these (`Family.epilog`)
    summary: str
    #: what follows `name:` in a spec (`FILE` for `replay:FILE`); None: the judge takes no argument
    argument: str | None = None

    @property
    def spec(self) -> str:
        """How `--judge` names it: `heuristic`, `replay:FILE`."""
        return f"{self.name}:{self.argument}" if self.argument else self.name


@dataclass(frozen=True)
class Family(Generic[J]):
    """The judges of one shape, by name: `JUDGES` (a trace to facts, `domain.ports.Judge`: the night,
    `eval`, `calibrate`) and `CHECK_JUDGES` (a regression case's new run to expectation verdicts,
    `domain.checks.CheckJudge`: `triage check`)."""

    #: what the family is called in errors ("judge", "check judge")
    title: str
    kinds: tuple[JudgeKind[J], ...]
    #: the judge chosen when none is named: (with a model, without one)
    defaults: tuple[str, str]

    def __iter__(self) -> Iterator[str]:
        return (kind.name for kind in self.kinds)

    def names(self) -> list[str]:
        """The judges' names, in the order help lists them."""
        return list(self)

    def specs(self) -> list[str]:
        """How `--judge` names each judge: `heuristic`, ..., `replay:FILE`."""
        return [kind.spec for kind in self.kinds]

    def epilog(self) -> str:
        """The family in `--help`, a judge a line (kept unwrapped by click's `\\b`): the one list of
        the judges a person reads, so a new judge is listed where it is registered."""
        width = max(len(spec) for spec in self.specs())
        lines = [f"  {kind.spec:<{width}}  {kind.summary}" for kind in self.kinds]
        return "\b\n" + f"The {self.title}s (--judge):\n" + "\n".join(lines)

    def parse(self, spec: str) -> tuple[JudgeKind[J], str | None]:
        """The judge a spec names and its argument. Raises `ConfigError` for a name not in the
        family, or an argument given to a judge that takes none (or none to one that needs it)."""
        name, colon, argument = spec.partition(":")
        kind = next((k for k in self.kinds if k.name == name), None)
        if kind is None or bool(colon) != (kind.argument is not None):
            known = self.specs()
            raise ConfigError(f"unknown {self.title} {spec!r}: use {', '.join(known[:-1])} or {known[-1]}")
        return kind, argument if colon else None

    def build(self, spec: str | None, setup: JudgeSetup) -> J:
        """The judge `spec` names; by default the family's model judge when a model is configured."""
        with_model, without = self.defaults
        kind, argument = self.parse(spec or (with_model if setup.model else without))
        return kind.build(setup, argument)


def name_of(spec: str) -> str:
    """The judge's name in a spec (`replay` of `replay:FILE`)."""
    return spec.partition(":")[0]


def spec_of(name: str, argument: str | None = None) -> str:
    """The spec naming judge `name` with `argument` (`replay:FILE`)."""
    return f"{name}:{argument}" if argument is not None else name


def _client(setup: JudgeSetup, who: str) -> tuple[openai.AsyncOpenAI, str]:
    """The model server's client for a model judge (`who` names it in the error without a model)."""
    if not setup.model:
        raise ConfigError(f"{who} needs a model: set TRIAGE_JUDGE_MODEL (and OPENAI_API_KEY)")
    import openai

    client = openai.AsyncOpenAI(
        base_url=setup.base_url,
        api_key=setup.api_key or "unused",
        max_retries=0,  # the judge retries itself, with its own backoff and deadline
    )
    return client, setup.model


# -- the triage judges ---------------------------------------------------------------------------


def _heuristic(setup: JudgeSetup, argument: str | None) -> Judge:
    from triage.judges.heuristic import HeuristicJudge

    return HeuristicJudge()


def _model_judge(setup: JudgeSetup, name: str) -> LLMJudge:
    from triage.judges.llm import LLMJudge

    client, model = _client(setup, f"--judge {name}")
    config = setup.config
    return LLMJudge(
        client=client,
        model=model,
        components=config.components,
        default_component=config.agent.default_component,
        concurrency=config.judge.concurrency,
        budget=setup.budget,
        search_again=config.search.judge_queries,
        batch=setup.batch,
    )


def _llm(setup: JudgeSetup, argument: str | None) -> Judge:
    return _model_judge(setup, LLM)


def _cascade(setup: JudgeSetup, argument: str | None) -> Judge:
    model_judge = _model_judge(setup, CASCADE)
    from triage.judges.cascade import CascadeJudge
    from triage.judges.heuristic import HeuristicJudge

    return CascadeJudge(HeuristicJudge(), model_judge)


def _replay(setup: JudgeSetup, argument: str | None) -> Judge:
    from triage.judges.replay import ReplayJudge

    return ReplayJudge(Path(argument or ""), collections=setup.config.collections)


HEURISTIC, LLM, CASCADE, REPLAY = "heuristic", "llm", "cascade", "replay"

#: every judge `--judge` of `feedback`, `eval` and `calibrate` may name, in the order help lists them
JUDGES: Family[Judge] = Family(
    title="judge",
    kinds=(
        JudgeKind(HEURISTIC, _heuristic, "offline: the trace and the passages, no model"),
        JudgeKind(LLM, _llm, "the model (TRIAGE_JUDGE_MODEL) decides every fact"),
        JudgeKind(CASCADE, _cascade, "the model only where the offline checks cannot decide"),
        JudgeKind(REPLAY, _replay, "recorded facts (--facts-file), no search and no model", argument="FILE"),
    ),
    defaults=(LLM, HEURISTIC),
)


# -- the check judges (`triage check`) -----------------------------------------------------------


def _offline_check(setup: JudgeSetup, argument: str | None) -> CheckJudge:
    from triage.judges.check_offline import OfflineCheckJudge

    return OfflineCheckJudge(tools=setup.config.tools)


def _llm_check(setup: JudgeSetup, argument: str | None) -> CheckJudge:
    from triage.judges.check_llm import LLMCheckJudge

    client, model = _client(setup, "the llm check judge")
    return LLMCheckJudge(
        client=client,
        model=model,
        tools=setup.config.tools,
        concurrency=setup.config.judge.concurrency,
        budget=setup.budget,
    )


OFFLINE = "offline"

#: every judge `triage check --judge` may name
CHECK_JUDGES: Family[CheckJudge] = Family(
    title="check judge",
    kinds=(
        JudgeKind(OFFLINE, _offline_check, "no model: what the code can verify, the rest unchecked"),
        JudgeKind(LLM, _llm_check, "the model, each pass backed by evidence the code verifies"),
    ),
    defaults=(LLM, OFFLINE),
)
