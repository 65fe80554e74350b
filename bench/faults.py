"""Fault benchmark of `triage relay`: real relay processes under load while things break.

    python bench/faults.py [--scenario NAME ...] [--json FILE] [--quick]
                           [--seconds 20] [--voters 16] [--relay-src DIR] [--keep] [--strict]

Each scenario starts the relay as its own process (`python -m triage relay`, as bench/relay.py
does; `--relay-src DIR` runs it from another source tree, e.g. a `git archive` of an older commit),
puts 16 closed-loop voters on it (bench/relay.py's mix: nine actions in ten a vote up or down,
else a verdict replaced whole, on 400 answers, each voter its own author) for `--seconds` (20;
`--quick`: 3, and the first eight scenarios only, about a minute in all), breaks something, waits
for the relay's outbox to drain (its `/readyz`: at most 45 s, or 10 s without shrinking unless
operations are waiting out a back-off after the sink's faults), stops it (SIGTERM, SIGKILL after
10 s) and reads the final stored state: the embedded store's file, or the Langfuse stand-in's
physical rows. Everything is on 127.0.0.1; every request, wait and command has a time limit; the
relays, the stand-in and the mounts are undone at the end (try/finally, atexit, SIGTERM).

- `kill9`: into the embedded store; the relay is killed with SIGKILL three times and restarted
  on the same files and port; voters retry after connection errors.
- `langfuse_down`, `langfuse_500`, `langfuse_429`, `langfuse_slow`, `langfuse_drop`: into the
  Langfuse stand-in (tests/doubles/langfuse_server.py, in this process), which is stopped for the
  middle third of the run, or answers 500 to 30% of requests, 429 with `Retry-After: 1` to 30%,
  every request after 2-5 s, or does the work of 30% and then drops the connection unanswered.
  Faults stop with the load; then the outbox drains.
- `disk_full`: into the stand-in, the relay's ledger and outbox on a filesystem of their own
  (`--fs-mb`, 1 GiB like the relay's volume in cronjob.yaml: tmpfs, else a loop-mounted ext4
  image; the scenario is skipped, saying why, when neither can be mounted), filled by a filler
  file for the middle third of the run, then freed. `disk_full_store`: the same into the embedded
  store (the store itself on the ordinary disk).
- `hostile`, `hostile_store`: the voters, plus hostile requests on connections of their own
  (huge and odd `turn`s, lone UTF-16 surrogates, over-long notes, DEL, C1 and bidi characters in
  ids, deeply nested JSON), each of which should get a 4xx; and a colliding pair (reviewer `ana`
  on trace `t:user`, end user `ana` on trace `t`) whose scores must all survive, each once with
  its own author.

Counted per scenario (the voters' requests; hostile ones in a table of their own):

- sent: requests that reached a connection (a refused connect is not sent; a retry is sent
  again); 2xx: acknowledged; refused: answered otherwise, by status (429, 502 and 503 are
  retried as a client would); no answer: time-out (10 s) or connection dropped.
- per (answer, author, score name), the final stored value against the last acknowledged write
  of it: **lost** (it set a value; nothing is stored), **wrong** (something else is stored: an
  older value, a value no write acknowledged, a score the last acknowledged verdict cleared),
  **in doubt** (what is stored is the value of a write that got no answer, sent after the last
  acknowledged one: the relay may have taken it; not wrong), **dup** (more than one stored row:
  two rows of one score id, which the stand-in keeps, as Langfuse does, when an id comes again
  with another timestamp; or two ids).
- max ms: the slowest voter request, answered or timed out; outbox left: undelivered operations
  when the drain wait ended (bold: not drained); disk MiB: the largest the SQLite files (store,
  ledger, their write-ahead logs) were during the run.

A clean relay shows 0 lost, 0 dup, 0 wrong, every hostile request answered 4xx, no request
without an answer but those a fault explains, and a drained outbox. Findings (these, writes the
relay's /metrics counts as written around its ledger, operations claimed by a delivery and never
settled, a SIGTERM that did not stop it) are listed after the tables; `--strict` exits 1 when
there is one. See bench/README.md, "Feedback relay under faults".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _faults_env as env  # noqa: E402
import _faults_load as load  # noqa: E402
import relay as relay_bench  # noqa: E402  (bench/relay.py)

ROOT = env.ROOT


@dataclass(frozen=True)
class Scenario:
    name: str
    target: str  # "store" | "langfuse"
    about: str
    kills: int = 0
    outage: bool = False
    mode: str | None = None  # the stand-in's misbehaviour
    share: float = 0.0
    small_fs: bool = False
    hostile: bool = False


SCENARIOS = {
    s.name: s
    for s in [
        Scenario("kill9", "store", "SIGKILL x3, restarted on the same files", kills=3),
        Scenario("langfuse_down", "langfuse", "stand-in stopped for the middle third", outage=True),
        Scenario("langfuse_500", "langfuse", "stand-in answers 500 to 30%", mode="500", share=0.3),
        Scenario(
            "langfuse_429", "langfuse", "stand-in answers 429 (Retry-After: 1) to 30%", mode="429", share=0.3
        ),
        Scenario("langfuse_slow", "langfuse", "stand-in answers after 2-5 s", mode="slow", share=1.0),
        Scenario(
            "langfuse_drop", "langfuse", "stand-in works, then drops 30% unanswered", mode="drop", share=0.3
        ),
        Scenario(
            "disk_full", "langfuse", "ledger/outbox filesystem full for the middle third", small_fs=True
        ),
        Scenario("disk_full_store", "store", "ledger filesystem full for the middle third", small_fs=True),
        Scenario("hostile", "langfuse", "hostile requests beside the voters", hostile=True),
        Scenario("hostile_store", "store", "hostile requests beside the voters", hostile=True),
    ]
}


#: run by default only without --quick (the smoke run keeps the scenarios of the brief)
SLOW_ONLY = ("disk_full_store", "hostile_store")


@dataclass(frozen=True)
class Budget:
    seconds: float
    timeout: float  # a voter's request
    hostile_timeout: float
    grace: float  # voters retry this long after the run
    drain_limit: float
    drain_stall: float  # give up when the outbox has not shrunk for this long
    stop_grace: float  # SIGTERM to SIGKILL
    hostile_every: float


FULL = Budget(20, 10, 5, 5, 45, 10, 10, 0.15)
QUICK = Budget(3, 3, 2, 2, 20, 4, 6, 0.1)


# --------------------------------------------------------------------------- one scenario


def run_scenario(scenario: Scenario, budget: Budget, args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"scenario": scenario.name, "into": scenario.target, "about": scenario.about}
    workdir = Path(tempfile.mkdtemp(prefix=f"faults-{scenario.name}-"))
    fs: env.SmallFilesystem | None = None
    standin: env.FaultyStandIn | None = None
    relay: env.RelayProcess | None = None
    seconds = budget.seconds + (2 if scenario.kills and budget.seconds < 8 else 0)
    events: list[str] = []
    try:
        data = workdir
        if scenario.small_fs:
            fs = env.SmallFilesystem(workdir / "small", args.fs_mb)
            reason = fs.mount()
            if reason is not None:
                result["skipped"] = f"no small filesystem could be mounted: {reason}"
                return result
            result["filesystem"] = fs.method
            events.append(f"ledger on {fs.method}")
            data = fs.path
        store = workdir / "store.sqlite"  # the small filesystem holds the ledger and outbox alone
        extra = {"TRIAGE_STORE": str(store)}
        if scenario.target == "langfuse":
            standin = env.FaultyStandIn(seed=args.seed)
            standin.start()
            extra.update(standin.env)
        port = relay_bench.free_port()
        relay = env.RelayProcess(
            workdir=workdir,
            env=env.clean_env(extra),
            port=port,
            outbox=data / "relay.sqlite",
            src=args.relay_src,
        )
        relay.start()
        driver = load.Load(
            port=port,
            voters=args.voters,
            seconds=seconds,
            timeout=budget.timeout,
            grace=budget.grace,
            seed=args.seed,
            hostile=scenario.hostile,
            hostile_timeout=budget.hostile_timeout,
            hostile_every=budget.hostile_every,
        )
        chaos = make_chaos(scenario, seconds, relay, standin, fs, events, result, sorted({data, workdir}))
        elapsed = asyncio.run(driver.run(chaos))
        # the faults end with the load: what is left is the outbox's to deliver
        if standin is not None:
            standin.misbehave(None)
            if not standin.running:
                standin.start()
        if fs is not None:
            fs.free()
        result["seconds"] = round(elapsed, 1)
        result["events"] = events
        patient = bool(scenario.mode or scenario.outage)  # backing off after faults is not stuck
        result["drain"] = wait_drained(relay, budget, data / "relay.sqlite", patient)
        if not result["drain"]["drained"]:
            result["drain"].update(stranded(data / "relay.sqlite", min(3.0, budget.drain_stall / 2)))
        metrics = relay.get("/metrics")
        series = env.relay_metrics(metrics.text) if metrics is not None and metrics.status_code == 200 else {}
        result["outcomes"] = {
            name.split('"')[1]: int(value)
            for name, value in series.items()
            if name.startswith("relay_outcomes_total{")
        }
        stop_s, killed, code = relay.stop(budget.stop_grace)
        result["shutdown"] = {"seconds": round(stop_s, 1), "killed": killed, "exit": code}
        rows = read_rows(store if scenario.target == "store" else None, standin)
        result["rows"] = len(rows)
        judgement = load.judge(driver.writes, rows)
        result["voters"] = driver.normal.summary()
        result["writes"] = dict(Counter(w.outcome for w in driver.writes))
        result["judgement"] = {k: v for k, v in vars(judgement).items() if k != "examples"}
        result["examples"] = dict(judgement.examples)
        if scenario.hostile:
            result["hostile"] = {name: t.summary() for name, t in driver.hostile_traffic.items()}
            result["hostile_rows"] = len(load.hostile_rows(rows))
            result["collision"] = load.judge_collision(rows, driver.collision_writes)
            result["collision"]["requests"] = {n: t.summary() for n, t in driver.collision_traffic.items()}
        if standin is not None:
            result["langfuse"] = {
                "injected": dict(standin.injected),
                "answers": dict(sorted(standin.status_counts().items())),
            }
        result["relay_log"] = dict(relay.log_problems().most_common(15))
        result["relay_starts"] = relay.starts
    except Exception as ex:  # the benchmark reports and goes on to the next scenario
        result["error"] = f"{type(ex).__name__}: {ex}"
        if relay is not None:
            result["relay_log_tail"] = relay.log_tail()
    finally:
        if relay is not None:
            relay.stop(budget.stop_grace)
        if standin is not None:
            standin.stop()
        if fs is not None:
            fs.unmount()
        if args.keep:
            result["workdir"] = str(workdir)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return result


def make_chaos(
    scenario: Scenario,
    seconds: float,
    relay: env.RelayProcess,
    standin: env.FaultyStandIn | None,
    fs: env.SmallFilesystem | None,
    events: list[str],
    result: dict[str, Any],
    folders: list[Path],
) -> Callable[[float], Coroutine[Any, Any, None]]:
    """The scenario's faults, run beside the voters (blocking steps in a thread), and a sampler of
    the SQLite files' sizes in `folders` (the store, the ledger, their write-ahead logs)."""

    async def at(started: float, share: float) -> None:
        await asyncio.sleep(max(0.0, started + seconds * share - time.monotonic()))

    def stamp(started: float, text: str) -> None:
        events.append(f"{time.monotonic() - started:5.1f}s {text}")

    async def sample(started: float) -> None:
        peak: dict[str, int] = {}
        top = 0
        while time.monotonic() < started + seconds + 1:
            sizes: dict[str, int] = {}
            for folder in folders:
                for file in folder.glob("*.sqlite*"):
                    with contextlib.suppress(OSError):
                        sizes[file.name] = file.stat().st_size
            for name, size in sizes.items():
                peak[name] = max(peak.get(name, 0), size)
            top = max(top, sum(sizes.values()))
            result["disk_peak_mib"] = round(top / 2**20, 1)
            result["disk_peak_files_mib"] = {n: round(b / 2**20, 1) for n, b in sorted(peak.items())}
            await asyncio.sleep(0.25)

    async def chaos(started: float) -> None:
        await asyncio.gather(faults(started), sample(started))

    async def faults(started: float) -> None:
        if scenario.kills:
            down = []
            for n in range(scenario.kills):
                await at(started, 0.2 + 0.5 * n / max(1, scenario.kills - 1))
                killed_at = time.monotonic()
                await asyncio.to_thread(relay.kill9)
                stamp(started, "relay killed (SIGKILL)")
                try:
                    await asyncio.to_thread(relay.start)
                except env.RelayStartError as ex:
                    stamp(started, f"restart failed: {ex}")
                    raise
                down.append(time.monotonic() - killed_at)
                stamp(started, f"relay restarted ({down[-1]:.2f} s down)")
            result["down_s"] = round(sum(down), 2)
        if standin is not None and scenario.mode:
            standin.misbehave(scenario.mode, scenario.share)
            stamp(started, f"stand-in: {scenario.mode} for {scenario.share:.0%} of requests")
        if standin is not None and scenario.outage:
            await at(started, 1 / 3)
            await asyncio.to_thread(standin.stop)
            stamp(started, "stand-in stopped")
            await at(started, 2 / 3)
            await asyncio.to_thread(standin.start)
            stamp(started, "stand-in started")
        if fs is not None:
            await at(started, 1 / 3)
            before = fs.free_bytes()
            written = await asyncio.to_thread(fs.fill)
            stamp(
                started, f"filesystem filled ({before // 1024} KiB were free, {written // 1024} KiB written)"
            )
            await at(started, 2 / 3)
            await asyncio.to_thread(fs.free)
            stamp(started, f"filesystem freed ({fs.free_bytes() // 1024} KiB free)")

    return chaos


