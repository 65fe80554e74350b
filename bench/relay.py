"""Benchmark `triage relay`: N concurrent voters who flip their votes and verdicts at random.

    python bench/relay.py [--voters 16] [--answers 400] [--actions 15000] [--seconds 20]
                          [--targets store,langfuse,postgres] [--outage 0.3,0.6] [--kill-at 0.4]
                          [--json FILE]

This process drives the voters (asyncio, one keep-alive HTTP/1.1 connection each, over loopback:
latency is from a request's send to its full response); the relay runs as its own
process (`python -m triage relay`), into a fresh embedded store, then into the Langfuse stand-in
(tests/doubles/langfuse_server.py, in this process), which is stopped for the `--outage` share
of the run and started again. Each voter acts on random answers (traces, or session + turn): a
vote up or down, or (one action in ten) a verdict, replaced whole. Bounded by `--actions` and
`--seconds`, whichever comes first. Afterwards: the outbox must drain, and the stored state must
equal each voter's last action on each answer: zero lost, zero duplicate rows.
Reports throughput, p50/p99 latency, and Langfuse requests per vote. See bench/README.md.

`postgres`: two relay processes on one throwaway PostgreSQL server (tests/doubles/postgres.py,
on 127.0.0.1 with fsync on, as in production) into the Langfuse stand-in; each voter sends to its
own replica and, when that one fails (refused, reset), sends the same action to the other, as a
load balancer's client would. At `--kill-at` of the run one relay is killed with SIGKILL and started
again at once (`--kill-at 1` or more: none is, the steady state); the stored state must still equal
each voter's last acknowledged action. Beside the run's p99 it prints the p99 of the requests sent
inside the failover window (1 s before the kill to 1 s after the relay serves again) and outside it.
The Langfuse stand-in runs in this process: its CPU (a linear scan of its rows for each score it
applies) holds the voters' event loop up, so part of the latency measured is this process's own.

The voters are closed-loop (each sends its next action once the last is answered), so throughput
is voters / mean latency: more voters than the relay needs to keep its batches full only queue
longer. 16 is the default: enough for 1,000 votes/s at a p99 under 50 ms on 2 shared cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.doubles.langfuse_server import LangfuseStandIn  # noqa: E402

VERDICTS = ("positive", "negative", "false_alarm")
CATEGORIES = ("wrong_answer", "missing_info", "wrong_tool", "other")
# targets (issue 14)
MIN_VOTES_PER_S = 1000
MAX_P99_MS = 50
MAX_LANGFUSE_REQ_PER_VOTE = 1 / 20


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def answers(count: int) -> list[dict[str, Any]]:
    """Half traces, half session turns."""
    out: list[dict[str, Any]] = []
    for n in range(count):
        out.append({"traceId": f"t-{n}"} if n % 2 == 0 else {"contextId": f"s-{n // 8}", "turn": n % 8})
    return out


def key(answer: dict[str, Any]) -> str:
    return (
        f"trace:{answer['traceId']}"
        if "traceId" in answer
        else f"session:{answer['contextId']}:{answer['turn']}"
    )


class Connection:
    """One keep-alive HTTP/1.1 connection, as a browser or a gateway keeps one. (httpx's
    AsyncClient was the bottleneck here: about 90 requests/s at 32 connections against a bare
    Starlette app that answers 1,500/s to this client.)"""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, str]]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        assert self.reader is not None
        data = json.dumps(body).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n"
        )
        self.writer.write(head.encode() + data)
        line = await self.reader.readline()
        if not line:  # the relay went away with the request unanswered
            raise ConnectionResetError("the connection closed before an answer")
        status = int(line.split()[1])
        headers: dict[str, str] = {}
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        await self.reader.readexactly(int(headers.get("content-length", "0")))
        return status, headers

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


class Driver:
    def __init__(
        self, port: int | list[int], voters: int, pool: list[dict[str, Any]], actions: int, seconds: float
    ) -> None:
        #: the relays (replicas): voter n sends to relay n % len, and to the next one when it fails
        self.ports = port if isinstance(port, list) else [port]
        self.port = self.ports[0]
        self.failovers = 0
        self.voters = voters
        self.pool = pool
        self.actions = actions
        self.seconds = seconds
        self.sent = 0
        self.latencies: list[float] = []
        #: (send time, seconds since the run started; latency), to split p99 around a kill
        self.samples: list[tuple[float, float]] = []
        self.started = time.perf_counter()
        self.statuses: Counter[int] = Counter()
        #: (answer key, author) -> the last vote (1/0) and the last verdict's fields
        self.votes: dict[tuple[str, str], int] = {}
        self.verdicts: dict[tuple[str, str], dict[str, str]] = {}
        self.votes_sent = 0

    async def send(self, clients: list[Connection], home: int, body: dict[str, Any]) -> tuple[int, dict[str, str]]:
        """The action to the voter's own relay; while that fails (refused, reset: a replica killed
        or restarting), the same action to the next one, as a client behind a load balancer."""
        for attempt in range(1000):
            client = clients[(home + attempt) % len(clients)]
            try:
                return await client.post("/api/feedback", body)
            except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
                await client.close()
                self.failovers += 1
                if attempt and attempt % len(clients) == 0:
                    await asyncio.sleep(0.05)  # every relay failed: wait a moment
        raise RuntimeError("no relay answered")

    async def voter(self, client: Connection | list[Connection], number: int, stop_at: float) -> None:
        clients = client if isinstance(client, list) else [client]
        home = number % len(clients)
        rng = random.Random(number)
        user = f"voter-{number}"
        while self.sent < self.actions and time.perf_counter() < stop_at:
            self.sent += 1
            answer = rng.choice(self.pool)
            if rng.random() < 0.1:
                fields = {"verdict": rng.choice(VERDICTS)}
                if rng.random() < 0.5:
                    fields["issue_category"] = rng.choice(CATEGORIES)
                if rng.random() < 0.3:
                    fields["note"] = f"note {rng.randrange(1000)}"
                body: dict[str, Any] = {**answer, "userId": user, **fields}
                expect = ("verdict", fields)
            else:
                value = rng.random() < 0.5
                body = {**answer, "userId": user, "value": "up" if value else "down", "comment": "bench"}
                expect = ("vote", int(value))
            started = time.perf_counter()
            while True:  # a 429 or 503 is retried as a client would; anything else is recorded
                status, headers = await self.send(clients, home, body)
                if status not in (429, 503):
                    break
                await asyncio.sleep(float(headers.get("retry-after", "1")))
            self.latencies.append(time.perf_counter() - started)
            self.samples.append((started - self.started, self.latencies[-1]))
            self.statuses[status] += 1
            if status in (200, 202):
                slot = (key(answer), f"user:{user}")
                if expect[0] == "vote":
                    self.votes[slot] = expect[1]  # type: ignore[assignment]
                    self.votes_sent += 1
                else:
                    self.verdicts[slot] = expect[1]  # type: ignore[assignment]

    async def run(self) -> float:
        connections = [[Connection(port) for port in self.ports] for _ in range(self.voters)]
        started = self.started = time.perf_counter()
        stop_at = started + self.seconds
        await asyncio.gather(*(self.voter(c, n, stop_at) for n, c in enumerate(connections)))
        elapsed = time.perf_counter() - started
        for pair in connections:
            for c in pair:
                await c.close()
        return elapsed


def start_relay(workdir: Path, env: dict[str, str], port: int, name: str = "relay") -> subprocess.Popen[bytes]:
    config = workdir / "relay.toml"
    config.write_text(
        "[relay]\nrate_per_second = 1000000.0\nrate_burst = 1000000\nbatch_wait_seconds = 0.25\n",
        encoding="utf-8",
    )
    log = (workdir / f"{name}.log").open("ab")
    process = subprocess.Popen(
        [sys.executable, "-m", "triage", "relay", "--port", str(port), "--config", str(config), "--log-format", "json"],
        env=env, stdout=log, stderr=log,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                return process
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or process.poll() is not None:
            raise SystemExit(f"the relay did not start; see {workdir / f'{name}.log'}")
        time.sleep(0.1)


def wait_drained(url: str, seconds: float = 120) -> tuple[float, int]:
    started = time.monotonic()
    while True:
        depth = httpx.get(f"{url}/readyz").json()["outbox"]["pending"]
        if depth == 0 or time.monotonic() - started > seconds:
            return time.monotonic() - started, depth
        time.sleep(0.1)


def expected_rows(driver: Driver) -> dict[tuple[str, str, str], Any]:
    """(answer, author, score name) -> value, from each voter's last action."""
    out: dict[tuple[str, str, str], Any] = {}
    for (answer, author), value in driver.votes.items():
        out[(answer, author, "user_feedback")] = value
    for (answer, author), fields in driver.verdicts.items():
        for name, text in fields.items():
            out[(answer, author, name)] = text
    return out


