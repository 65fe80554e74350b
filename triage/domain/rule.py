"""The layer rule: a pure function from facts to one layer, the path it read, how sure it is, who owns it.

    no search call                       -> agent_skipped_retrieval
    retrieved passages hold the answer   -> ok (grounded, not declined) | generation
    the index holds the answer           -> tool_routing (only in issues, issues never searched) | retrieval
    otherwise                            -> content_gap_handled (declined and grounded)
                                            | content_gap_hallucination

Only the facts a branch needs are required: a fact the branch needs that is `None` (could not be
established) makes the trace undecided, named by `Undetermined.missing`.

`walk` returns the layer with the facts the rule read on the way, in order (`RulePath`): a
verdict's confidence (and whether it is *sure* or a *suggestion*), the findings an owner reads and
the cascade's escalation are all computed from that path, so nothing mirrors the rule by hand. The
component and the owners of the fix are here too: they follow from the layer.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from triage.domain.config import Component, TriageConfig
from triage.domain.records import AGENT_LAYERS, Confidence, Facts, Layer


class Undetermined(Exception):
    """A fact the rule needs could not be established."""

    def __init__(self, missing: str) -> None:
        super().__init__(f"fact not established: {missing}")
        self.missing = missing


#: how sure a fact (and so a verdict) is
_ORDER: dict[Confidence, int] = {"low": 0, "medium": 1, "high": 2}


@dataclass(frozen=True)
class RulePath:
    """The layer the rule reached (None: `missing` was needed and not established) and the facts
    it read on the way, in order, the missing one last. `agent_searched` and the collections come
    from the trace itself and are not listed."""

    facts: Facts = field(repr=False)
    layer: Layer | None
    read: tuple[str, ...]
    missing: str | None = None

    @property
    def decided(self) -> Layer:
        """The layer. Raises `Undetermined` when a needed fact is missing."""
        if self.layer is None:
            assert self.missing is not None
            raise Undetermined(self.missing)
        return self.layer

    @property
    def judged(self) -> tuple[str, ...]:
        """The yes/no facts read (`answer_collection` is a routing detail the judge states with
        `index_has_answer`'s evidence)."""
        return tuple(name for name in self.read if name != "answer_collection")

    @property
    def confidence(self) -> Confidence:
        """How sure the verdict is: the weakest confidence among the facts the layer rests on
        (`high` when it rests on none). A fact with no stated confidence counts as `low` (a judge
        that says nothing about its certainty has not earned `high`), and so does the missing one."""
        levels: list[Confidence] = []
        for name in self.judged:
            held = self.facts.evidence.get(name)
            level = held.confidence if held is not None and name != self.missing else None
            levels.append(level or "low")
        return min(levels, key=_ORDER.__getitem__, default="high")

    @property
    def sure(self) -> bool:
        """Whether the verdict is *sure*: the rule reached a layer and every judged fact it read on
        the way is `high` (a path that reads none, the agent never searched, rests on the trace
        alone). Anything else is a *suggestion*, for a person or a model to check."""
        return self.layer is not None and self.confidence == "high"


class _Reader:
    """The facts as the rule reads them, each read noted."""

    def __init__(self, facts: Facts) -> None:
        self.facts = facts
        self.read: list[str] = []

    def need(self, name: str) -> bool:
        self.read.append(name)
        value = getattr(self.facts, name)
        if value is None:
            raise Undetermined(name)
        return bool(value)

    def look(self, name: str) -> str | None:
        self.read.append(name)
        value: str | None = getattr(self.facts, name)
        return value


def _layer(fact: _Reader, issues_collection: str) -> Layer:
    """The rule itself, said once."""
    if not fact.facts.agent_searched:
        return Layer.AGENT_SKIPPED_RETRIEVAL
    if fact.need("retrieved_has_answer"):
        grounded = fact.need("answer_grounded")
        declined = fact.need("answer_declined")
        return Layer.OK if grounded and not declined else Layer.GENERATION
    if fact.need("index_has_answer"):
        in_issues_only = fact.look("answer_collection") == issues_collection
        if in_issues_only and issues_collection not in fact.facts.agent_searched_collections:
            return Layer.TOOL_ROUTING
        return Layer.RETRIEVAL
    declined = fact.need("answer_declined")
    grounded = fact.need("answer_grounded")
    return Layer.CONTENT_GAP_HANDLED if declined and grounded else Layer.CONTENT_GAP_HALLUCINATION


def walk(facts: Facts, issues_collection: str = "issues") -> RulePath:
    """The rule's path through `facts`: the layer (or the missing fact) and the facts it read."""
    reader = _Reader(facts)
    try:
        layer = _layer(reader, issues_collection)
    except Undetermined as ex:
        return RulePath(facts, None, tuple(reader.read), ex.missing)
    return RulePath(facts, layer, tuple(reader.read))


def decide(facts: Facts, issues_collection: str = "issues") -> Layer:
    """The layer for `facts`. Raises `Undetermined` when a needed fact is missing."""
    return walk(facts, issues_collection).decided


def verdict_confidence(facts: Facts, issues_collection: str = "issues") -> Confidence:
    """The lowest confidence among the facts the layer rests on (`RulePath.confidence`)."""
    return walk(facts, issues_collection).confidence


def explain(layer: Layer, facts: Facts) -> str:
    """The one-line reason for a layer, from the facts that decided it."""
    unsupported = ", ".join(facts.unsupported_claims[:3])
    invented = f" (unsupported: {unsupported})" if unsupported else ""
    where = facts.answer_collection or "index"
    match layer:
        case Layer.AGENT_SKIPPED_RETRIEVAL:
            return "The agent answered without calling any search tool."
        case Layer.OK:
            return "The retrieved passages hold the answer and the answer is grounded in them."
        case Layer.GENERATION if facts.answer_declined:
            return "The retrieved passages hold the answer, but the agent declined to give it."
        case Layer.GENERATION:
            return (
                f"The retrieved passages hold the answer, but the answer is not grounded in them{invented}."
            )
        case Layer.TOOL_ROUTING:
            return f"Only the {where} collection holds the answer, and the agent never searched it."
        case Layer.RETRIEVAL:
            return f"The {where} collection holds the answer, but the agent's searches did not retrieve it."
        case Layer.CONTENT_GAP_HANDLED:
            return "Nothing in the index holds the answer; the agent said so without inventing one."
        case _:
            return f"Nothing in the index holds the answer, and the agent invented one{invented}."


# -- which component, and who owns the fix ------------------------------------------------------
#
# The component comes from the sources that hold the answer (a URL under `components/katib/`), else
# from the question and the comment (the catalogue's keywords). Agent-side layers go to the agent's
# team; content gaps go to the component's working group; an invented answer to a gap goes to both.


def component_from_sources(
    urls: Iterable[str | None], catalogue: TriageConfig | Mapping[str, Component]
) -> str | None:
    """The first catalogue component one of `urls` lies under (the configuration's catalogue, or a
    judge's own)."""
    components = catalogue.components if isinstance(catalogue, TriageConfig) else catalogue
    for url in urls:
        if not url:
            continue
        for name, component in components.items():
            if any(pattern and pattern in url for pattern in component.sources):
                return name
    return None


#: a package manager's install command (`apt-get install`, `pip install -U`) installs a package:
#: its "install" is no keyword hit for the component that installs Kubeflow
_PACKAGE_COMMAND = re.compile(
    r"(?<![\w-])(?:apt-get|apt|pip3?|uv pip|conda|mamba|micromamba|yum|dnf|apk|npm|yarn|brew|poetry)"
    r"(?:\s+-[\w-]+)*\s+"  # options, each one way only: `--x` is `-` and `-x`, never `--` and `x`
)


def component_from_text(text: str, config: TriageConfig) -> str | None:
    """The component whose keywords weigh most in `text` (whole words, case-insensitive).

    Each occurrence weighs as many words as its keyword has, so a specific phrase ("model
    registry", "pipeline editor") outweighs a broad word ("notebook", "pipeline"); a word of the
    text counts once, for the longest keyword that covers it ("pipeline" inside "pipeline editor"
    is not a second hit). A tie goes to the component listed first. The "install" of a package
    manager's command (`pip install kfp`) is not a keyword hit."""
    lowered = text.lower()
    after_command = {m.end() for m in _PACKAGE_COMMAND.finditer(lowered)}
    hits: list[tuple[int, int, int, str]] = []  # (-words, start, end, component)
    for name, component in config.components.items():
        for keyword in component.keywords:
            words = len(keyword.split())
            for found in re.finditer(rf"(?<![\w-]){re.escape(keyword.lower())}(?![\w-])", lowered):
                if found.start() in after_command:
                    continue
                hits.append((-words, found.start(), found.end(), name))
    taken: list[tuple[int, int]] = []
    weights: dict[str, int] = {}
    for neg_words, start, end, name in sorted(hits):
        if any(start < t_end and t_start < end for t_start, t_end in taken):
            continue
        taken.append((start, end))
        weights[name] = weights.get(name, 0) - neg_words
    best, best_weight = None, 0
    for name in config.components:
        if weights.get(name, 0) > best_weight:
            best, best_weight = name, weights[name]
    return best


ComponentSource = Literal["sources", "judge", "keywords", "default"]


def choose_component(
    answer_sources: Iterable[str | None],
    judge_pick: str | None,
    question: str,
    comment: str | None,
    config: TriageConfig,
) -> tuple[str, ComponentSource]:
    """The component, and which source decided it, in this order: the sources that hold the answer;
    else the judge's pick, when it is in the catalogue (a pick outside it is ignored, the layer facts
    stand); else keywords of the question and comment; else the configured default."""
    if found := component_from_sources(answer_sources, config):
        return found, "sources"
    if judge_pick is not None and judge_pick in config.components:
        return judge_pick, "judge"
    if found := component_from_text(f"{question}\n{comment or ''}", config):
        return found, "keywords"
    return config.agent.default_component, "default"


def owners(layer: Layer, component: str, config: TriageConfig) -> list[str]:
    """Who owns the fix. `ok` goes to the agent's team, which reads why users still disliked it."""
    group = config.components[component].owner if component in config.components else config.agent.team
    if layer in AGENT_LAYERS or layer is Layer.OK:
        return [config.agent.team]
    if layer is Layer.CONTENT_GAP_HALLUCINATION:
        return list(dict.fromkeys([config.agent.team, group]))
    return [group]