def wait_drained(relay: env.RelayProcess, budget: Budget, outbox: Path, patient: bool) -> dict[str, Any]:
    """Until /readyz says the outbox is empty, at most `drain_limit` seconds, or until it has not
    shrunk for `drain_stall` seconds; `patient`: beyond that while operations wait for their next
    attempt (the relay's back-off after the sink's faults reaches 30 s)."""
    started = time.monotonic()
    best: int | None = None
    progress = started
    body: dict[str, Any] = {}
    while True:
        answer = relay.get("/readyz", timeout=3)
        pending: int | None = None
        if answer is not None:
            try:
                body = answer.json()
                pending = int(body["outbox"]["pending"])
            except (ValueError, KeyError, TypeError):
                pending = None
        now = time.monotonic()
        if pending == 0:
            return {
                "drained": True,
                "seconds": round(now - started, 1),
                "pending": 0,
                "set_aside": body.get("outbox", {}).get("set_aside", 0),
            }
        if pending is not None and (best is None or pending < best):
            best, progress = pending, now
        stalled = now - progress > budget.drain_stall and not (patient and backing_off(outbox))
        if now - started > budget.drain_limit or stalled:
            return {
                "drained": False,
                "seconds": round(now - started, 1),
                "pending": pending,
                "set_aside": (body.get("outbox") or {}).get("set_aside"),
                "last_error": (body.get("delivery") or {}).get("last_error"),
                "readyz": "no answer" if answer is None else answer.status_code,
            }
        time.sleep(0.2)


