"""One trace to one verdict: re-search, judge, rule, component and owners, then its scores."""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass, field
from typing import IO

from triage.domain.config import TriageConfig
from triage.domain.outcome import Entry, Findings, shorten
from triage.domain.ports import Judge, JudgeRequest, SearchMore
from triage.domain.records import (
    Evidence,
    Facts,
    Passage,
    Trace,
    Verdict,
    Vote,
    bounded,
    decided_by,
)
from triage.domain.rule import RulePath, Undetermined, choose_component, explain, owners, walk
from triage.domain.scores import ScoreBody, score_id, score_timestamp
from triage.domain.verdicts import VerdictMeta
from triage.engine.ledger import Ledger, comments
from triage.errors import JudgeError, JudgeRejected, SearchError
from triage.search.local import Researcher
from triage.sinks.exports import write_facts_line

log = logging.getLogger("triage")


def empty_answer_facts(facts: Facts) -> Facts:
    """An empty answer proves two facts whatever a judge says: it is not grounded (it gives the
    user nothing the passages hold) and it is not a decline (it says nothing at all)."""
    note = Evidence(confidence="high", note="the answer is empty", decided_by="trace")
    evidence = {**facts.evidence, "answer_grounded": note, "answer_declined": note}
    return facts.model_copy(update={"answer_grounded": False, "answer_declined": False, "evidence": evidence})


QUERY_CHARS = 200
MAX_QUERIES = 5
QUOTE_CHARS = 240
MAX_CLAIMS = 5


def findings(path: RulePath, trace: Trace, *, searched_again: bool, collections: list[str]) -> Findings:
    """The evidence an owner needs to act, cut short (the whole trace is one click away): the facts
    the rule read on its `path`, in order, and who decided each."""
    facts = path.facts
    queries = []
    for call in trace.tool_calls:
        if not call.is_search:
            continue
        query = call.args.get("query")
        if isinstance(query, str) and query.strip():
            queries.append(shorten(query, QUERY_CHARS))
    quote = None
    for name in ("retrieved_has_answer", "index_has_answer"):
        held = facts.evidence.get(name)
        if held is not None and held.quotes and getattr(facts, name):
            quote = shorten(held.quotes[0], QUOTE_CHARS)
            break
    decided = []
    for name in path.judged:
        value = getattr(facts, name)
        held = facts.evidence.get(name)
        if isinstance(value, bool):
            decided.append((name, "yes" if value else "no", (held.decided_by if held else None) or "?"))
    return Findings(
        decided=tuple(decided),
        agent_queries=tuple(dict.fromkeys(queries))[:MAX_QUERIES],
        answer_url=facts.answer_sources[0] if facts.answer_sources else None,
        answer_quote=quote,
        unsupported=tuple(shorten(c, QUERY_CHARS) for c in facts.unsupported_claims[:MAX_CLAIMS]),
        searched_again=tuple(collections) if searched_again else (),
    )


