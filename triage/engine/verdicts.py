"""One trace to one verdict (`VerdictMaker`): its facts from the judge (with the search again, or the
offline judge where no search can serve it), the rule's layer and owners, the findings the report
shows, then its scores; and the run's ledger (`Ledger`), where every thumbs-down ends, triaged (an
`Entry`) or listed (`Skipped`).

No verdict without its evidence: a trace whose verdict may rest on the re-search (`needs_research`,
read off the rule) is judged only once its re-search happened in full; while the search is down (a
collection's breaker open, the server unreachable) it waits, the run's `OutageWait` at most, and is
then listed undecided with the reason, never decided from less evidence nor sent to a model.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import IO, Protocol

from triage.domain.config import TriageConfig
from triage.domain.outcome import Entry, Findings, RunResult, Skipped, shorten
from triage.domain.ports import Judge, JudgeRequest, SearchMore, TraceSource
from triage.domain.records import (
    Evidence,
    Facts,
    Passage,
    Trace,
    Undecided,
    UndecidedKind,
    Verdict,
    Vote,
    bounded,
    decided_by,
)
from triage.domain.rule import RulePath, Undetermined, choose_component, explain, owners, walk
from triage.domain.scores import ScoreBody, VerdictMeta, score_id, score_timestamp
from triage.domain.votes import BadVote
from triage.errors import (
    JudgeError,
    JudgeRejected,
    SearchError,
)
from triage.redact import redact
from triage.retry import Clock, current_clock
from triage.search.local import Research, Researcher
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
        sure=path.sure,
        agent_queries=tuple(dict.fromkeys(queries))[:MAX_QUERIES],
        answer_url=facts.answer_sources[0] if facts.answer_sources else None,
        answer_quote=quote,
        unsupported=tuple(shorten(c, QUERY_CHARS) for c in facts.unsupported_claims[:MAX_CLAIMS]),
        searched_again=tuple(collections) if searched_again else (),
    )


def needs_research(trace: Trace, issues_collection: str) -> bool:
    """Whether a verdict on `trace` may rest on the re-search, read off the rule (`walk`) with
    every judged fact unknown: a path that reaches a layer so reads no judged fact (the agent made
    no search call: `agent_skipped_retrieval`) and needs none. Every other path reads
    `retrieved_has_answer` first, and the judges establish it with the re-search in hand (the
    offline judge's word pool and its "clearly better passage elsewhere" check, the model's
    containment call shown both sets), so every fact after it may rest on the re-search too."""
    unknown = Facts(agent_searched=trace.searched, agent_searched_collections=sorted(trace.searched_collections))
    return walk(unknown, issues_collection).layer is None


#: how often a trace waiting out a search outage tries its re-search again; the breakers let one
#: probe through every 30 s and refuse the rest at once, so trying is cheap
OUTAGE_RETRY_SECONDS = 15.0


@dataclass(kw_only=True, eq=False)
class OutageWait:
    """How long a run waits, in all, for its search to come back before it lists what is left.

    The traces that need the re-search hold their place while the search is down (each tries again
    every `every` seconds), so the run pauses rather than racing through the night listing every
    trace; the wait is the run's (`seconds` in all from the first failure, never per trace), so an
    outage that outlasts it costs one wait, and SIGTERM (`stop`) ends it at once."""

    seconds: float
    stop: asyncio.Event
    every: float = OUTAGE_RETRY_SECONDS
    clock: Clock = field(default_factory=current_clock)
    #: when the wait runs out (monotonic, on `clock`); None until the first failure
    until: float | None = None
    #: turns waited, by all traces together
    waits: int = 0

    async def again(self, problem: str) -> bool:
        """Wait a turn; False (without waiting) once the run's wait is spent or SIGTERM came."""
        now = self.clock.monotonic()
        if self.until is None:
            self.until = now + self.seconds
            if self.seconds > 0:
                log.warning(
                    "search unavailable (%s): waiting up to %ds for it to come back",
                    problem,
                    round(self.seconds),
                    extra={"event": "search_waiting"},
                )
        if self.stop.is_set() or now >= self.until:
            return False
        self.waits += 1
        sleep = asyncio.ensure_future(self.clock.async_sleep(min(self.every, self.until - now)))
        stopped = asyncio.ensure_future(self.stop.wait())
        try:
            await asyncio.wait([sleep, stopped], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sleep, stopped):
                task.cancel()
        return not self.stop.is_set()


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
    #: why the search is down, where one is configured; with neither this nor `researcher` no
    #: search was configured at all (in-process callers), and facts rest on the trace alone
    search_down: str | None
    facts_out: IO[str] | None
    concurrency: int
    #: batch mode: told when each trace starts and ends (None: no one is told)
    flight: Flight | None = None
    #: how long the run waits for a search that is down (None: not at all)
    outage: OutageWait | None = None
    #: at most `concurrency` traces judged and as many searched at once, in two gates: the next
    #: traces' searches run while the judge waits on the model, so the model's slots never wait on
    #: a search (one gate around both left them a quarter idle in the nightly benchmark)
    searching: asyncio.Semaphore = field(init=False, repr=False)
    judging: asyncio.Semaphore = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.searching = asyncio.Semaphore(self.concurrency)
        self.judging = asyncio.Semaphore(self.concurrency)

    def _more(self, trace: Trace, research: list[Passage] | None) -> SearchMore | None:
        """The judge's follow-up search for this trace, where there was a re-search to follow up."""
        if research is None or self.researcher is None or self.researcher.max_more == 0:
            return None
        return functools.partial(self.researcher.more, known=research, shown=trace.passages)

    async def triage(self, trace: Trace, votes: list[Vote]) -> tuple[Entry, list[ScoreBody]] | None:
        """The entry and its scores; None when the trace is listed as undecided instead."""
        if self.flight is None:
            return await self._triage(trace, votes)
        with self.flight.flying(trace.id):
            return await self._triage(trace, votes)

    async def _triage(self, trace: Trace, votes: list[Vote]) -> tuple[Entry, list[ScoreBody]] | None:
        comment = "\n".join(comments(votes)) or None
        research: list[Passage] | None = None
        judge = self.judge if trace.searched else self.no_search_judge
        searching = self.researcher is not None or self.search_down is not None
        if searching and self.judge.needs_research and needs_research(trace, self.config.agent.issues_collection):
            found = await self._research(trace, comment)
            if isinstance(found, str):
                # never decided from less evidence than the rule reads, and never paid for: the
                # judge is not asked; the rerun (or the next night's lookback) triages it
                self.ledger.skip(votes, trace.id, "unavailable", f"search unavailable ({found})", trace.question)
                return None
            research = found.passages
        async with self.judging:
            try:
                request = JudgeRequest.of(trace, research, comment, search_more=self._more(trace, research))
                facts = await judge.judge(request)
            except JudgeRejected as ex:
                self.ledger.skip(votes, trace.id, "rejected", f"judge output rejected: {ex}", trace.question)
                return None
            except JudgeError as ex:
                self.ledger.skip(votes, trace.id, "unavailable", f"judge unavailable: {ex}", trace.question)
                return None
        if not trace.answer.strip():
            facts = empty_answer_facts(facts)
        facts = bounded(decided_by(facts, judge.name))
        path = walk(facts, self.config.agent.issues_collection)
        try:
            layer = path.decided
        except Undetermined as ex:
            why = "the judge could not establish it"
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
        scores = self.scores_for(verdict, trace, votes, sure=path.sure)
        entry = Entry.of(
            trace,
            verdict,
            comments=comments(votes),
            findings=findings(path, trace, searched_again=research is not None, collections=self.config.collections),
            score_time=scores[0].timestamp,
        )
        return entry, scores

    async def _research(self, trace: Trace, comment: str | None) -> Research | str:
        """The trace's re-search in full (every collection answered), or why not once the run's
        outage wait is spent: a collection unsearched leaves every judged fact in doubt (the
        passages it would have added could change each one), so a partial re-search is none."""
        while True:
            if self.researcher is None:
                problem = self.search_down or "no search"
            else:
                async with self.searching:
                    try:
                        found = await self.researcher.research_all(trace, comment)
                    except SearchError as ex:
                        problem = str(ex)
                    else:
                        if not found.unavailable:
                            return found
                        problem = "; ".join(f"the {c} collection: {why}" for c, why in found.unavailable.items())
            # no searcher to try again (it could not be opened): waiting cannot bring it back
            if self.researcher is None or self.outage is None or not await self.outage.again(problem):
                return problem

    def scores_for(self, verdict: Verdict, trace: Trace, votes: list[Vote], *, sure: bool) -> list[ScoreBody]:
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
            sure=sure,  # the rule's path read once, in `_triage`
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


