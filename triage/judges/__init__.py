"""The judges by name: the one registry `triage.app.make_judge`, `triage eval` and `--judge` read.

A spec is a judge's name, or `name:ARGUMENT` for a judge that takes one (`replay:FILE`), parsed
here once. Each entry builds its judge from a `JudgeSetup` (the configuration, and the model
server's address and key that `triage.app` reads from the settings), importing its module only when
it is chosen. A new judge backend is a module under `judges/` implementing `domain.ports.Judge` and
one entry in `JUDGES`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from triage.domain.config import TriageConfig
from triage.domain.ports import Judge
from triage.errors import ConfigError
from triage.retry import Budget

if TYPE_CHECKING:
    from triage.judges.batch_rounds import BatchCollector
    from triage.judges.llm import LLMJudge


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
class JudgeKind:
    """One judge of the registry."""

    name: str
    #: builds the judge from the setup and the spec's argument (None when the judge takes none)
    build: Callable[[JudgeSetup, str | None], Judge]
    #: what follows `name:` in a spec (`FILE` for `replay:FILE`); None: the judge takes no argument
    argument: str | None = None

    @property
    def spec(self) -> str:
        """How `--judge` names it: `heuristic`, `replay:FILE`."""
        return f"{self.name}:{self.argument}" if self.argument else self.name


def _heuristic(setup: JudgeSetup, argument: str | None) -> Judge:
    from triage.judges.heuristic import HeuristicJudge

    return HeuristicJudge()


def _model_judge(setup: JudgeSetup, name: str) -> LLMJudge:
    if not setup.model:
        raise ConfigError(f"--judge {name} needs a model: set TRIAGE_JUDGE_MODEL (and OPENAI_API_KEY)")
    import openai

    from triage.judges.llm import LLMJudge

    client = openai.AsyncOpenAI(
        base_url=setup.base_url,
        api_key=setup.api_key or "unused",
        max_retries=0,  # the judge retries itself, with its own backoff and deadline
    )
    config = setup.config
    return LLMJudge(
        client=client,
        model=setup.model,
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

#: every judge `--judge` may name, in the order help lists them
JUDGES: dict[str, JudgeKind] = {
    kind.name: kind
    for kind in (
        JudgeKind(HEURISTIC, _heuristic),
        JudgeKind(LLM, _llm),
        JudgeKind(CASCADE, _cascade),
        JudgeKind(REPLAY, _replay, argument="FILE"),
    )
}


def specs() -> list[str]:
    """How `--judge` names each judge: `heuristic`, ..., `replay:FILE`."""
    return [kind.spec for kind in JUDGES.values()]


def metavar() -> str:
    """`heuristic|llm|cascade|replay:FILE`, for `--judge`'s help."""
    return "|".join(specs())


def name_of(spec: str) -> str:
    """The judge's name in a spec (`replay` of `replay:FILE`)."""
    return spec.partition(":")[0]


def spec_of(name: str, argument: str | None = None) -> str:
    """The spec naming judge `name` with `argument` (`replay:FILE`)."""
    return f"{name}:{argument}" if argument is not None else name


def parse(spec: str) -> tuple[JudgeKind, str | None]:
    """The judge a spec names and its argument. Raises `ConfigError` for a name not in the registry,
    or an argument given to a judge that takes none (or none to one that needs it)."""
    name, colon, argument = spec.partition(":")
    kind = JUDGES.get(name)
    if kind is None or bool(colon) != (kind.argument is not None):
        known = specs()
        raise ConfigError(f"unknown judge {spec!r}: use {', '.join(known[:-1])} or {known[-1]}")
    return kind, argument if colon else None


def build(spec: str | None, setup: JudgeSetup) -> Judge:
    """The judge `spec` names; by default `llm` when a model is configured, else `heuristic`."""
    kind, argument = parse(spec or (LLM if setup.model else HEURISTIC))
    return kind.build(setup, argument)
