"""The layer rule: a pure function from facts to one layer.

    no search call                       -> agent_skipped_retrieval
    retrieved passages hold the answer   -> ok (grounded, not declined) | generation
    the index holds the answer           -> tool_routing (only in issues, issues never searched) | retrieval
    otherwise                            -> content_gap_handled (declined and grounded)
                                            | content_gap_hallucination

Only the facts a branch needs are required: a fact the branch needs that is `None` (could not be
established) makes the trace undecided, named by `Undetermined.missing`.
"""

from __future__ import annotations

from triage.domain.records import Facts, Layer


class Undetermined(Exception):
    """A fact the rule needs could not be established."""

    def __init__(self, missing: str) -> None:
        super().__init__(f"fact not established: {missing}")
        self.missing = missing


def _need(facts: Facts, name: str) -> bool:
    value = getattr(facts, name)
    if value is None:
        raise Undetermined(name)
    return bool(value)


def decide(facts: Facts, issues_collection: str = "issues") -> Layer:
    """The layer for `facts`. Raises `Undetermined` when a needed fact is missing."""
    if not facts.agent_searched:
        return Layer.AGENT_SKIPPED_RETRIEVAL
    if _need(facts, "retrieved_has_answer"):
        grounded = _need(facts, "answer_grounded")
        declined = _need(facts, "answer_declined")
        return Layer.OK if grounded and not declined else Layer.GENERATION
    if _need(facts, "index_has_answer"):
        in_issues_only = facts.answer_collection == issues_collection
        if in_issues_only and issues_collection not in facts.agent_searched_collections:
            return Layer.TOOL_ROUTING
        return Layer.RETRIEVAL
    declined = _need(facts, "answer_declined")
    grounded = _need(facts, "answer_grounded")
    return Layer.CONTENT_GAP_HANDLED if declined and grounded else Layer.CONTENT_GAP_HALLUCINATION


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