def compare(expected: dict[tuple[str, str, str], Any], rows: list[dict[str, Any]]) -> dict[str, int]:
    """Lost, wrong and extra rows; duplicates (two physical rows for one id)."""
    seen: dict[tuple[str, str, str], Any] = {}
    ids = Counter(r["id"] for r in rows)
    for r in rows:
        meta = r["metadata"] if isinstance(r["metadata"], dict) else json.loads(r["metadata"] or "{}")
        slot = (meta["answer"], meta["reviewer"], r["name"])
        seen[slot] = r["value"] if r["dataType"] == "BOOLEAN" else r["stringValue"]
    lost = sum(1 for slot in expected if slot not in seen)
    wrong = sum(1 for slot, value in expected.items() if slot in seen and seen[slot] != value)
    extra = sum(1 for slot in seen if slot not in expected)
    return {
        "lost": lost,
        "wrong": wrong,
        "extra": extra,
        "duplicates": sum(n - 1 for n in ids.values() if n > 1),
    }


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] * 1000 if ordered else 0.0


def run_postgres(args: argparse.Namespace) -> dict[str, Any]:
    """Two relays on one PostgreSQL into the Langfuse stand-in; one killed (SIGKILL) mid-run and
    started again."""
    from tests.doubles.postgres import PostgresServer, unavailable

    reason = unavailable()
    if reason is not None:
        raise SystemExit(f"the postgres target needs a PostgreSQL server: {reason}")
    workdir = Path(tempfile.mkdtemp(prefix="relay-bench-postgres-"))
    server = PostgresServer(tcp=True, durable=True).start()  # fsync on: a commit is on disk
    standin = LangfuseStandIn(record_bodies=False)
    standin.start()
    relays: list[subprocess.Popen[bytes]] = []
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TRIAGE_", "LANGFUSE_"))}
        env.update(TRIAGE_STORE=str(workdir / "store.sqlite"), TRIAGE_RELAY_DATABASE_URL=server.create_database(),
                   LANGFUSE_PUBLIC_KEY=standin.public_key, LANGFUSE_SECRET_KEY=standin.secret_key,
                   LANGFUSE_BASE_URL=standin.url)  # fmt: skip
        ports = [free_port(), free_port()]
        relays = [start_relay(workdir, env, port, f"relay-{n}") for n, port in enumerate(ports)]
        driver = Driver(ports, args.voters, answers(args.answers), args.actions, args.seconds)
        kill: dict[str, float] = {}

        async def with_kill() -> float:
            started = time.perf_counter()

            async def killer() -> None:
                # the share of the run: of its actions, or of its seconds, whichever comes first
                share = args.kill_at
                if share >= 1:  # --kill-at 1 or more: no kill (the steady state, for comparison)
                    return
                while driver.sent < args.actions * share and time.perf_counter() - started < args.seconds * share:
                    await asyncio.sleep(0.005)
                kill["killed_at_s"] = time.perf_counter() - started
                relays[1].kill()  # SIGKILL: no drain, no goodbye; its connections just go
                await asyncio.to_thread(relays[1].wait)
                back = time.perf_counter()
                relays[1] = await asyncio.to_thread(start_relay, workdir, env, ports[1], "relay-1")
                kill["restart_s"] = time.perf_counter() - back

            task = asyncio.create_task(killer())
            elapsed = await driver.run()
            await task
            return elapsed

        elapsed = asyncio.run(with_kill())
        drain_s, depth = wait_drained(f"http://127.0.0.1:{ports[0]}")
        metrics = httpx.get(f"http://127.0.0.1:{ports[0]}/metrics").text
    finally:
        for relay in relays:
            relay.terminate()
        for relay in relays:
            relay.wait(30)
        server.stop()
    rows = standin.score_rows()
    attempts = sum(1 for r in standin.log if r.path.startswith("/api/public/scores"))
    standin.stop()
    expected = expected_rows(driver)
    done = sum(driver.statuses.values())
    # p99 inside and outside the failover window: from 1 s before the kill to 1 s after the killed
    # relay serves again (its voters' retries and the survivor's doubled load)
    killed_at = kill.get("killed_at_s", 0.0)
    window = (killed_at - 1.0, killed_at + kill.get("restart_s", 0.0) + 1.0)
    inside = [lat for at, lat in driver.samples if window[0] <= at <= window[1]]
    steady = [lat for at, lat in driver.samples if not window[0] <= at <= window[1]]
    return {
        **load_figures("postgres", driver, elapsed),
        "p99_outside_kill_ms": round(percentile(steady, 0.99), 2) if kill else None,
        "p99_kill_window_ms": round(percentile(inside, 0.99), 2) if kill else None,
        "outage_s": None,
        "killed_at_s": round(kill.get("killed_at_s", 0.0), 2),
        "restart_s": round(kill.get("restart_s", 0.0), 2),
        "failovers": driver.failovers,
        "langfuse_write_requests": None,
        "langfuse_requests_incl_failed": attempts,
        "langfuse_req_per_vote": round(attempts / done, 4) if done else None,
        "drain_s": round(drain_s, 2),
        "outbox_left": depth,
        "rows": len(rows),
        "expected_rows": len(expected),
        **compare(expected, rows),
        "metrics_outbox_depth": metric(metrics, "relay_outbox_depth"),
    }