@dataclass(kw_only=True, eq=False)
class VerdictMaker:
    """Triage of one trace at a time, at most `concurrency` judged at once."""

    judge: Judge
    #: the trace alone proves the layer when the agent never searched: no model is asked, only
    #: the free checks run (invented specifics, decline phrases, injection)
    no_search_judge: Judge
    config: TriageConfig
    ledger: Ledger
    #: None when the judge needs no re-search, or there is no search (`run_feedback` opens none)
    researcher: Researcher | None
    #: why the search is down, where it is
    search_down: str | None
    facts_out: IO[str] | None
    concurrency: int
    gate: asyncio.Semaphore = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.gate = asyncio.Semaphore(self.concurrency)

    def _more(self, trace: Trace, research: list[Passage] | None) -> SearchMore | None:
        """The judge's follow-up search for this trace, where there was a re-search to follow up."""
        if research is None or self.researcher is None or self.researcher.max_more == 0:
            return None
        return functools.partial(self.researcher.more, known=research, shown=trace.passages)

    async def triage(self, trace: Trace, votes: list[Vote]) -> tuple[Entry, list[ScoreBody]] | None:
        """The entry and its scores; None when the trace is listed as undecided instead."""
        comment = "\n".join(comments(votes)) or None
        research: list[Passage] | None = None
        search_problem = self.search_down
        unsearched: dict[str, str] = {}
        judge = self.judge if trace.searched else self.no_search_judge
        async with self.gate:
            if self.researcher is not None and trace.searched:
                try:
                    found = await self.researcher.research_all(trace, comment)
                    research, unsearched = found.passages, found.unavailable
                except SearchError as ex:
                    search_problem = str(ex)
            try:
                request = JudgeRequest.of(trace, research, comment, search_more=self._more(trace, research))
                facts = await judge.judge(request)
            except JudgeRejected as ex:
                self.ledger.skip(votes, trace.id, "rejected", f"judge output rejected: {ex}", trace.question)
                return None
            except JudgeError as ex:
                self.ledger.skip(votes, trace.id, "unavailable", f"judge unavailable: {ex}", trace.question)
                return None
        if unsearched and facts.index_has_answer is False:
            # "nothing in the index holds it" needs every collection searched: with one down (its
            # breaker open) the fact is unknown, and a trace whose layer needs it is listed
            evidence = {name: held for name, held in facts.evidence.items() if name != "index_has_answer"}
            facts = facts.model_copy(update={"index_has_answer": None, "evidence": evidence})
            search_problem = "; ".join(f"the {c} collection: {why}" for c, why in unsearched.items())
        if not trace.answer.strip():
            facts = empty_answer_facts(facts)
        facts = bounded(decided_by(facts, judge.name))
        path = walk(facts, self.config.agent.issues_collection)
        try:
            layer = path.decided
        except Undetermined as ex:
            why = (
                f"search unavailable ({search_problem})"
                if ex.missing == "index_has_answer" and search_problem
                else "the judge could not establish it"
            )
            self.ledger.skip(votes, trace.id, "unavailable", f"{ex}: {why}", trace.question)
            return None
        # a trace that searched nothing may still have read a page (`fetch_url`): what it read is
        # what its question was about, more surely than the question's keywords
        read = [url for call in trace.tool_calls for url in call.urls] if not trace.searched else []
        component, component_from = choose_component(
            facts.answer_sources or read, facts.component, trace.question, comment, self.config
        )
        if facts.component is not None and facts.component not in self.config.components:
            log.info(
                "trace %s: the judge's component %r is not in the catalogue; decided by %s",
                trace.id,
                facts.component[:60],
                component_from,
                extra={"event": "component_discarded"},
            )
        reason = explain(layer, facts)
        verdict = Verdict(
            trace_id=trace.id,
            layer=layer,
            component=component,
            owners=owners(layer, component, self.config),
            reason=reason,
            facts=facts,
            rule_version=self.config.rule_version,
            # the judge that produced these facts, not the one configured: a no-search trace is
            # judged by `no_search_judge`, and a judge-vs-human measurement must know it
            judge=judge.name,
            prompt_version=judge.prompt_version,
            component_from=component_from,
        )
        if self.facts_out is not None:
            # the local run file: what `--judge replay:FILE` reads back
            self.facts_out.write(
                write_facts_line(trace.id, facts, judge=verdict.judge, prompt_version=verdict.prompt_version)
                + "\n"
            )
        scores = self.scores_for(verdict, trace, votes)
        entry = Entry(
            trace_id=trace.id,
            layer=layer,
            component=component,
            owners=verdict.owners,
            reason=reason,
            question=shorten(trace.question),
            comments=comments(votes),
            url=trace.url,
            injection_suspected=facts.injection_suspected,
            findings=findings(path, trace, searched_again=research is not None, collections=self.config.collections),
            start=trace.start_time,
            score_time=scores[0].timestamp,
            environment=trace.environment,
        )
        return entry, scores

    def scores_for(self, verdict: Verdict, trace: Trace, votes: list[Vote]) -> list[ScoreBody]:
        names = self.config.scores
        stamp = score_timestamp(trace.start_time, min(v.timestamp for v in votes))
        metadata = VerdictMeta(
            facts=verdict.facts,
            judge=verdict.judge,
            prompt_version=verdict.prompt_version,
            rule_version=verdict.rule_version,
            owners=verdict.owners,
            component_from=verdict.component_from,
            votes=[v.id for v in votes],
        ).to_metadata()
        return [
            ScoreBody(
                data_type="CATEGORICAL",
                id=score_id(trace.id, name, verdict.rule_version),
                trace_id=trace.id,
                name=name,
                value=value,
                comment=verdict.reason,
                metadata=metadata,
                timestamp=stamp,
                environment=trace.environment,
            )
            for name, value in ((names.layer, verdict.layer.value), (names.component, verdict.component))
        ]