class Flight(Protocol):
    """Told which traces are being triaged, each from its start to its verdict: batch mode's
    collector sends the calls it gathered once every trace in flight waits on it."""

    def flying(self, trace_id: str) -> AbstractContextManager[None]: ...


def comments(votes: Sequence[Vote]) -> list[str]:
    """The votes' non-empty comments, stripped."""
    return [v.comment.strip() for v in votes if v.comment and v.comment.strip()]


class Ledger:
    """Writes entries and skipped votes into `result`, with links from `traces`."""

    def __init__(self, result: RunResult, traces: TraceSource) -> None:
        self.result = result
        self.traces = traces

    def add(self, entry: Entry) -> None:
        self.result.entries.append(entry)

    def wrote(self, count: int) -> None:
        """`count` more verdicts written and read back."""
        self.result.written += count

    def skip(
        self,
        votes: Sequence[Vote],
        trace_id: str | None,
        kind: UndecidedKind,
        reason: str,
        question: str | None = None,
    ) -> None:
        self._list([v.id for v in votes], trace_id, kind, reason, question, comments(votes))

    def unreadable(self, bad: BadVote) -> None:
        """A row of the vote score that cannot be read: bad input, listed with its reason."""
        on = f" (on session {bad.session_id})" if bad.session_id else ""
        said = [bad.comment.strip()] if bad.comment and bad.comment.strip() else []
        reason = f"the vote cannot be read{on}: {bad.reason}"
        self._list([bad.id or "(no id)"], bad.trace_id, "bad_input", reason, said=said)

    def _list(
        self,
        vote_ids: list[str],
        trace_id: str | None,
        kind: UndecidedKind,
        reason: str,
        question: str | None = None,
        said: list[str] | None = None,
    ) -> None:
        # reasons often quote an outside system's error text: never let a secret through
        reason = redact(reason)
        undecided = Undecided(vote_ids=vote_ids, trace_id=trace_id, kind=kind, reason=reason)
        url = self.traces.trace_url(trace_id) if trace_id else None
        self.result.skipped.append(Skipped(undecided, shorten(question) if question else None, said or [], url))
        log.warning(
            "undecided %s: %s",
            trace_id or ",".join(undecided.vote_ids),
            reason,
            extra={"event": "undecided", "trace_id": trace_id, "kind": kind},
        )
