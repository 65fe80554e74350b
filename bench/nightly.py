"""Benchmark the nightly run against its ideal and against Langfuse's `run_batched_evaluation`.

    python bench/nightly.py [--sizes 200,1000,5000] [--judge llm,cascade] [--batch] [--batch-seconds 30]
                            [--judge-latency 0.4] [--langfuse-latency 0.03] [--rpm N] [--concurrency 16]
                            [--batched default,equal|none] [--markdown FILE] [--json FILE]
                            [--profile DIR] [--from-json FILE]

On 127.0.0.1 it starts the Langfuse stand-in (tests/doubles/langfuse_server.py, per-request latency and an
optional requests-per-minute limit), `triage index serve` over ../shared/corpus (docs + code) as
the MCP search server, and the OpenAI-compatible judge stand-in (tests/doubles/openai_server.py, a fixed
latency per call, valid replies: bench/_judge.py). Per N it loads N thumbs-down traces
(bench/_traces.py), runs `triage feedback --write --judge JUDGE` as a subprocess for each `--judge`,
then again (the rerun), then the same job written with `Langfuse.run_batched_evaluation`
(bench/_batched.py) at its defaults and at equal concurrency. With `--batch` each judge also runs as
`triage feedback --batch` against the Batch API stand-in (tests/doubles/batch_server.py: a batch is
done `--batch-seconds` after it is made), for its wall time and its cost at batch prices. Both judge
stand-ins cache prompts as OpenAI does (the cached-token share). It prints the results, the costs
and whether each target holds. See bench/README.md ("Nightly run").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _judge import BenchModel, Stats  # noqa: E402
from _traces import TraceFactory, corpus_missing  # noqa: E402

from tests.doubles.batch_server import BatchServer  # noqa: E402
from tests.doubles.langfuse_server import LangfuseStandIn  # noqa: E402
from tests.doubles.openai_server import OpenAIServer  # noqa: E402
from triage.settings import load_config  # noqa: E402

DEFAULT_CORPUS = ROOT.parent / "shared" / "corpus"
MODEL = "bench-judge"
BATCH_SIZE = 100  # RunOptions.batch_size: traces read and scores written per request

# targets (issue 7)
TARGET_IDEAL_RATIO = 1.2
TARGET_REQUESTS_PER_TRACE = 0.2
TARGET_RSS_MB = 300.0
TARGET_RSS_GROWTH = 0.2  # "flat": at most 20% more from the smallest to the largest N
TARGET_RERUN_SHARE = 0.10
# targets (issue 30): less CPU per trace
TARGET_LLM_RATIO = 1.15


@dataclass
class Proc:
    """One subprocess run: wall time start to exit, exit code, peak RSS (its own VmHWM)."""

    wall: float
    code: int
    rss_mb: float
    stdout: str
    stderr: str
    cpu: float  # user + system seconds of the process
    #: the child's ru_maxrss, for reference only: Linux carries the spawning process's peak RSS
    #: into the child across the vfork + exec, so at large N it is this benchmark's own RSS
    maxrss_mb: float = 0.0


def peak_rss_mb(pid: int) -> float | None:
    """The process's own peak RSS so far (VmHWM of its address space; reset at exec), in MB."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except (OSError, ValueError):
        return None
    return None


@dataclass
class TriageRun:
    wall: float
    code: int
    rss_mb: float
    cpu: float
    core_seconds: float | None  # the job's own "time" summary line (run_feedback, without start-up)
    langfuse_requests: int
    langfuse_by_path: dict[str, int]
    throttled: int  # 429 answers
    judge_calls: int
    judge_tokens: int
    triaged: int  # traces with both triage scores in the stand-in after the run
    standin_cpu: float  # CPU the benchmark process (the stand-ins) spent during the run
    mcp_cpu: float  # CPU the MCP search server spent during the run
    summary: list[str] = field(default_factory=list)
    maxrss_mb: float = 0.0  # ru_maxrss (see Proc): not triage's own peak
    #: the run's --summary-file: judge calls and tokens as triage counted them, cached input
    #: tokens, calls answered in batches, the cost direct and as billed
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass
class BatchedRun:
    setting: str
    concurrency: int
    fetch_batch_size: int
    wall: float
    code: int
    rss_mb: float
    cpu: float
    langfuse_requests: int
    langfuse_by_path: dict[str, int]
    throttled: int
    judge_calls: int
    scores_landed: int
    result: dict[str, Any]
    standin_cpu: float
    maxrss_mb: float = 0.0  # ru_maxrss (see Proc): not the job's own peak


