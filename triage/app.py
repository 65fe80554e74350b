"""The application: `Triage`, built once from the settings and the configuration, with one method per
command, each returning what the command produced. The command line parses, calls one method,
renders the result (`triage.sinks`) and exits with its code.

It assembles the parts from the settings: Langfuse when its keys are set, else the embedded store;
the MCP server when one is configured, else the embedded index; the LLM judge when a model is
configured, else the heuristic one.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from triage.calibration.calibrate import CalibrateOptions, calibrate_from, judge_measures, record_measures
from triage.calibration.queue import QueueOptions, QueueResult, VotesOptions, list_conversations, run_queue
from triage.check import CheckOptions, CheckRequest, default_run_name, run_check
from triage.domain.checks import Agent, CheckJudge, CheckResult
from triage.domain.config import AgentEndpointConfig, IndexFolder, LangfuseLimits, TriageConfig
from triage.domain.kernel import Window
from triage.domain.outcome import RunResult
from triage.domain.ports import Backend, DatasetRuns, Judge, ReleaseSource, ScoreReader, Searcher, TraceSource
from triage.domain.records import Layer, cached_input_price
from triage.domain.release_counts import Per
from triage.domain.releases import ALPHA, ReleaseWindow
from triage.domain.review import CALIBRATION_DATASET, CalibrationReport, JudgeMeasure, measure_of
from triage.domain.tracker import SignatureState, SyncResult, stored_states
from triage.domain.votes import ConversationList
from triage.domain.worklist import DatasetItem, DatasetSink, PromoteResult
from triage.engine.releases import gather_releases
from triage.engine.run import RunSetup, Sources, run_feedback
from triage.engine.stream import RunOptions
from triage.errors import ConfigError, SourceError, TriageError
from triage.judges.heuristic import HeuristicJudge
from triage.redact import logging_to_file
from triage.regression import PromoteOptions, promote_from
from triage.retry import Budget, current_clock
from triage.search.index import Index
from triage.search.local import LocalSearcher
from triage.settings import Settings, agent_environment, load_config
from triage.sinks.github import GitHubIssues
from triage.sources.export_file import vote_shift
from triage.sources.store import Store
from triage.tracker import SyncOptions, read_states, record_fixes, sync

if TYPE_CHECKING:
    from triage.calibration.evaluate import EvalJob, EvalOptions, EvalSet
    from triage.domain.review import EvalReport
    from triage.judges.model.rounds import BatchCollector

log = logging.getLogger("triage")

DEMO_DIR = Path(__file__).parent / "demo"


def demo_index_folders() -> list[IndexFolder]:
    root = DEMO_DIR / "index"
    return [IndexFolder(collection=p.name, path=p) for p in sorted(root.iterdir()) if p.is_dir()]


def default_store_path() -> Path:
    return Path.home() / ".local" / "share" / "triage" / "store.sqlite"


def demo_shift(traces_file: Path, now: datetime) -> timedelta:
    """How far to move the demo data so its newest vote lands an hour before `now`."""
    return vote_shift(traces_file, now)


def run_demo(config: TriageConfig, options: RunOptions, store_path: Path) -> RunResult:
    """The demo job (`Triage.demo`), which needs no settings: a fresh embedded store at `store_path`
    loaded with the demo data, the demo index and the heuristic judge."""
    traces_file = DEMO_DIR / "traces.jsonl"
    with Store(store_path) as store:
        store.import_file(traces_file, shift=demo_shift(traces_file, options.now))
        searcher = LocalSearcher(Index.from_folders(demo_index_folders()))
        judge = HeuristicJudge()
        setup = run_setup(options, config, measure=lambda name: judge_measure_of(store, name))
        return asyncio.run(
            run_feedback(
                sources=Sources.of(store), judge=judge, config=config, options=options, setup=setup, searcher=searcher
            )
        )


def _sync(backend: Backend, config: TriageConfig, tracker: GitHubIssues | None, options: SyncOptions) -> SyncResult:
    """`Triage.issues_sync` on one backend: the states, the judges' measures, the plan."""
    lookback = timedelta(days=config.tracker.lookback_days)
    states, bad = read_states(
        backend, config.scores.signature_state, config.review_names(), now=options.now, lookback=lookback
    )
    measures: dict[str, float | None] = {}

    def kappa_of(judge: str) -> float | None:
        if judge not in measures:
            measure = judge_measure_of(backend, judge)
            measures[judge] = measure.kappa_low if measure is not None else None
        return measures[judge]

    result = sync(
        states, config=config.tracker, kappa_of=kappa_of, tracker=tracker, trace_url=backend.trace_url,
        options=options, unreadable=bad,
    )  # fmt: skip
    result.requests = tracker.requests if tracker is not None else 0
    return result