Outboxed = tuple[int, int, int, str | None, float]  # claimed, dead, attempts, error, next attempt at


def outbox_rows(path: Path) -> dict[int, Outboxed] | None:
    """The relay's outbox, read beside it (WAL): seq -> (claimed, dead, attempts, error, next_at)."""
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=2)
        try:
            rows = db.execute("SELECT seq, claimed, dead, attempts, error, next_at FROM outbox").fetchall()
        finally:
            db.close()
    except sqlite3.Error:
        return None  # another schema, or not readable: say nothing
    return {r[0]: (r[1], r[2], r[3], r[4], float(r[5] or 0)) for r in rows}


def backing_off(path: Path) -> bool:
    """Some undelivered operation waits for its next attempt (the relay's clock is the epoch)."""
    rows = outbox_rows(path)
    return rows is not None and any(not c and not d and at > time.time() for c, d, _, _, at in rows.values())


def stranded(path: Path, wait: float = 3.0) -> dict[str, Any]:
    """Operations claimed by a delivery that never settled: claimed now and still `wait` seconds later
    (the faults are over, a delivery takes well under that), with what the rest of the outbox holds."""
    before = outbox_rows(path)
    time.sleep(wait)
    after = outbox_rows(path)
    if before is None or after is None:
        return {}
    claimed = [s for s, row in after.items() if row[0] and not row[1] and before.get(s, (0,))[0]]
    waiting = [row for row in after.values() if not row[0] and not row[1]]
    errors = Counter((row[3] or "")[:160] for row in waiting if row[3])
    return {
        "stranded": len(claimed),
        "waiting": len(waiting),
        "waiting_max_attempts": max((row[2] for row in waiting), default=0),
        "waiting_errors": dict(errors.most_common(3)),
    }


