"""Checks in code after every reply: cited ids exist in the right set, quotes are exact substrings
of the block they cite, `contains_answer` carries a quote.

Each check returns the problems found (ids and check names only, never quoted text): an empty
list accepts the reply; otherwise the model is told them and asked once more.

The component the model picks is not checked here: a name outside the catalogue is no reason to
retry or reject a reply whose containment verdicts are sound. `facts.FactMaker` discards such a
pick (the engine then decides the component by keywords or the default) and the judge logs it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from triage.judges.llm.blocks import Block, PassageSet
from triage.judges.llm.quotes import quote_found, safe_id
from triage.judges.llm.replies import ContainmentReply, GroundingReply, SetVerdict


def containment_problems(reply: ContainmentReply, asked: Sequence[PassageSet]) -> list[str]:
    problems: list[str] = []
    for s in asked:
        verdict: SetVerdict | None = getattr(reply, s.key)
        if verdict is None:
            problems.append(f'the "{s.key}" verdict is missing')
            continue
        if verdict.verdict == "no_answer":
            continue  # evidence for "no answer" is not used, so it cannot reject the reply
        if verdict.verdict == "contains_answer" and not verdict.evidence:
            problems.append(f'"{s.key}" is contains_answer but cites no passage and quote')
        for n, item in enumerate(verdict.evidence, start=1):
            block = s.blocks.get(item.passage_id)
            if block is None:
                problems.append(
                    f'"{s.key}" evidence {n} cites {safe_id(item.passage_id)}, '
                    f"which is not a passage of that set (its ids start with {s.prefix})"
                )
            elif not block.holds(item.quote):
                problems.append(f'"{s.key}" evidence {n}: the quote is not an exact substring of {block.id}')
    return problems


def grounding_problems(reply: GroundingReply, blocks: Mapping[str, Block], answer: str) -> list[str]:
    problems: list[str] = []
    for n, claim in enumerate(reply.claims, start=1):
        if claim.status == "unsupported":
            continue
        block = blocks.get(claim.source_id)
        if block is None:
            problems.append(
                f"claim {n} is {claim.status} but cites {safe_id(claim.source_id)}, which is not a "
                "passage (R..) or tool call (T..) given"
            )
        elif not block.holds(claim.quote):
            problems.append(f"claim {n}: the quote is not an exact substring of {block.id}")
    if reply.declined.verdict == "declined" and not quote_found(reply.declined.quote, answer):
        problems.append('"declined" needs a quote that is an exact substring of the answer')
    return problems