def _window_states(history: ScoreReader, config: TriageConfig, end: datetime) -> list[SignatureState]:
    """The signatures' newest states for `triage releases` (unreadable ones are left out there)."""
    lookback = timedelta(days=config.tracker.lookback_days)
    return list(stored_states(history, config.scores.signature_state, at=end, lookback=lookback)[0].values())


def promote_window(options: PromoteOptions) -> Window:
    """`triage promote`'s window: `--since-hours` up to now, no lag (a review is read when it is made)."""
    return Window.ending(options.now, options.since_hours)


@contextmanager
def demo_store(config: TriageConfig, now: datetime) -> Iterator[Store]:
    """A temporary embedded store as `triage demo --write` leaves it (the bundled data triaged and
    written): what `releases`, `check` and `issues sync` show on embedded defaults."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "demo.sqlite"
        run_demo(config, RunOptions(since_hours=24, write=True, now=now), path)
        with Store(path) as store:
            yield store


def run_setup(
    options: RunOptions,
    config: TriageConfig,
    *,
    measure: Callable[[str], JudgeMeasure | None] | None = None,
    cached_input_price: float | None = None,
) -> RunSetup:
    """What the nightly job's engine is handed beyond its options: the night's window, made here
    once (`[window]`: its lag, overlap and lookback), and the registry's offline judge for the traces
    no search can serve."""
    from triage import judges

    window = Window.ending(
        options.now,
        options.since_hours,
        lag_minutes=config.window.lag_minutes,
        overlap_minutes=config.window.overlap_minutes,
        lookback_days=config.window.lookback_days,
    )
    offline = judges.JUDGES.build(judges.HEURISTIC, judges.JudgeSetup(config, None, None, None))
    return RunSetup(
        window=window, no_search_judge=offline, measure=measure, cached_input_price=cached_input_price
    )


@dataclass(frozen=True)
class Imported:
    """What `triage import` loaded, and into which store."""

    path: Path
    traces: int
    observations: int
    scores: int


class Triage:
    """The application: the settings and the configuration, and a method per command."""

    def __init__(self, settings: Settings, config: TriageConfig) -> None:
        self.settings = settings
        self.config = config

    # -- the nightly job ---------------------------------------------------------------------

    def feedback(self, options: RunOptions, judge: str | None = None) -> RunResult:
        """`triage feedback`: every thumbs-down in the window, through `judge` (a `--judge` spec)."""
        settings, config = self.settings, self.config
        collector, waiting = batch_collector(settings) if options.batch_mode else (None, None)
        # one budget for the run's waiting on outside systems; SIGTERM spends it at once. Batch mode
        # waits for its batches first: the budget counts from their deadline
        budget = Budget(_plus(settings.triage_retry_budget_seconds, waiting))
        chosen = make_judge(judge, settings, config, budget, batch=collector)
        if collector is not None and not collector.attached:
            log.info("--batch: judge %s makes no model call; nothing to batch", chosen.name)
            collector = None
        elif collector is not None:  # the window's traces at once (up to the cap): their calls share a round
            options = replace(options, concurrency=max(options.concurrency, collector.traces_at_once))
        with open_backend(settings, budget, limits=self.limits) as backend:
            searcher = make_searcher(settings, config, budget) if chosen.needs_research else None
            setup = run_setup(
                options,
                config,
                measure=lambda name: judge_measure_of(backend, name),
                cached_input_price=cached_input_price(settings.triage_judge_model, config.judge.input_price_per_mtok),
            )

            async def run() -> RunResult:
                try:
                    return await run_feedback(
                        sources=Sources.of(backend),
                        judge=chosen,
                        config=config,
                        options=options,
                        setup=setup,
                        searcher=searcher,
                        budget=budget,
                        flight=collector,
                        # a search down at the start is waited for too: each try a new searcher
                        reopen=lambda: make_searcher(settings, config, budget),
                    )
                finally:
                    await chosen.aclose()

            return asyncio.run(run())

    def demo(self, options: RunOptions, store: Path | None = None) -> RunResult:
        """`triage demo`: the job on a fresh embedded store (at `store`, else a temporary file)
        loaded with the demo data, the demo index and the heuristic judge."""
        if store is not None:
            return run_demo(self.config, options, store)
        with tempfile.TemporaryDirectory() as tmp:
            return run_demo(self.config, options, Path(tmp) / "demo.sqlite")

    def import_(self, file: Path, store: Path | None = None) -> Imported:
        """`triage import`: an export file into the embedded store (`store`, else TRIAGE_STORE's)."""
        path = store or self.settings.triage_store or default_store_path()
        with Store(path) as db:
            counts = db.import_file(file)
        return Imported(path, counts.traces, counts.observations, counts.scores)

    def serve_index(
        self, folders: Sequence[IndexFolder] = (), *, host: str, port: int, stdio: bool = False
    ) -> None:
        """`triage index serve`: the embedded index over `folders` (else the configuration's, else the
        demo's) as an MCP server, until interrupted."""
        from triage.search.index import serve

        built = Index.from_folders(list(folders) or self.config.index or demo_index_folders())
        where = "stdio" if stdio else f"http://{host}:{port}/mcp"
        log.info("serving %d chunks in %s on %s", built.size, ", ".join(built.collections), where)
        serve(built, self.config.tools, host=host, port=port, stdio=stdio)

    # -- review: calibration, evaluation, the annotation queue -------------------------------

    def calibrate(self, options: CalibrateOptions) -> CalibrationReport:
        """`triage calibrate`: the store is opened only when it is read, or written (`--write`:
        each judge's agreement recorded where the night reads it, `record_measures`)."""
        if not options.needs_store:
            return calibrate_from(None, self.config, options, window=Window.ending(options.now, options.since_hours))
        with open_backend(self.settings, self._budget(), reads_only=True, limits=self.limits) as backend:
            labels = Window.ending(options.now, options.since_hours)
            report = calibrate_from(backend, self.config, options, window=labels, link=backend.trace_url)
            if options.write:
                record_judge_measures(backend, judge_measures(report, options, self.config.rule_version))
            return report

    def eval(self, eval_set: EvalSet, options: EvalOptions) -> EvalReport:
        """`triage eval`: each judge through this application's `feedback`, in this process, on a
        fresh store of the set, away from every production setting (`Settings.for_evaluation`)."""
        from triage.calibration.evaluate import evaluate

        return evaluate(eval_set, self.config, options, self._eval_job)

    def _eval_job(self, job: EvalJob) -> RunResult:
        """One judge's run for `eval`: `triage feedback --write --force` on the job's store, its log
        lines into the job's log file."""
        with logging_to_file(job.log_file):
            try:
                app = Triage(self.settings.for_evaluation(job.store), load_config(job.config))
                options = RunOptions(
                    since_hours=job.since_hours,
                    now=job.now,
                    write=True,
                    force=True,
                    concurrency=job.concurrency,
                    facts_file=job.facts_file,
                )
                return app.feedback(options, job.judge)
            except TriageError as ex:
                log.error("%s", ex, extra={"event": "error", "exit_code": int(ex.exit_code)})
                raise
            except Exception as ex:  # a crash fails this judge's run alone: eval lists it and goes on
                log.exception("unexpected failure", extra={"event": "crash"})
                raise TriageError(f"unexpected failure: {type(ex).__name__}: {ex}") from ex

    def queue(self, options: QueueOptions) -> QueueResult:
        """`triage queue`. Langfuse only: the embedded store has no annotation queues, so without
        Langfuse keys this is a configuration error (exit 3)."""
        if not self.settings.uses_langfuse:
            raise ConfigError(
                "triage queue fills a Langfuse annotation queue: set LANGFUSE_PUBLIC_KEY and LANGFUSE_SECRET_KEY "
                "(the embedded store has no annotation queues)"
            )
        from triage.sources.langfuse.backend import LangfuseBackend

        with open_backend(self.settings, self._budget(), limits=self.limits) as backend:
            if not isinstance(backend, LangfuseBackend):  # cannot happen: uses_langfuse opens Langfuse
                raise ConfigError("triage queue needs Langfuse")
            annotations = backend.annotations()
            window = self.config.window
            night = Window.ending(
                options.now, options.since_hours, lag_minutes=window.lag_minutes, overlap_minutes=window.overlap_minutes
            )  # as `triage feedback` draws it, without the reach back
            result = run_queue(port=annotations, scores=backend, config=self.config, options=options, window=night)
            result.requests = backend.stats.requests
            return result

    # -- the worklist: regression cases, the review view -------------------------------------

    def promote(self, options: PromoteOptions, jsonl: Path | None = None) -> PromoteResult:
        """`triage promote`: cases read from the backend, written to its datasets (Langfuse, or the
        embedded store's dataset_items) or to a JSONL file. The cases come from the backend's
        traces: a store that does not exist holds none (a mistyped TRIAGE_STORE is named, never made)."""
        with open_backend(self.settings, self._budget(), reads_only=True, limits=self.limits) as backend:
            sink: DatasetSink
            if jsonl is not None:
                from triage.sinks.exports import DatasetFile

                sink, target = DatasetFile(jsonl), f"JSONL file {jsonl}"
            elif isinstance(backend, DatasetSink):
                sink = backend
                uses_langfuse = self.settings.uses_langfuse
                target = f"Langfuse {self.settings.langfuse_base_url}" if uses_langfuse else "the embedded store"
            else:
                raise ConfigError("this backend cannot hold datasets: use --jsonl FILE")
            return promote_from(
                backend, backend, sink, self.config, options, window=promote_window(options), target=target
            )

    def votes(self, options: VotesOptions) -> ConversationList:
        """`triage votes`: the window's conversations and their votes."""
        with open_backend(self.settings, self._budget(), reads_only=True, limits=self.limits) as backend:
            return list_conversations(
                backend, backend, self.config.scores.vote, options, Window.ending(options.now, options.since_hours)
            )

    def releases(self, options: ReleasesOptions) -> ReleaseWindow:
        """`triage releases`: each release of the window against the one before it, and the gate
        between two named ones (`engine.releases.gather_releases`). With neither Langfuse keys nor an
        embedded store (TRIAGE_STORE unset, none at the default path): the bundled demo's."""
        if self._embedded_defaults:
            return self.releases_demo(options)
        window = Window.ending(options.now, options.since_hours, lag_minutes=self.config.window.lag_minutes)
        start, end = window.start, window.end
        with open_backend(self.settings, self._budget(), reads_only=True, limits=self.limits) as backend:
            if not isinstance(backend, ReleaseSource):  # cannot happen: both backends are one
                raise ConfigError("this backend cannot count answers per release")
            states = _window_states(backend, self.config, end)
            shown = gather_releases(
                backend, backend, backend, self.config, start, end, alpha=options.alpha, per=options.per,
                gate_pair=options.gate_pair, states=states,
            )  # fmt: skip
            log.info(
                "releases: %d in the window, %d flagged; %d backend requests",
                len(shown.watch.releases),
                len(shown.watch.flagged),
                backend.stats.requests,
                extra={"event": "releases", "requests": backend.stats.requests},
            )
            return shown

    def releases_demo(self, options: ReleasesOptions) -> ReleaseWindow:
        """`triage releases` on embedded defaults: a temporary demo store as `triage demo --write`
        leaves it (two releases, the second with every retrieval failure)."""
        log.info("releases: no Langfuse keys and no embedded store: the bundled demo's releases",
                 extra={"event": "releases_demo"})  # fmt: skip
        config = load_config()  # the demo's data fits the built-in configuration
        window = Window.ending(options.now, options.since_hours, lag_minutes=config.window.lag_minutes)
        start, end = window.start, window.end
        with demo_store(config, options.now) as store:
            shown = gather_releases(
                store, store, store, config, start, end, alpha=options.alpha, per=options.per,
                gate_pair=options.gate_pair, states=_window_states(store, config, end),
            )  # fmt: skip
        return shown.model_copy(update={"counted_by": "the bundled demo's embedded store (no Langfuse keys, no store)"})

    # -- the owners' trackers -------------------------------------------------------------------

    def issues_sync(self, options: SyncOptions) -> SyncResult:
        """`triage issues sync`: each signature's newest state into its owner's GitHub issue
        (`triage.tracker`). A dry run unless `options.apply`; without a token a dry run that
        assumes no issue exists yet. With neither Langfuse keys nor an embedded store: the bundled
        demo's signatures (`triage demo --write` in a temporary store), as a dry run."""
        settings, config = self.settings, self.config
        token = settings.github_token.get_secret_value() if settings.github_token else None
        if options.apply and token is None:
            raise ConfigError("triage issues sync --apply writes to GitHub: set GITHUB_TOKEN (or TRIAGE_GITHUB_TOKEN)")
        demo = self._embedded_defaults
        if demo and options.apply:
            raise ConfigError("no Langfuse keys and no embedded store: only a dry run of the demo's signatures")
        tracker = GitHubIssues(token=token, api_url=config.tracker.api_url) if token else None
        try:
            if demo:
                log.info("issues sync: no Langfuse keys and no embedded store: the bundled demo's signatures",
                         extra={"event": "issues_demo"})  # fmt: skip
                demo_config = load_config()  # the demo's data fits the built-in configuration
                with demo_store(demo_config, options.now) as store:
                    return _sync(store, demo_config, tracker, options)
            with open_backend(settings, self._budget(), reads_only=True, limits=self.limits) as backend:
                return _sync(backend, config, tracker, options)
        finally:
            if tracker is not None:
                tracker.close()

    # -- checking a fix: the agent on its regression cases -------------------------------------

    def check(self, request: CheckRequest) -> CheckResult:
        """`triage check`: the agent on every case of the dataset (Langfuse when its keys are set,
        else the embedded store), judged, written back as a dataset run. With neither Langfuse nor an
        agent configured: the bundled demo (`check_demo`)."""
        settings, config = self.settings, self.config
        endpoint = agent_endpoint(config.agent_endpoint, request)
        if endpoint is None:
            if not settings.uses_langfuse:
                return self.check_demo(request)
            raise ConfigError(
                "triage check needs the agent to check: an [agent_endpoint] table in the configuration, "
                "or --agent-url / --agent-command"
            )
        options = check_options(config, request, target="", secrets=settings.secrets())
        budget = self._budget()
        with open_backend(settings, budget, reads_only=True, limits=self.limits) as backend:
            if not isinstance(backend, DatasetSink) or not isinstance(backend, DatasetRuns):
                raise ConfigError("this backend holds no datasets")  # cannot happen: both do
            target = f"Langfuse {settings.langfuse_base_url}" if settings.uses_langfuse else "the embedded store"
            items = backend.dataset_items(options.dataset)
            # the agent's trace is read by id where it may be: Langfuse (waiting for it to arrive), or
            # the embedded store, which holds it already or never will (no wait)
            traces: TraceSource = backend
            if not settings.uses_langfuse:
                options = replace(options, trace_wait=0.0)
            judge = make_check_judge(request.judge, settings, config, budget)
            from triage.sources.agents import make_agent

            agent = make_agent(
                endpoint,
                tools=config.tools,
                timeout=request.timeout or config.check.timeout_seconds,
                attempts=config.check.attempts,
                env=agent_environment(endpoint.env),
            )
            result = _run_check(items, agent, judge, backend, replace(options, target=target), config, traces, budget)
            if request.release is None:
                return result
            marked = record_fixes(
                backend, backend, result, release=request.release, state_name=config.scores.signature_state,
                lookback=timedelta(days=config.tracker.lookback_days), at=request.now,
            )  # fmt: skip
            return result.model_copy(update={"release": request.release, "fixed": marked})

    def check_demo(self, request: CheckRequest) -> CheckResult:
        """`triage check` on embedded defaults: a temporary demo store as `triage demo --write` leaves
        it, its triaged traces promoted to regression cases (every layer), and the demo agent
        (`triage.search.agent.DemoAgent`) over the demo index."""
        from triage.search.agent import DemoAgent

        config = load_config()  # the demo's data fits the built-in configuration
        config = config.model_copy(update={"check": self.config.check})
        options = check_options(
            config, request, target="the demo's embedded store (temporary)", secrets=self.settings.secrets()
        )
        # the bundled demo shows the check: no gate on the share the offline judge leaves undecided
        # unless asked (a first run has no earlier pass to lose, so nothing else exits 8)
        options = replace(options, max_unchecked=request.max_unchecked)
        log.info(
            "check: no Langfuse keys and no agent configured: checking the bundled demo's regression cases "
            "with the demo agent",
            extra={"event": "check_demo"},
        )
        with demo_store(config, request.now) as store:
            layers = tuple(layer.value for layer in Layer)
            cases = PromoteOptions(dataset=options.dataset, layers=layers, now=request.now)
            promote_from(
                store, store, store, config, cases, window=promote_window(cases), target="the demo's embedded store"
            )
            agent = DemoAgent(Index.from_folders(demo_index_folders()), config.tools)
            judge = make_check_judge(request.judge, self.settings, config, self._budget())
            return _run_check(store.dataset_items(options.dataset), agent, judge, store, options, config, None)

    # -- the feedback service ----------------------------------------------------------------

    def relay(self, *, host: str, port: int, outbox: Path | None = None) -> None:
        """`triage relay`: the sink (Langfuse when its keys are set, else the embedded store), the
        ledger (a SQLite file beside the store, or PostgreSQL shared by replicas), the checks that
        refuse to start (exit 3), then serve until SIGTERM."""
        from triage.relay.access import SessionKeys
        from triage.relay.api import Credentials
        from triage.relay.outbox import LangfuseSink, Sink, StoreSink
        from triage.relay.server import check_startup, relay_running, serve

        settings, config = self.settings, self.config
        sessions = None
        if settings.triage_relay_session_keys:
            sessions = SessionKeys(
                settings.triage_relay_session_keys,
                issuer=settings.triage_relay_session_issuer,
                audience=settings.triage_relay_session_audience,
                leeway=settings.triage_relay_session_leeway_seconds,
            )
        credentials = Credentials(
            gateway_token=settings.triage_relay_token.get_secret_value() if settings.triage_relay_token else None,
            signing_key=settings.triage_relay_signing_key.get_secret_value()
            if settings.triage_relay_signing_key
            else None,
            sessions=sessions,
        )
        check_startup(config, credentials, host)
        store_path = settings.triage_store or default_store_path()
        ledger: Path | str = outbox or settings.triage_relay_outbox or store_path.parent / "relay.sqlite"
        if settings.triage_relay_database_url is not None:
            # PostgreSQL: the ledger any number of replicas share. Their sink must be one they can share
            # too: the embedded store is a file on one machine, so only Langfuse
            if not settings.uses_langfuse:
                raise ConfigError(
                    "TRIAGE_RELAY_DATABASE_URL (a ledger shared by replicas) needs Langfuse as the sink "
                    "(LANGFUSE_PUBLIC_KEY and LANGFUSE_SECRET_KEY): the embedded store is one file on one "
                    "machine, so replicas cannot share it. For one relay on the embedded store, unset "
                    "TRIAGE_RELAY_DATABASE_URL (its ledger is then the SQLite file TRIAGE_RELAY_OUTBOX)"
                )
            if outbox is not None or settings.triage_relay_outbox is not None:
                raise ConfigError(
                    "both TRIAGE_RELAY_DATABASE_URL and a SQLite ledger (--outbox or TRIAGE_RELAY_OUTBOX) are "
                    "set: the relay keeps one ledger, give one of them"
                )
            ledger = settings.triage_relay_database_url.get_secret_value()
        sink: Sink
        if settings.uses_langfuse:
            access = _langfuse_access(settings)
            from triage.domain.ports import SourceStats
            from triage.sources.langfuse.http import LANGFUSE_RETRY, LangfuseHttp

            http = LangfuseHttp(
                **access,
                limits=self.limits,  # the outbox's deliveries keep to the budget too
                retry=LANGFUSE_RETRY.with_(attempts=1),  # the outbox is the retry
                stats=SourceStats(),
            )
            sink = LangfuseSink(http, model=config.relay)
        else:
            store = Store(store_path, create_folder=settings.triage_store is None)
            store.check_writable()
            sink = StoreSink(store)
        try:
            grace = settings.triage_relay_shutdown_seconds
            with relay_running(config, sink, ledger, credentials, drain_seconds=grace) as app:
                serve(app, host, port, grace_seconds=grace)
        finally:
            sink.close()

    @property
    def limits(self) -> LangfuseLimits:
        """The request budget every Langfuse request of this process keeps to (`[langfuse]`)."""
        return self.config.langfuse.limits()

    @property
    def _embedded_defaults(self) -> bool:
        """Neither Langfuse keys nor an embedded store (TRIAGE_STORE unset, none at the default
        path): the commands that read results show the bundled demo's."""
        settings = self.settings
        return not settings.uses_langfuse and settings.triage_store is None and not default_store_path().exists()

    def _budget(self) -> Budget:
        return Budget(self.settings.triage_retry_budget_seconds)


# -- the parts, chosen by the settings ---------------------------------------------------------


@dataclass(frozen=True)
class ReleasesOptions:
    """`triage releases`: the window, the test's level and denominator, the gate's two releases."""

    since_hours: float = 24.0 * 7
    candidate: str | None = None
    baseline: str | None = None
    alpha: float = ALPHA
    per: Per = "answers"
    now: datetime = field(default_factory=lambda: datetime.now(UTC))

    @property
    def gate_pair(self) -> tuple[str, str] | None:
        return (self.candidate, self.baseline) if self.candidate and self.baseline else None


def judge_measure_of(backend: object, judge: str) -> JudgeMeasure | None:
    """The last `triage calibrate --write` measurement of `judge` in the backend's datasets; None
    (unmeasured) when there is none, or when it cannot be read (logged: the report still goes out)."""
    if not isinstance(backend, DatasetSink):
        return None
    try:
        return measure_of(backend.dataset_items(CALIBRATION_DATASET), judge)
    except SourceError as ex:
        log.warning("the judge's calibration could not be read: %s", ex, extra={"event": "calibration_unavailable"})
        return None


def record_judge_measures(backend: object, measures: Sequence[JudgeMeasure]) -> None:
    """`triage calibrate --write`: each judge's measurement into the backend's datasets."""
    if not isinstance(backend, DatasetSink):
        raise ConfigError("this backend cannot hold datasets, so --write has nowhere to record the agreement")
    if not measures:
        log.warning("nothing recorded: no layer label was compared with a decision that names its judge",
                    extra={"event": "calibration_not_recorded"})  # fmt: skip
        return
    outcome = record_measures(backend, measures)
    if outcome.failed:
        raise SourceError(f"the calibration was not recorded: {next(iter(outcome.failed.values()))}")
    for measure in measures:
        log.info(
            "recorded for the night: judge %s, layer kappa %s on %d labels (dataset %s)",
            measure.judge,
            "undefined" if measure.kappa is None else f"{measure.kappa:.2f}",
            measure.labels,
            CALIBRATION_DATASET,
            extra={"event": "calibration_recorded", "judge": measure.judge},
        )


class _LangfuseAccess(TypedDict):
    """Where Langfuse is and how to sign in: the same settings for the job's backend and the relay's sink."""

    public_key: str
    secret_key: str
    base_url: str
    timeout: float


def _langfuse_access(settings: Settings) -> _LangfuseAccess:
    """Both Langfuse keys (or the configuration error that names the missing one, exit 3), its
    address and time-out."""
    if not settings.langfuse_public_key or not settings.langfuse_secret_key:
        missing = "LANGFUSE_SECRET_KEY" if settings.langfuse_public_key else "LANGFUSE_PUBLIC_KEY"
        raise ConfigError(f"Langfuse needs both keys: set {missing} (or unset the other to use the embedded store)")
    return _LangfuseAccess(
        public_key=settings.langfuse_public_key,
        secret_key=settings.langfuse_secret_key.get_secret_value(),
        base_url=settings.langfuse_base_url,
        timeout=settings.langfuse_timeout,
    )


@contextmanager
def open_backend(
    settings: Settings,
    budget: Budget | None = None,
    *,
    reads_only: bool = False,
    limits: LangfuseLimits | None = None,
) -> Iterator[Backend]:
    """Langfuse, or the embedded store. `reads_only`: a command that writes nothing never creates a
    store, so a mistyped TRIAGE_STORE is a configuration error naming it, not an empty store.
    `limits`: the request budget every Langfuse request keeps to (`[langfuse]`)."""
    if settings.uses_langfuse:
        access = _langfuse_access(settings)
        from triage.sources.langfuse.backend import LangfuseBackend

        with LangfuseBackend(
            **access,
            deadline_seconds=settings.triage_langfuse_deadline_seconds,
            confirm_wait_seconds=settings.triage_confirm_wait_seconds,
            budget=budget,
            vote_lookback=timedelta(days=settings.triage_vote_lookback_days),
            limits=limits,
        ) as backend:
            yield backend
        return
    # the default location may be new on this machine; a folder named in TRIAGE_STORE must exist
    path = settings.triage_store or default_store_path()
    with Store(path, create_folder=settings.triage_store is None, create=not reads_only) as store:
        yield store


def make_searcher(
    settings: Settings, config: TriageConfig, budget: Budget | None = None
) -> AbstractAsyncContextManager[Searcher]:
    if settings.triage_mcp_url or settings.triage_mcp_command:
        from triage.search.mcp_client import MCP_RETRY, McpSearcher

        return McpSearcher(
            url=settings.triage_mcp_url,
            command=shlex.split(settings.triage_mcp_command) if settings.triage_mcp_command else None,
            token=settings.triage_mcp_token.get_secret_value() if settings.triage_mcp_token else None,
            tools=config.tools,
            retry=MCP_RETRY.with_(budget=budget),
        )
    return LocalSearcher(Index.from_folders(config.index or demo_index_folders()))


def make_judge(
    spec: str | None,
    settings: Settings,
    config: TriageConfig,
    budget: Budget | None = None,
    batch: BatchCollector | None = None,
) -> Judge:
    """The judge `spec` names in the registry (`triage.judges.JUDGES`); by default the model judge
    when a model is configured. `batch`: a model judge asks its calls through this collector
    (`--batch`)."""
    from triage import judges

    api_key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else None
    setup = judges.JudgeSetup(
        config=config,
        model=settings.triage_judge_model,
        base_url=settings.openai_base_url,
        api_key=api_key,
        budget=budget,
        batch=batch,
    )
    return judges.JUDGES.build(spec, setup)


def batch_collector(settings: Settings) -> tuple[BatchCollector, float]:
    """`--batch`: the collector of the run's model calls, its rounds polled until
    TRIAGE_BATCH_DEADLINE_SECONDS from now; and that many seconds."""
    from triage.judges.model.rounds import BatchCollector

    seconds = settings.triage_batch_deadline_seconds
    return BatchCollector(deadline=current_clock().now() + timedelta(seconds=seconds)), seconds


def _plus(seconds: float | None, more: float | None) -> float | None:
    return None if seconds is None else seconds + (more or 0.0)


# -- triage check's parts ------------------------------------------------------------------------


def agent_endpoint(configured: AgentEndpointConfig | None, request: CheckRequest) -> AgentEndpointConfig | None:
    """The agent to check: `[agent_endpoint]`, with `--agent-url` or `--agent-command` over it; None
    when neither says one. A problem in it is a configuration error (exit 3)."""
    endpoint = configured
    if request.agent_command:
        try:
            argv = shlex.split(request.agent_command)
        except ValueError as ex:
            raise ConfigError(f"--agent-command cannot be read: {ex}") from None
        base = endpoint if endpoint is not None and endpoint.kind == "command" else AgentEndpointConfig(kind="command")
        endpoint = base.model_copy(update={"command": argv})
    elif request.agent_url:
        base = endpoint if endpoint is not None and endpoint.kind != "command" else AgentEndpointConfig()
        endpoint = base.model_copy(update={"url": request.agent_url})
    if endpoint is None:
        return None
    problems = endpoint.problems()
    if problems:
        raise ConfigError("; ".join(problems))
    return endpoint


def check_options(
    config: TriageConfig, request: CheckRequest, *, target: str, secrets: Sequence[str] = ()
) -> CheckOptions:
    """The run's options: the command line's, else `[check]`'s; `secrets` (the settings') are masked
    in every result the check writes."""
    defaults = config.check
    return CheckOptions(
        dataset=request.dataset or defaults.dataset,
        run_name=request.run_name or default_run_name(request.now),
        now=request.now,
        concurrency=request.concurrency or defaults.concurrency,
        min_pass=request.min_pass if request.min_pass is not None else defaults.min_pass,
        max_unchecked=request.max_unchecked if request.max_unchecked is not None else defaults.max_unchecked,
        trace_wait=defaults.trace_wait_seconds,
        target=target,
        secrets=tuple(secrets),
    )


def make_check_judge(
    name: str | None, settings: Settings, config: TriageConfig, budget: Budget | None = None
) -> CheckJudge:
    """The check judge `name` names in `triage.judges.CHECK_JUDGES`; by default the family's model
    judge when a model is configured, else its offline one."""
    from triage import judges

    api_key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else None
    setup = judges.JudgeSetup(
        config=config, model=settings.triage_judge_model, base_url=settings.openai_base_url, api_key=api_key,
        budget=budget,
    )  # fmt: skip
    return judges.CHECK_JUDGES.build(name, setup)


def _run_check(
    items: dict[str, DatasetItem],
    agent: Agent,
    judge: CheckJudge,
    runs: DatasetRuns,
    options: CheckOptions,
    config: TriageConfig,
    traces: TraceSource | None,
    budget: Budget | None = None,
) -> CheckResult:
    async def run() -> CheckResult:
        try:
            return await run_check(
                items, agent=agent, judge=judge, runs=runs, options=options, tools=config.tools, traces=traces,
                budget=budget,
            )  # fmt: skip
        finally:
            await agent.aclose()
            await judge.aclose()

    return asyncio.run(run())