def run_target(target: str, args: argparse.Namespace) -> dict[str, Any]:
    if target == "postgres":
        return run_postgres(args)
    workdir = Path(tempfile.mkdtemp(prefix=f"relay-bench-{target}-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRIAGE_", "LANGFUSE_"))}
    env["TRIAGE_STORE"] = str(workdir / "store.sqlite")
    standin: LangfuseStandIn | None = None
    if target == "langfuse":
        standin = LangfuseStandIn(record_bodies=False)
        standin.start()
        env.update(LANGFUSE_PUBLIC_KEY=standin.public_key, LANGFUSE_SECRET_KEY=standin.secret_key,
                   LANGFUSE_BASE_URL=standin.url)  # fmt: skip
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    relay = start_relay(workdir, env, port)
    driver = Driver(port, args.voters, answers(args.answers), args.actions, args.seconds)
    outage: list[float] = []
    try:
        if standin is not None:
            down_at, up_at = (float(x) for x in args.outage.split(","))

            async def with_outage() -> float:
                async def flip() -> None:
                    assert standin is not None
                    expected = args.seconds if args.actions > 10**8 else args.actions / 1500
                    await asyncio.sleep(expected * down_at)
                    outage.append(time.perf_counter())
                    await asyncio.to_thread(standin.stop)
                    await asyncio.sleep(expected * (up_at - down_at))
                    await asyncio.to_thread(standin.start)
                    outage.append(time.perf_counter())

                flipper = asyncio.create_task(flip())
                elapsed = await driver.run()
                await flipper
                return elapsed

            elapsed = asyncio.run(with_outage())
        else:
            elapsed = asyncio.run(driver.run())
        drain_s, depth = wait_drained(url)
        metrics = httpx.get(f"{url}/metrics").text
    finally:
        relay.terminate()
        relay.wait(30)
    if standin is not None:
        rows = standin.score_rows()
        posts = sum(1 for r in standin.log if r.method == "POST" and r.status in (200, 202, 207))
        attempts = sum(1 for r in standin.log if r.path.startswith("/api/public/scores"))
        standin.stop()
    else:
        db = sqlite3.connect(workdir / "store.sqlite")
        db.row_factory = sqlite3.Row
        rows = [dict(r) for r in db.execute("SELECT * FROM scores")]
        db.close()
        posts = attempts = 0
    result = compare(expected_rows(driver), rows)
    done = sum(driver.statuses.values())
    return {
        **load_figures(target, driver, elapsed),
        "outage_s": round(outage[1] - outage[0], 2) if len(outage) == 2 else None,
        "langfuse_write_requests": posts,
        "langfuse_requests_incl_failed": attempts,
        "langfuse_req_per_vote": round(attempts / done, 4) if done and standin is not None else None,
        "drain_s": round(drain_s, 2),
        "outbox_left": depth,
        "rows": len(rows),
        "expected_rows": len(expected_rows(driver)),
        **result,
        "metrics_outbox_depth": metric(metrics, "relay_outbox_depth"),
    }