@dataclass
class SizeResult:
    n: int
    ideal: float
    judge_floor: float
    rate_floor: float
    first: TriageRun
    rerun: TriageRun
    batched: list[BatchedRun]
    judge: str = "llm"
    #: the same night with `triage feedback --batch` (`--batch`), against the Batch API stand-in
    batch_mode: TriageRun | None = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_process(cmd: list[str], env: dict[str, str], timeout: float, own_peak: bool = True) -> Proc:
    """Run to exit; stdout/stderr go to files (no pipe to fill up); rusage of this child only.

    Peak RSS: the child's own VmHWM (`own_peak`), else ru_maxrss (a wrapper such as py-spy runs
    the measured process as its child, whose peak only ru_maxrss covers)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.monotonic()
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=ROOT)
        deadline = started + timeout
        peak: float | None = None
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            # VmHWM only rises, so the last reading before exit is the peak (within 10 ms); read it
            # here, not ru_maxrss, which also holds this process's RSS at the time of the spawn
            if own_peak:
                peak = peak_rss_mb(proc.pid) or peak
            if time.monotonic() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.01)
        wall = time.monotonic() - started
        proc.returncode = os.waitstatus_to_exitcode(status)  # so Popen does not wait again
        out.seek(0)
        err.seek(0)
        return Proc(
            wall=wall,
            code=proc.returncode,
            rss_mb=peak if peak is not None else usage.ru_maxrss / 1024,  # ru_maxrss: KiB on Linux
            stdout=out.read(),
            stderr=err.read(),
            cpu=usage.ru_utime + usage.ru_stime,
            maxrss_mb=usage.ru_maxrss / 1024,
        )


class McpServer:
    """`triage index serve` over the corpus, as a subprocess."""

    def __init__(self, corpus: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self._log = tempfile.TemporaryFile("w+")
        cmd = [
            sys.executable,
            "-m",
            "triage",
            "index",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--folder",
            f"docs={corpus / 'kubeflow-docs'}",
            "--folder",
            f"code={corpus / 'katib-examples'}",
        ]
        self.proc = subprocess.Popen(cmd, env=_base_env(), stdout=self._log, stderr=self._log, cwd=ROOT)

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._log.seek(0)
                raise SystemExit(
                    f"`triage index serve` exited with {self.proc.returncode}:\n{self._log.read()}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise SystemExit("`triage index serve` did not start listening within 60 s")

    def cpu(self) -> float:
        """User + system CPU seconds the server has used so far (Linux /proc)."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def _base_env() -> dict[str, str]:
    """This environment without any triage/Langfuse/OpenAI setting (the benchmark sets its own)."""
    drop = ("TRIAGE_", "LANGFUSE_", "OPENAI_", "JOB_COMPLETION_INDEX")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def _env(langfuse: LangfuseStandIn, judge: OpenAIServer, mcp_url: str, store: Path) -> dict[str, str]:
    return {
        **_base_env(),
        "LANGFUSE_PUBLIC_KEY": langfuse.public_key,
        "LANGFUSE_SECRET_KEY": langfuse.secret_key,
        "LANGFUSE_BASE_URL": langfuse.url,
        "OPENAI_BASE_URL": judge.url + "/v1",
        "OPENAI_API_KEY": "sk-bench",
        "TRIAGE_JUDGE_MODEL": MODEL,
        "TRIAGE_MCP_URL": mcp_url,
        "TRIAGE_STORE": str(store),  # never the user's
        "PYTHONUNBUFFERED": "1",
    }


def _requests(langfuse: LangfuseStandIn) -> tuple[int, dict[str, int], int]:
    log = langfuse.requests()
    by_path = Counter(f"{r.method} {r.path}" for r in log)
    return len(log), dict(by_path), sum(1 for r in log if r.status == 429)


def _summary(stderr: str) -> tuple[list[str], float | None]:
    lines, core = [], None
    for raw in stderr.splitlines():
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        if entry.get("event") == "summary":
            text = str(entry.get("message", "")).removeprefix("summary: ")
            lines.append(text)
            if text.startswith("time "):
                core = float(text.removeprefix("time ").rstrip("s"))
    return lines, core


def _triaged(langfuse: LangfuseStandIn, layer: str, component: str) -> int:
    rows = langfuse.score_rows(include_pending=True)
    names: dict[str, set[str]] = {}
    for row in rows:
        if row["name"] in (layer, component) and row.get("traceId"):
            names.setdefault(row["traceId"], set()).add(row["name"])
    return sum(1 for found in names.values() if len(found) == 2)


