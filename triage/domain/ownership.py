"""Which component a trace is about, and who owns the fix.

The component comes from the sources that hold the answer (a URL under `components/katib/`), else
from the question and the comment (the catalogue's keywords). Agent-side layers go to the agent's
team; content gaps go to the component's working group; an invented answer to a gap goes to both.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

from triage.domain.config import TriageConfig
from triage.domain.records import AGENT_LAYERS, Layer


def component_from_sources(urls: Iterable[str | None], config: TriageConfig) -> str | None:
    for url in urls:
        if not url:
            continue
        for name, component in config.components.items():
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