def load_figures(target: str, driver: Driver, elapsed: float) -> dict[str, Any]:
    """What every target's run reports of its load: actions, throughput, latency, statuses."""
    done = sum(driver.statuses.values())
    return {
        "target": target,
        "actions": done,
        "votes": driver.votes_sent,
        "seconds": round(elapsed, 2),
        "actions_per_s": round(done / elapsed, 1),
        "p50_ms": round(percentile(driver.latencies, 0.50), 2),
        "p99_ms": round(percentile(driver.latencies, 0.99), 2),
        "statuses": dict(driver.statuses),
    }


def metric(page: str, name: str) -> str | None:
    """One unlabelled value of a Prometheus text page."""
    return next((ln.split()[-1] for ln in page.splitlines() if ln.startswith(f"{name} ")), None)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--voters", type=int, default=16)
    parser.add_argument("--answers", type=int, default=400)
    parser.add_argument("--actions", type=int, default=15000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--targets", default="store,langfuse")
    parser.add_argument("--outage", default="0.3,0.6", help="stand-in down from/to, as shares of the run")
    parser.add_argument("--kill-at", type=float, default=0.4,
                        help="postgres: when one relay is killed (share of the run); 1 or more: never")  # fmt: skip
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = [run_target(t, args) for t in args.targets.split(",")]
    columns = ["target", "actions", "seconds", "actions_per_s", "p50_ms", "p99_ms", "langfuse_req_per_vote",
               "outage_s", "drain_s", "rows", "lost", "wrong", "extra", "duplicates", "outbox_left"]  # fmt: skip
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for r in results:
        print("| " + " | ".join(str(r[c]) for c in columns) + " |")
    for r in results:
        if r["target"] == "postgres":
            if r["p99_outside_kill_ms"] is None:
                print("postgres: no relay killed (--kill-at 1 or more)")
                continue
            print(f"postgres: one of two relays killed (SIGKILL) at {r['killed_at_s']} s, serving again "
                  f"{r['restart_s']} s later; {r['failovers']} requests failed over to the other relay; "
                  f"p99 outside the failover window (kill - 1 s to restart + 1 s): {r['p99_outside_kill_ms']} ms, "
                  f"inside it: {r['p99_kill_window_ms']} ms")  # fmt: skip
    for r in results:
        checks = [
            (
                "nothing lost, nothing wrong, no duplicates",
                r["lost"] == r["wrong"] == r["extra"] == r["duplicates"] == 0,
            ),
            ("outbox drained", r["outbox_left"] == 0),
        ]
        if r["target"] == "store":
            checks += [
                (f">= {MIN_VOTES_PER_S} votes/s", r["actions_per_s"] >= MIN_VOTES_PER_S),
                (f"p99 < {MAX_P99_MS} ms", r["p99_ms"] < MAX_P99_MS),
            ]
        else:
            checks.append(
                (
                    "<= 1 Langfuse request per 20 votes",
                    (r["langfuse_req_per_vote"] or 0) <= MAX_LANGFUSE_REQ_PER_VOTE,
                )
            )
        for name, ok in checks:
            print(f"{r['target']}: {name}: {'yes' if ok else 'NO'}")
    print("statuses:", {r["target"]: r["statuses"] for r in results})
    if args.json:
        args.json.write_text(json.dumps(results, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