LOGS: Path | None = None
PROFILE: Path | None = None  # --profile: run triage under py-spy, collapsed stacks here
TRIAGE = [sys.executable, "-m", "triage"]  # --triage-cmd: another build or entry point


def _keep(name: str, proc: Proc) -> None:
    if LOGS is not None:
        LOGS.mkdir(parents=True, exist_ok=True)
        (LOGS / f"{name}.log").write_text(proc.stderr + proc.stdout, encoding="utf-8")


def run_triage(
    langfuse: LangfuseStandIn,
    mcp: McpServer,
    model: BenchModel,
    env: dict[str, str],
    concurrency: int,
    timeout: float,
    log_name: str,
    judge: str = "llm",
    batch: bool = False,
) -> TriageRun:
    config = load_config(None)
    langfuse.reset_log()
    before = model.stats.snapshot()
    cpu_before = time.process_time()
    mcp_before = mcp.cpu()
    figures_file = Path(tempfile.mkdtemp()) / "summary.json"
    cmd = [
        *TRIAGE,
        "feedback",
        "--since-hours",
        "24",
        "--write",
        "--judge",
        judge,
        "--concurrency",
        str(concurrency),
        "--log-format",
        "json",
        "--summary-file",
        str(figures_file),
        *(["--batch"] if batch else []),
    ]
    if PROFILE is not None:
        PROFILE.mkdir(parents=True, exist_ok=True)
        spy = [str(Path(sys.executable).with_name("py-spy")), "record", "--format", "raw", "--rate", "200"]
        cmd = [*spy, "--output", str(PROFILE / f"{log_name}.txt"), "--", *cmd]
        # the search server's stacks over the same run: it shares the two cores with triage
        server_spy = subprocess.Popen(
            [*spy, "--output", str(PROFILE / f"{log_name}.search-server.txt"), "--pid", str(mcp.proc.pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    proc = run_process(cmd, env, timeout, own_peak=PROFILE is None)
    if PROFILE is not None:
        server_spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        server_spy.wait(timeout=60)
    standin_cpu = time.process_time() - cpu_before
    mcp_cpu = mcp.cpu() - mcp_before
    _keep(log_name, proc)
    used: Stats = model.stats.minus(before)
    count, by_path, throttled = _requests(langfuse)
    lines, core = _summary(proc.stderr)
    figures = json.loads(figures_file.read_text()) if figures_file.exists() else {}
    if proc.code not in (0,):
        tail = "\n".join(proc.stderr.splitlines()[-15:])
        print(f"  triage exited {proc.code}; last log lines:\n{tail}", file=sys.stderr)
    return TriageRun(
        wall=proc.wall,
        code=proc.code,
        rss_mb=proc.rss_mb,
        cpu=proc.cpu,
        core_seconds=core,
        langfuse_requests=count,
        langfuse_by_path=by_path,
        throttled=throttled,
        judge_calls=used.total_calls,
        judge_tokens=used.prompt_tokens + used.completion_tokens,
        triaged=_triaged(langfuse, config.scores.layer, config.scores.component),
        standin_cpu=standin_cpu,
        mcp_cpu=mcp_cpu,
        summary=lines,
        maxrss_mb=proc.maxrss_mb,
        figures=figures,
    )


def run_batched(
    langfuse: LangfuseStandIn,
    model: BenchModel,
    env: dict[str, str],
    setting: str,
    concurrency: int,
    fetch_batch_size: int,
    timeout: float,
    log_name: str,
) -> BatchedRun:
    langfuse.reset_log()
    before = model.stats.snapshot()
    landed_before = sum(
        1 for r in langfuse.score_rows(include_pending=True) if r["name"] == "batch_triage_layer"
    )
    cpu_before = time.process_time()
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "_batched.py"),
        "--concurrency",
        str(concurrency),
        "--fetch-batch-size",
        str(fetch_batch_size),
    ]
    proc = run_process(cmd, env, timeout)
    standin_cpu = time.process_time() - cpu_before
    _keep(log_name, proc)
    used = model.stats.minus(before)
    count, by_path, throttled = _requests(langfuse)
    landed = sum(1 for r in langfuse.score_rows(include_pending=True) if r["name"] == "batch_triage_layer")
    result: dict[str, Any] = {}
    for line in reversed(proc.stdout.splitlines()):
        try:
            result = json.loads(line)
            break
        except ValueError:
            continue
    if proc.code != 0:
        tail = "\n".join((proc.stderr + proc.stdout).splitlines()[-15:])
        print(f"  run_batched_evaluation job exited {proc.code}:\n{tail}", file=sys.stderr)
    return BatchedRun(
        setting=setting,
        concurrency=concurrency,
        fetch_batch_size=fetch_batch_size,
        wall=proc.wall,
        code=proc.code,
        rss_mb=proc.rss_mb,
        cpu=proc.cpu,
        langfuse_requests=count,
        langfuse_by_path=by_path,
        throttled=throttled,
        judge_calls=used.total_calls,
        scores_landed=landed - landed_before,
        result=result,
        standin_cpu=standin_cpu,
        maxrss_mb=proc.maxrss_mb,
    )


def floors(
    judge_calls: int, judge_latency: float, judge_concurrency: int, requests: int, rpm: int | None
) -> tuple[float, float, float]:
    """(ideal, judge floor, rate-limit floor): the run cannot beat the slower of the two floors."""
    judge_floor = judge_calls * judge_latency / judge_concurrency
    rate_floor = requests * 60.0 / rpm if rpm else 0.0
    return max(judge_floor, rate_floor), judge_floor, rate_floor


def bench_size(
    n: int,
    factory: TraceFactory,
    judge: OpenAIServer,
    model: BenchModel,
    mcp: McpServer,
    args: argparse.Namespace,
    store: Path,
    judge_name: str = "llm",
    batch_server: BatchServer | None = None,
) -> SizeResult:
    now = datetime.now(UTC)
    judge_concurrency = load_config(None).judge.concurrency
    timeout = max(600.0, n * 2.0)

    def standin() -> LangfuseStandIn:
        return LangfuseStandIn(
            records=list(factory.records(n, now)),
            latency=args.langfuse_latency,
            rate_limit_per_minute=args.rpm,
            record_bodies=False,
        )

    name = f"{judge_name}-{n}"
    with standin() as langfuse:
        env = _env(langfuse, judge, mcp.url, store)
        print(f"N={n}: triage feedback --judge {judge_name} ...", file=sys.stderr)
        first = run_triage(
            langfuse, mcp, model, env, args.concurrency, timeout, f"triage-{name}", judge=judge_name
        )
        print(f"  {first.wall:.1f} s, {first.judge_calls} judge calls, exit {first.code}", file=sys.stderr)
        judge.requests.clear()  # the server's own request record: not needed, and it grows
        print(f"N={n}: rerun ...", file=sys.stderr)
        rerun = run_triage(langfuse, mcp, model, env, args.concurrency, timeout, f"rerun-{name}", judge=judge_name)
        print(f"  {rerun.wall:.1f} s, {rerun.judge_calls} judge calls, exit {rerun.code}", file=sys.stderr)
        batched = []
        settings = {"default": (5, 50), "equal": (args.concurrency, 50)}
        # the same job in Langfuse's SDK makes one call a trace whatever the judge: run it once a size
        for setting in args.batched if judge_name == args.judges[0] else []:
            concurrency, page = settings[setting]
            print(
                f"N={n}: run_batched_evaluation ({setting}: concurrency {concurrency}) ...", file=sys.stderr
            )
            run = run_batched(
                langfuse, model, env, setting, concurrency, page, timeout, f"batched-{setting}-{n}"
            )
            judge.requests.clear()
            print(f"  {run.wall:.1f} s, {run.judge_calls} judge calls, exit {run.code}", file=sys.stderr)
            batched.append(run)
    batch_mode = None
    if batch_server is not None:
        with standin() as langfuse:  # a fresh night: nothing triaged yet
            env = {**_env(langfuse, judge, mcp.url, store.with_name("batch-" + store.name))}
            env["OPENAI_BASE_URL"] = batch_server.url + "/v1"
            print(f"N={n}: triage feedback --judge {judge_name} --batch ...", file=sys.stderr)
            batch_mode = run_triage(
                langfuse, mcp, model, env, args.concurrency, timeout, f"batch-{name}", judge=judge_name, batch=True
            )
            batch_server.files.clear()  # the stand-in's copies of the night's requests: not needed
            batch_server.batches.clear()
            print(
                f"  {batch_mode.wall:.1f} s, {batch_mode.judge_calls} judge calls, exit {batch_mode.code}",
                file=sys.stderr,
            )
    ideal, judge_floor, rate_floor = floors(
        first.judge_calls,
        args.judge_latency,
        judge_concurrency,
        first.langfuse_requests - first.throttled,
        args.rpm,
    )
    return SizeResult(n, ideal, judge_floor, rate_floor, first, rerun, batched, judge_name, batch_mode)


# --------------------------------------------------------------------------------------- report


def _f(value: float, digits: int = 1) -> str:
    return f"{value:.{digits}f}"


def tables(results: list[SizeResult], args: argparse.Namespace) -> str:
    out = [
        "| N | judge | wall s | ideal s | wall / ideal | Langfuse req / trace | judge calls / trace | tokens / trace "
        "| peak RSS MB | rerun s | rerun judge calls | triaged | exit |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        t = max(r.first.triaged, 1)
        out.append(
            f"| {r.n} | {r.judge} | {_f(r.first.wall)} | {_f(r.ideal)} "
            f"| {_f(r.first.wall / r.ideal, 2) if r.ideal else '-'} "
            f"| {_f(r.first.langfuse_requests / t, 3)} | {_f(r.first.judge_calls / t, 2)} "
            f"| {r.first.judge_tokens / t:.0f} | {_f(r.first.rss_mb, 0)} | {_f(r.rerun.wall)} "
            f"| {r.rerun.judge_calls} | {r.first.triaged}/{r.n} | {r.first.code}/{r.rerun.code} |"
        )
    out += ["", *cpu_table(results), "", *cost_table(results)]
    if any(r.batched for r in results):
        out += [
            "",
            "| N | run_batched_evaluation | wall s | vs its ideal | Langfuse req | judge calls | scores landed "
            "| peak RSS MB | triage wall / this | triage req / this |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in results:
            for b in r.batched:
                its_ideal = b.judge_calls * args.judge_latency / b.concurrency
                request_ratio = r.first.langfuse_requests / max(b.langfuse_requests, 1)
                out.append(
                    f"| {r.n} | {b.setting} (concurrency {b.concurrency}, pages of {b.fetch_batch_size}) "
                    f"| {_f(b.wall)} | {_f(b.wall / its_ideal, 2) if its_ideal else '-'} "
                    f"| {b.langfuse_requests} | {b.judge_calls} | {b.scores_landed}/{r.n} | {_f(b.rss_mb, 0)} "
                    f"| {_f(r.first.wall / b.wall, 2)} | {_f(request_ratio, 2)} |"
                )
    return "\n".join(out)


def cpu_table(results: list[SizeResult]) -> list[str]:
    """Where each run's CPU went, per triaged trace: triage's own process, the MCP search server
    (`triage index serve`, in production the agent's own), and the stand-ins in this process; with
    the searches a trace made. Two cores share all three, so a CPU-bound run shows here first."""
    out = [
        "| N | judge | mode | wall s | triage CPU ms / trace | search server CPU ms / trace | searches / trace "
        "| search server CPU ms / search | stand-ins CPU ms / trace |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r, mode, run in _runs(results):
        triaged = max(int(run.figures.get("triaged", 0)) or run.triaged, 1)
        searches = int(run.figures.get("search_calls", 0))
        per_search = f"{1000 * run.mcp_cpu / searches:.2f}" if searches else "-"
        out.append(
            f"| {r.n} | {r.judge} | {mode} | {_f(run.wall)} | {1000 * run.cpu / triaged:.1f} "
            f"| {1000 * run.mcp_cpu / triaged:.1f} | {searches / triaged:.2f} | {per_search} "
            f"| {1000 * run.standin_cpu / triaged:.1f} |"
        )
    return out


def _runs(results: list[SizeResult]) -> Iterator[tuple[SizeResult, str, TriageRun]]:
    """Each size's first run, and its `--batch` run where there was one, with the mode's name."""
    for r in results:
        for mode, run in (("direct", r.first), ("--batch", r.batch_mode)):
            if run is not None:
                yield r, mode, run


def cost_table(results: list[SizeResult]) -> list[str]:
    """Each run's model calls as triage counted them and what they cost: at the direct price, and as
    billed (batch-answered calls at the batch price, cached input tokens at the cached price), at the
    configured prices ([judge], gpt-4o-mini's by default) and at $3 / $15 a M tokens (a large model,
    cached input at 0.1x: ../shared/notes/cost.md), per 1,000 traces."""
    out = [
        "| N | judge | mode | wall s | calls / trace | input tokens / trace | cached share | in batches "
        "| $ direct | $ billed | $ / 1000 traces at $3/$15, direct | billed | exit |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r, mode, run in _runs(results):
        f = run.figures
        triaged = max(int(f.get("triaged", 0)), 1)
        calls, tokens_in = int(f.get("judge_calls", 0)), int(f.get("input_tokens", 0))
        cached, batched = int(f.get("cached_input_tokens", 0)), int(f.get("batch_calls", 0))
        large = _large_model_cost(f)
        out.append(
            f"| {r.n} | {r.judge} | {mode} | {_f(run.wall)} | {_f(calls / triaged, 2)} "
            f"| {tokens_in / triaged:.0f} | {cached / max(tokens_in, 1):.0%} | {batched / max(calls, 1):.0%} "
            f"| {f.get('cost_usd', 0):.4f} | {f.get('cost_usd_billed', 0):.4f} "
            f"| {large[0] * 1000 / triaged:.2f} | {large[1] * 1000 / triaged:.2f} | {run.code} |"
        )
    return out


def _large_model_cost(figures: dict[str, Any]) -> tuple[float, float]:
    """(direct, billed) in US dollars at $3 / $15 per M tokens, cached input at $0.30."""
    from triage.domain.records import Usage

    usage = Usage(**{name: int(figures.get(key, 0)) for name, key in _USAGE.items()})
    return (usage.input_tokens * 3.0 + usage.output_tokens * 15.0) / 1e6, usage.cost(3.0, 15.0, 0.30)


#: `Usage` fields as the summary file names them
_USAGE = {
    "calls": "judge_calls",
    "input_tokens": "input_tokens",
    "output_tokens": "output_tokens",
    "cached_input_tokens": "cached_input_tokens",
    "batch_calls": "batch_calls",
    "batch_input_tokens": "batch_input_tokens",
    "batch_cached_input_tokens": "batch_cached_input_tokens",
    "batch_output_tokens": "batch_output_tokens",
}


def targets(results: list[SizeResult]) -> list[tuple[str, bool | None, str]]:
    """(target, holds (None: not measured), figures), on the first judge's runs."""
    results = [r for r in results if r.judge == results[0].judge] if results else results
    by_n = {r.n: r for r in results}
    checks: list[tuple[str, bool | None, str]] = []
    r1000 = by_n.get(1000)
    if r1000:
        ratio = r1000.first.wall / r1000.ideal
        checks.append(
            (
                f"wall time within {TARGET_IDEAL_RATIO}x the ideal at N=1000",
                ratio <= TARGET_IDEAL_RATIO,
                f"{ratio:.2f}x ({r1000.first.wall:.1f} s vs {r1000.ideal:.1f} s)",
            )
        )
    else:
        checks.append((f"wall time within {TARGET_IDEAL_RATIO}x the ideal at N=1000", None, "N=1000 not run"))
    per_trace = {r.n: r.first.langfuse_requests / max(r.first.triaged, 1) for r in results}
    checks.append(
        (
            f"at most {TARGET_REQUESTS_PER_TRACE} Langfuse requests per triaged trace",
            all(v <= TARGET_REQUESTS_PER_TRACE for v in per_trace.values()),
            ", ".join(f"N={n}: {v:.3f}" for n, v in per_trace.items()),
        )
    )
    r5000 = by_n.get(5000)
    checks.append(
        (
            f"peak RSS under {TARGET_RSS_MB:.0f} MB at N=5000",
            (r5000.first.rss_mb < TARGET_RSS_MB) if r5000 else None,
            f"{r5000.first.rss_mb:.0f} MB" if r5000 else "N=5000 not run",
        )
    )
    beyond = sorted((r for r in results if r.n > BATCH_SIZE), key=lambda r: r.n)
    if len(beyond) >= 2:
        low, high = beyond[0], beyond[-1]
        growth = high.first.rss_mb / low.first.rss_mb - 1
        slope = (high.first.rss_mb - low.first.rss_mb) / (high.n - low.n) * 1000
        checks.append(
            (
                f"peak RSS flat in N beyond the batch size (at most {TARGET_RSS_GROWTH:.0%} growth)",
                growth <= TARGET_RSS_GROWTH,
                f"{low.first.rss_mb:.0f} MB at N={low.n} -> {high.first.rss_mb:.0f} MB at N={high.n} "
                f"({growth:+.0%}, {slope:.1f} MB per 1000 traces)",
            )
        )
    else:
        checks.append(
            ("peak RSS flat in N beyond the batch size", None, "needs two sizes above the batch size")
        )
    checks.append(
        (
            f"rerun makes no judge call and takes under {TARGET_RERUN_SHARE:.0%} of the first run",
            all(
                r.rerun.judge_calls == 0 and r.rerun.wall < TARGET_RERUN_SHARE * r.first.wall for r in results
            ),
            ", ".join(
                f"N={r.n}: {r.rerun.judge_calls} calls, {r.rerun.wall / r.first.wall:.1%}" for r in results
            ),
        )
    )
    equal = [(r, b) for r in results for b in r.batched if b.setting == "equal"]
    if equal:
        checks.append(
            (
                "faster than run_batched_evaluation at equal concurrency, with fewer requests",
                all(
                    r.first.wall < b.wall and r.first.langfuse_requests < b.langfuse_requests
                    for r, b in equal
                ),
                ", ".join(
                    f"N={r.n}: wall {r.first.wall / b.wall:.2f}x, requests {r.first.langfuse_requests}"
                    f" vs {b.langfuse_requests}"
                    for r, b in equal
                ),
            )
        )
    else:
        checks.append(("faster than run_batched_evaluation at equal concurrency", None, "not run"))
    return checks


def cpu_targets(results: list[SizeResult]) -> list[tuple[str, bool | None, str]]:
    """Issue 30's: the `llm` run within 1.15x its ideal at N=1000 and N=5000; the cascade sooner
    than the `llm` run and than `run_batched_evaluation` at equal concurrency, at each N."""
    by = {(r.judge, r.n): r for r in results}
    checks: list[tuple[str, bool | None, str]] = []
    for n in (1000, 5000):
        r = by.get(("llm", n))
        name = f"`--judge llm` within {TARGET_LLM_RATIO}x its ideal at N={n}"
        if r is None or not r.ideal:
            checks.append((name, None, f"N={n} llm not run"))
            continue
        ratio = r.first.wall / r.ideal
        checks.append((name, ratio <= TARGET_LLM_RATIO, f"{ratio:.2f}x ({r.first.wall:.1f} s vs {r.ideal:.1f} s)"))
    sizes = sorted({r.n for r in results if r.judge == "cascade"})
    pairs = [(by[("cascade", n)], by.get(("llm", n))) for n in sizes]
    shown = [(c, m) for c, m in pairs if m is not None]
    checks.append(
        (
            "`--judge cascade` finishes sooner than `--judge llm`",
            all(c.first.wall < m.first.wall for c, m in shown) if shown else None,
            ", ".join(f"N={c.n}: {c.first.wall:.1f} s vs {m.first.wall:.1f} s" for c, m in shown) or "not run",
        )
    )
    anchors = [
        (by[("cascade", n)], b)
        for n in sizes
        for r in results
        if r.n == n
        for b in r.batched
        if b.setting == "equal"
    ]
    checks.append(
        (
            "`--judge cascade` finishes sooner than run_batched_evaluation at equal concurrency",
            all(c.first.wall < b.wall for c, b in anchors) if anchors else None,
            ", ".join(f"N={c.n}: {c.first.wall:.1f} s vs {b.wall:.1f} s" for c, b in anchors) or "not run",
        )
    )
    return checks


def machine() -> str:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, {platform.system()}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="200,1000,5000", help="comma-separated N (default 200,1000,5000)")
    parser.add_argument("--judge-latency", type=float, default=0.4, help="seconds per judge call (0.4)")
    parser.add_argument("--langfuse-latency", type=float, default=0.03, help="seconds per Langfuse request")
    parser.add_argument("--rpm", type=int, default=None, help="Langfuse requests-per-minute limit (none)")
    parser.add_argument("--concurrency", type=int, default=16, help="triage --concurrency (16)")
    parser.add_argument("--judge", default="llm", help="comma-separated judges: llm, cascade (default llm)")
    parser.add_argument(
        "--batch", action="store_true", help="also run each judge as `triage feedback --batch` (Batch API stand-in)"
    )
    parser.add_argument(
        "--batch-seconds",
        type=float,
        default=30.0,
        help="the Batch API stand-in finishes a batch this long after it is made (30)",
    )
    parser.add_argument(
        "--batched", default="default,equal", help="run_batched_evaluation settings: default,equal or none"
    )
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--markdown", type=Path, help="also write the tables and targets here")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    parser.add_argument("--logs", type=Path, help="keep each run's log (stderr) in this folder")
    parser.add_argument(
        "--triage-cmd", help="the command that runs triage (default: this Python's -m triage)", default=None
    )
    parser.add_argument(
        "--profile", type=Path, help="run triage under py-spy; collapsed stacks in this folder"
    )
    parser.add_argument(
        "--from-json", type=Path, help="run nothing: print the tables and targets of a run saved with --json"
    )
    args = parser.parse_args(argv)
    if args.from_json:
        return rerender(args.from_json)
    args.batched = [] if args.batched == "none" else [s for s in args.batched.split(",") if s]
    if set(args.batched) - {"default", "equal"}:
        parser.error("--batched takes default, equal (comma-separated) or none")
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    args.judges = [j.strip() for j in args.judge.split(",") if j.strip()]
    if not args.judges or set(args.judges) - {"llm", "cascade"}:
        parser.error("--judge takes llm, cascade (comma-separated)")
    global LOGS, PROFILE, TRIAGE
    LOGS, PROFILE = args.logs, args.profile
    if args.triage_cmd:
        TRIAGE = shlex.split(args.triage_cmd)

    problem = corpus_missing(args.corpus)
    if problem:
        print(f"cannot benchmark: {problem} (the corpus ships in ../shared/corpus)", file=sys.stderr)
        return 2

    started = datetime.now(UTC)
    factory = TraceFactory(args.corpus, seed=args.seed)
    mcp = McpServer(args.corpus)
    model = BenchModel()
    results: list[SizeResult] = []
    try:
        mcp.wait_ready()
        with (
            OpenAIServer(latency=args.judge_latency, responder=model, prompt_cache=True) as judge,
            BatchServer(responder=model, seconds_to_complete=args.batch_seconds, prompt_cache=True) as batches,
            tempfile.TemporaryDirectory() as tmp,
        ):
            for n in sizes:
                for name in args.judges:
                    results.append(
                        bench_size(
                            n,
                            factory,
                            judge,
                            model,
                            mcp,
                            args,
                            Path(tmp) / "store.sqlite",
                            name,
                            batches if args.batch else None,
                        )
                    )
    finally:
        mcp.stop()

    header = (
        f"{started:%Y-%m-%d %H:%M} UTC on {machine()}; judge stand-in {args.judge_latency * 1000:.0f} ms per call, "
        f"Langfuse stand-in {args.langfuse_latency * 1000:.0f} ms per request"
        + (f", {args.rpm} requests/minute" if args.rpm else "")
        + f"; triage --concurrency {args.concurrency}, judge concurrency {load_config(None).judge.concurrency}"
        + (f"; Batch API stand-in: a batch done {args.batch_seconds:.0f} s after it is made" if args.batch else "")
    )
    text = tables(results, args)
    checks = targets(results) + cpu_targets(results)
    lines = [header, "", text, "", "Targets:"]
    for name, holds, figures in checks:
        mark = "PASS" if holds else "n/a " if holds is None else "FAIL"
        lines.append(f"- {mark} {name}: {figures}")
    report = "\n".join(lines)
    print(report)
    if args.markdown:
        args.markdown.write_text(report + "\n", encoding="utf-8")
    if args.json:
        payload = {
            "started": started.isoformat(),
            "machine": machine(),
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "results": [asdict(r) for r in results],
            "targets": [{"target": n, "holds": h, "figures": f} for n, h, f in checks],
        }
        args.json.write_text(json.dumps(payload, indent=2, default=str), encoding="utf-8")
    return 0


def rerender(path: Path) -> int:
    """The tables and targets of a saved run, as it printed them (and the CPU table and targets
    of a run saved before they existed)."""
    saved = json.loads(path.read_text(encoding="utf-8"))

    def run(data: dict[str, Any] | None) -> TriageRun | None:
        return TriageRun(**data) if data else None

    results = []
    for r in saved["results"]:
        first, rerun = run(r["first"]), run(r["rerun"])
        assert first is not None and rerun is not None
        results.append(
            SizeResult(
                r["n"], r["ideal"], r["judge_floor"], r["rate_floor"], first, rerun,
                [BatchedRun(**b) for b in r["batched"]], r.get("judge", "llm"), run(r.get("batch_mode")),
            )
        )  # fmt: skip
    args = argparse.Namespace(**saved["args"])
    print(f"{saved['started'][:16]} UTC on {saved['machine']} (from {path})\n")
    print(tables(results, args))
    print("\nTargets:")
    for name, holds, figures in targets(results) + cpu_targets(results):
        mark = "PASS" if holds else "n/a " if holds is None else "FAIL"
        print(f"- {mark} {name}: {figures}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