def read_rows(store: Path | None, standin: env.FaultyStandIn | None) -> list[load.StoredRow]:
    if standin is not None:
        return load.standin_rows(standin.score_rows())
    assert store is not None
    if not store.exists():
        return []
    db = sqlite3.connect(store, timeout=10)
    db.row_factory = sqlite3.Row
    try:
        return load.store_rows(dict(r) for r in db.execute("SELECT * FROM scores"))
    finally:
        db.close()


# --------------------------------------------------------------------------- reporting


def _statuses(counts: dict[str, int]) -> str:
    return ", ".join(f"{s}×{n:,}" for s, n in counts.items()) or "-"


def table(results: list[dict[str, Any]]) -> list[str]:
    columns = [
        "scenario",
        "into",
        "sent",
        "2xx",
        "refused",
        "no answer",
        "lost",
        "dup",
        "wrong",
        "in doubt",
        "max ms",
        "outbox left",
        "disk MiB",
    ]
    lines = ["| " + " | ".join(columns) + " |", "|---|---|" + "---:|" * (len(columns) - 2)]
    for r in results:
        if "voters" not in r:
            why = r.get("skipped") or r.get("error") or "?"
            lines.append(
                f"| {r['scenario']} | {r['into']} | "
                + " | ".join(["-"] * (len(columns) - 3))
                + f" | {'skipped' if 'skipped' in r else 'error'}: {why[:100]} |"
            )
            continue
        v, j, d = r["voters"], r["judgement"], r["drain"]
        no_answer = sum(v["no_answer"].values())
        left = d["pending"] if d["pending"] is not None else "?"
        cells = [
            r["scenario"],
            r["into"],
            f"{v['sent']:,}",
            f"{v['acknowledged']:,}",
            _statuses(v["refused"]),
            f"{no_answer:,}",
            j["lost"],
            j["duplicated"],
            j["wrong"],
            j["in_doubt"],
            f"{v['max_ms']:,.0f}",
            left if d["drained"] else f"**{left}**",
            r.get("disk_peak_mib", "?"),
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return lines


def hostile_table(results: list[dict[str, Any]]) -> list[str]:
    lines: list[str] = []
    for r in results:
        if "hostile" not in r:
            continue
        lines += [
            f"hostile requests, {r['scenario']} (into {r['into']}):",
            "",
            "| request | sent | answers | no answer | max ms | 4xx only |",
            "|---|---:|---|---:|---:|---|",
        ]
        for name, t in r["hostile"].items():
            refused = t["refused"]
            answers = {**({"2xx": t["acknowledged"]} if t["acknowledged"] else {}), **refused}
            no_answer = sum(t["no_answer"].values())
            only_4xx = (
                t["sent"] > 0
                and not no_answer
                and not t["acknowledged"]
                and all(400 <= int(s) < 500 for s in refused)
            )
            lines.append(
                f"| {name} | {t['sent']} | {_statuses(answers)} | {no_answer} | {t['max_ms']:,.0f} | "
                f"{'yes' if only_4xx else '**no**'} |"
            )
        collision = r["collision"]
        lines += [
            "",
            f"colliding pair (reviewer ana on t:user, end user ana on t): "
            f"{'both kept' if collision['ok'] else 'FAILED: ' + '; '.join(collision['problems'][:4])}",
            f"rows stored by hostile requests: {r['hostile_rows']}",
            "",
        ]
    return lines


def findings(r: dict[str, Any], budget: Budget) -> list[str]:
    """What a clean relay would not show."""
    if "voters" not in r:
        return [r["error"]] if "error" in r else []
    out = []
    v, j, d = r["voters"], r["judgement"], r["drain"]
    for kind in ("lost", "duplicated", "wrong"):
        if j[kind]:
            examples = "; ".join(r["examples"].get(kind, [])[:2])
            out.append(f"{j[kind]} {kind} (e.g. {examples})")
    if v["no_answer"].get("timeout"):
        out.append(
            f"{v['no_answer']['timeout']} voter requests got no answer within {budget.timeout:.0f} s (hung)"
        )
    if v["no_answer"].get("dropped") and r["scenario"] != "kill9":
        out.append(f"{v['no_answer']['dropped']} voter requests dropped without an answer")
    for status, n in v["refused"].items():
        if int(status) >= 500 and not (status in ("502", "503") and r["scenario"].startswith("disk_full")):
            out.append(f"{n} voter requests answered {status}")
    if d.get("stranded"):
        out.append(
            f"{d['stranded']} outbox operations claimed by a delivery and never settled (stuck until a restart)"
        )
    if not d["drained"]:
        out.append(
            f"outbox not drained: {d['pending']} left after {d['seconds']} s"
            + (f" (last error: {d.get('last_error')})" if d.get("last_error") else "")
        )
    if d.get("set_aside"):
        out.append(f"{d['set_aside']} operations set aside")
    if r.get("outcomes", {}).get("direct"):
        out.append(f"{r['outcomes']['direct']} writes acknowledged around the ledger (outcome direct)")
    if r["shutdown"]["killed"]:
        out.append(f"SIGTERM did not stop the relay within {budget.stop_grace:.0f} s (killed)")
    for name, t in r.get("hostile", {}).items():
        bad = {s: n for s, n in t["refused"].items() if not 400 <= int(s) < 500}
        if t["acknowledged"]:
            bad["2xx"] = t["acknowledged"]
        if sum(t["no_answer"].values()):
            bad["no answer"] = sum(t["no_answer"].values())
        if bad:
            out.append(f"hostile {name}: {_statuses(bad)}")
    if "collision" in r and not r["collision"]["ok"]:
        out.append("colliding pair: " + "; ".join(r["collision"]["problems"][:3]))
    if r.get("hostile_rows"):
        out.append(f"{r['hostile_rows']} rows stored by hostile requests")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--scenario",
        nargs="+",
        choices=list(SCENARIOS),
        metavar="NAME",
        help=f"some of: {', '.join(SCENARIOS)} (default: all)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a smoke run of about a minute: 3 s per scenario, without {', '.join(SLOW_ONLY)}",
    )
    parser.add_argument("--seconds", type=float, help="load per scenario (default 20, --quick 3)")
    parser.add_argument("--voters", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--fs-mb",
        type=int,
        default=1024,
        help="size of the disk_full filesystem (default: the relay's volume in cronjob.yaml)",
    )
    parser.add_argument(
        "--relay-src",
        type=Path,
        default=ROOT,
        help="run the relay from this source tree (default: this repository)",
    )
    parser.add_argument("--label", help="what the relay's source is, for the header (default: its git HEAD)")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--keep", action="store_true", help="keep each scenario's folder (logs, files)")
    parser.add_argument("--strict", action="store_true", help="exit 1 when there is a finding")
    args = parser.parse_args()
    budget = QUICK if args.quick else FULL
    if args.seconds:
        budget = replace(budget, seconds=args.seconds)
    args.relay_src = args.relay_src.resolve()

    def stop(number: int, frame: Any) -> None:
        raise SystemExit(128 + number)

    signal.signal(signal.SIGTERM, stop)
    names = args.scenario or [n for n in SCENARIOS if not (args.quick and n in SLOW_ONLY)]
    commit = args.label or (env.git_head(args.relay_src) if (args.relay_src / ".git").exists() else "?")
    header = (
        f"relay from {args.relay_src} ({commit}), {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.1f}, Python {platform.python_version()}, {args.voters} voters, "
        f"{budget.seconds:g} s per scenario"
    )
    print(header, flush=True)
    results = []
    started = time.monotonic()
    try:
        for name in names:
            t0 = time.monotonic()
            result = run_scenario(SCENARIOS[name], budget, args)
            result["wall_s"] = round(time.monotonic() - t0, 1)
            results.append(result)
            print(
                f"  {name}: {result['wall_s']} s"
                + (f" ({result.get('skipped') or result.get('error')})" if "voters" not in result else ""),
                flush=True,
            )
    finally:
        env.cleanup()
    print(f"\n{len(results)} scenarios in {time.monotonic() - started:.0f} s\n")
    print("\n".join(table(results)))
    print()
    hostile = hostile_table(results)
    if hostile:
        print("\n".join(hostile))
    any_finding = False
    print("findings:")
    for r in results:
        found = findings(r, budget)
        any_finding = any_finding or bool(found)
        print(f"- {r['scenario']}: " + ("none" if not found else ""))
        for line in found:
            print(f"    - {line}")
    for r in results:
        if r.get("events"):
            print(f"{r['scenario']} events: " + "; ".join(e.strip() for e in r["events"]))
    if args.json:
        args.json.write_text(
            json.dumps({"header": header, "commit": commit, "results": results}, indent=2, default=str),
            encoding="utf-8",
        )
    return 1 if args.strict and any_finding else 0


if __name__ == "__main__":
    sys.exit(main())
