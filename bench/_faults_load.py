"""The load of bench/faults.py and its bookkeeping: closed-loop voters that remember every write and
what became of it (acknowledged, refused, or in doubt), hostile requests beside them, and the
judgement of the final stored state against what was acknowledged.

A *slot* is (answer, author, score name): `("trace:t-4", "user:voter-3", "user_feedback")`. A vote
sets its `user_feedback` slot to 1 or 0; a verdict (replaced whole) sets each verdict field the
voters use to its value, or to absent (None) when the verdict leaves it out.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal

sys.path.insert(0, str(Path(__file__).resolve().parent))

import relay as relay_bench  # noqa: E402  (bench/relay.py)

Slot = tuple[str, str, str]
Value = int | float | str | None  # None: no score stored (absent, or cleared)
Outcome = Literal["ack", "refused", "doubt"]

VOTE = "user_feedback"
#: the verdict fields the voters write (the relay clears the ones a verdict leaves out)
VERDICT_FIELDS = ("verdict", "issue_category", "note")
#: answered by a client's retry after Retry-After, as bench/relay.py's voters do (and 502: not written)
RETRIED = (429, 502, 503)
MAX_RETRY_WAIT = 1.0


# --------------------------------------------------------------------------- one connection


class NotSent(Exception):
    """No connection: the request never left (the relay is down)."""


class NoAnswer(Exception):
    """The request went out and no complete answer came: `timeout` or `dropped`."""


class Client(relay_bench.Connection):
    """bench/relay.py's keep-alive HTTP/1.1 connection, with any method, a body of raw bytes (a
    hostile body is not always JSON a dict can make), a time-out on every exchange, and a new
    connection after anything went wrong on the old one."""

    def __init__(self, port: int, timeout: float) -> None:
        super().__init__(port)
        self.timeout = timeout

    def drop(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def send(self, method: str, path: str, data: bytes) -> tuple[int, dict[str, str]]:
        if self.writer is not None and (self.writer.is_closing() or (self.reader and self.reader.at_eof())):
            self.drop()  # the server closed it while idle: not a failure of this request
        if self.writer is None:
            try:
                self.reader, self.writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", self.port), self.timeout
                )
            except (OSError, TimeoutError) as ex:
                raise NotSent(str(ex)) from None
        try:
            return await asyncio.wait_for(self._exchange(method, path, data), self.timeout)
        except TimeoutError:
            self.drop()
            raise NoAnswer("timeout") from None
        except (OSError, EOFError, ValueError, IndexError):
            self.drop()
            raise NoAnswer("dropped") from None

    async def _exchange(self, method: str, path: str, data: bytes) -> tuple[int, dict[str, str]]:
        assert self.reader is not None and self.writer is not None
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n"
        )
        self.writer.write(head.encode() + data)
        await self.writer.drain()
        line = await self.reader.readline()
        if not line:
            raise EOFError("closed before an answer")
        status = int(line.split()[1])
        headers: dict[str, str] = {}
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        await self.reader.readexactly(int(headers.get("content-length", "0")))
        if headers.get("connection", "").lower() == "close":
            self.drop()
        return status, headers


# --------------------------------------------------------------------------- bookkeeping


@dataclass
class Traffic:
    """Requests of one kind: sent (reached a connection), answered by status, or without an answer."""

    sent: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    no_answer: Counter[str] = field(default_factory=Counter)  # timeout, dropped
    not_sent: int = 0  # connection refused: never left
    latencies: list[float] = field(default_factory=list)

    @property
    def acknowledged(self) -> int:
        return sum(n for s, n in self.statuses.items() if 200 <= s < 300)

    def refused(self) -> Counter[int]:
        return Counter({s: n for s, n in self.statuses.items() if not 200 <= s < 300})

    def max_ms(self) -> float:
        return round(max(self.latencies, default=0.0) * 1000, 1)

    def p99_ms(self) -> float:
        return round(relay_bench.percentile(self.latencies, 0.99), 1)

    def summary(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "acknowledged": self.acknowledged,
            "refused": {str(s): n for s, n in sorted(self.refused().items())},
            "no_answer": dict(self.no_answer),
            "connect_refused": self.not_sent,
            "p99_ms": self.p99_ms(),
            "max_ms": self.max_ms(),
        }


@dataclass
class Write:
    """One voter action and what became of it (over its retries: acknowledged if one attempt was;
    in doubt if none was and one got no answer; else refused)."""

    voter: int
    index: int  # the voter's n-th write: slots are the voter's own, so this orders them
    slots: dict[Slot, Value]
    outcome: Outcome = "refused"


@dataclass(frozen=True)
class Hostile:
    name: str
    data: bytes


def hostile_cases() -> list[Hostile]:
    """Requests the relay must refuse with a 4xx (every one is in its own namespace: answers `h-...`,
    authors `hostile...`, so none can touch a voter's score)."""

    def body(text: str) -> bytes:
        return text.encode("utf-8")

    vote = '"userId": "hostile", "value": "up"'
    return [
        Hostile("turn 2**63", body(f'{{"contextId": "h-s", "turn": {2**63}, {vote}}}')),
        Hostile("turn 10**30", body(f'{{"contextId": "h-s", "turn": {10**30}, {vote}}}')),
        Hostile('turn "²"', body(f'{{"contextId": "h-s", "turn": "\u00b2", {vote}}}')),
        # lone UTF-16 surrogates, as JSON escapes in the text (json.loads accepts them)
        Hostile("lone surrogate in comment", body(f'{{"traceId": "h-sur", {vote}, "comment": "\\ud83d"}}')),
        Hostile("lone surrogate in traceId", body(f'{{"traceId": "h-\\udc00", {vote}}}')),
        Hostile(
            "lone surrogate in note",
            body(
                '{"traceId": "h-sur-note", "reviewer": "hostile", "verdict": "negative", "note": "x\\udbff"}'
            ),
        ),
        Hostile(
            "surrogate as raw bytes",  # CESU-8 / WTF-8 bytes of U+D83D: not UTF-8
            b'{"traceId": "h-sur-raw", "userId": "hostile", "value": "up", "comment": "\xed\xa0\xbd"}',
        ),
        Hostile(
            "note of 501 characters",
            body(
                '{"traceId": "h-long", "reviewer": "hostile", "verdict": "negative", "note": "'
                + "n" * 501
                + '"}'
            ),
        ),
        Hostile(
            "note of 70,000 characters",
            body(
                '{"traceId": "h-huge", "reviewer": "hostile", "verdict": "negative", "note": "'
                + "n" * 70_000
                + '"}'
            ),
        ),
        Hostile(
            "comment of 4,001 characters",
            body(f'{{"traceId": "h-long", {vote}, "comment": "' + "c" * 4001 + '"}'),
        ),
        Hostile("DEL in traceId", body(f'{{"traceId": "h-\\u007f", {vote}}}')),
        Hostile("C1 (NEL) in userId", body('{"traceId": "h-c1", "userId": "hostile\\u0085", "value": "up"}')),
        Hostile("C1 (CSI) in traceId", body(f'{{"traceId": "h-\\u009b31m", {vote}}}')),
        Hostile(
            "bidi override in reviewer",
            body('{"traceId": "h-bidi", "reviewer": "hostile\\u202e", "verdict": "negative"}'),
        ),
        Hostile("bidi isolate in contextId", body(f'{{"contextId": "h-\\u2066s", "turn": 0, {vote}}}')),
        Hostile(
            "JSON nested 30,000 deep",
            body(f'{{"traceId": "h-nest", {vote}, "comment": ' + "[" * 30_000 + "]" * 30_000 + "}"),
        ),
        Hostile(
            "JSON nested 800 deep (id)",
            body('{"traceId": ' + '{"a": ' * 800 + "1" + "}" * 800 + ', "userId": "hostile", "value": "up"}'),
        ),
    ]


#: the colliding pair: reviewer `ana` on trace `t:user`, end user `ana` on trace `t`; each must
#: keep its own scores (the relay's answer and author once joined them with ":" into one id)
COLLISION: list[tuple[str, dict[str, Any], dict[Slot, Value]]] = [
    (
        "reviewer ana on trace t:user",
        {"traceId": "t:user", "reviewer": "ana", "value": "down", "note": "ana the reviewer"},
        {("trace:t:user", "ana", VOTE): 0, ("trace:t:user", "ana", "note"): "ana the reviewer"},
    ),
    (
        "end user ana on trace t",
        {"traceId": "t", "userId": "ana", "value": "up", "note": "ana the end user"},
        {("trace:t", "user:ana", VOTE): 1, ("trace:t", "user:ana", "note"): "ana the end user"},
    ),
]
COLLISION_SLOTS = {slot for _, _, slots in COLLISION for slot in slots}


# --------------------------------------------------------------------------- the load


class Load:
    """`voters` closed-loop voters (bench/relay.py's mix: nine votes in ten, else a verdict replaced
    whole) for `seconds`, each retrying a write after a connection error, a time-out or a 429, 502
    or 503 until it is answered otherwise or `grace` seconds after the end; and, with `hostile`,
    the hostile requests and the colliding pair, sent every `hostile_every` seconds each on a
    connection of its own."""

    def __init__(
        self,
        *,
        port: int,
        voters: int,
        seconds: float,
        timeout: float,
        grace: float,
        seed: int,
        answers: int = 400,
        hostile: bool = False,
        hostile_timeout: float = 5.0,
        hostile_every: float = 0.15,
    ) -> None:
        self.port = port
        self.voters = voters
        self.seconds = seconds
        self.timeout = timeout
        self.grace = grace
        self.seed = seed
        self.pool = relay_bench.answers(answers)
        self.hostile = hostile
        self.hostile_timeout = hostile_timeout
        self.hostile_every = hostile_every
        self.normal = Traffic()
        self.writes: list[Write] = []
        self.hostile_traffic: dict[str, Traffic] = defaultdict(Traffic)
        self.collision_traffic: dict[str, Traffic] = defaultdict(Traffic)
        self.collision_writes: list[tuple[str, Outcome]] = []
        self.started = 0.0
        self.stop_at = 0.0

    async def run(self, chaos: Callable[[float], Any] | None = None) -> float:
        """Run the voters (and `chaos(started)`, a coroutine function); the load's seconds."""
        self.started = time.monotonic()
        self.stop_at = self.started + self.seconds
        tasks = [asyncio.create_task(self.voter(n)) for n in range(self.voters)]
        if self.hostile:
            tasks.append(asyncio.create_task(self.hostile_sender()))
        if chaos is not None:
            tasks.append(asyncio.create_task(chaos(self.started)))
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return time.monotonic() - self.started

    async def voter(self, number: int) -> None:
        rng = random.Random(self.seed * 1000 + number)
        user = f"voter-{number}"
        author = f"user:{user}"
        client = Client(self.port, self.timeout)
        index = 0
        try:
            while time.monotonic() < self.stop_at:
                answer = rng.choice(self.pool)
                slot = relay_bench.key(answer)
                if rng.random() < 0.1:
                    fields = {"verdict": rng.choice(relay_bench.VERDICTS)}
                    if rng.random() < 0.5:
                        fields["issue_category"] = rng.choice(relay_bench.CATEGORIES)
                    if rng.random() < 0.3:
                        fields["note"] = f"note {rng.randrange(1000)}"
                    body: dict[str, Any] = {**answer, "userId": user, **fields}
                    slots: dict[Slot, Value] = {(slot, author, f): fields.get(f) for f in VERDICT_FIELDS}
                else:
                    up = rng.random() < 0.5
                    body = {**answer, "userId": user, "value": "up" if up else "down", "comment": "bench"}
                    slots = {(slot, author, VOTE): int(up)}
                write = Write(number, index, slots)
                index += 1
                self.writes.append(write)
                write.outcome = await self.deliver(client, json.dumps(body).encode(), self.normal)
        finally:
            client.drop()

    async def deliver(self, client: Client, data: bytes, traffic: Traffic) -> Outcome:
        doubt = False
        give_up = self.stop_at + self.grace
        while True:
            started = time.monotonic()
            try:
                status, headers = await client.send("POST", "/api/feedback", data)
            except NotSent:
                traffic.not_sent += 1
                if time.monotonic() > give_up:
                    return "doubt" if doubt else "refused"
                await asyncio.sleep(0.05)
                continue
            except NoAnswer as ex:
                traffic.sent += 1
                traffic.no_answer[str(ex)] += 1
                traffic.latencies.append(time.monotonic() - started)
                doubt = True
                if time.monotonic() > give_up:
                    return "doubt"
                await asyncio.sleep(0.05)
                continue
            traffic.sent += 1
            traffic.statuses[status] += 1
            traffic.latencies.append(time.monotonic() - started)
            if 200 <= status < 300:
                return "ack"
            if status in RETRIED and time.monotonic() < give_up:
                await asyncio.sleep(min(_seconds(headers.get("retry-after")), MAX_RETRY_WAIT))
                continue
            return "doubt" if doubt else "refused"

    async def hostile_sender(self) -> None:
        """In turn: the colliding pair, then each hostile request, one every `hostile_every` seconds,
        each on a connection of its own and not waited for (some hang)."""
        plan: list[Callable[[], Coroutine[Any, Any, None]]] = [
            partial(self._collision, name, json.dumps(body).encode()) for name, body, _ in COLLISION
        ]
        plan += [partial(self._one_hostile, case) for case in hostile_cases()]
        running: set[asyncio.Task[None]] = set()
        turn = 0
        while time.monotonic() < self.stop_at:
            task = asyncio.create_task(plan[turn % len(plan)]())
            running.add(task)
            task.add_done_callback(running.discard)
            turn += 1
            await asyncio.sleep(self.hostile_every)
        if running:
            await asyncio.gather(*running, return_exceptions=True)

    async def _one_hostile(self, case: Hostile) -> None:
        traffic = self.hostile_traffic[case.name]
        client = Client(self.port, self.hostile_timeout)
        started = time.monotonic()
        try:
            status, _ = await client.send("POST", "/api/feedback", case.data)
        except NotSent:
            traffic.not_sent += 1
            return
        except NoAnswer as ex:
            traffic.sent += 1
            traffic.no_answer[str(ex)] += 1
            traffic.latencies.append(time.monotonic() - started)
            return
        finally:
            client.drop()
        traffic.sent += 1
        traffic.statuses[status] += 1
        traffic.latencies.append(time.monotonic() - started)

    async def _collision(self, name: str, data: bytes) -> None:
        client = Client(self.port, self.timeout)
        try:
            outcome = await self.deliver(client, data, self.collision_traffic[name])
        finally:
            client.drop()
        self.collision_writes.append((name, outcome))


def _seconds(text: str | None) -> float:
    try:
        return max(0.05, float(text)) if text else 0.2
    except ValueError:
        return 1.0


# --------------------------------------------------------------------------- the final state


@dataclass(frozen=True)
class StoredRow:
    """One physical score row, as the store or the Langfuse stand-in holds it."""

    id: str
    slot: Slot
    value: Value
    order: tuple[Any, ...]  # larger: the row a reader sees as current


def _answer_of(meta: dict[str, Any], trace_id: Any, session_id: Any) -> str:
    if meta.get("answer"):
        return str(meta["answer"])
    if trace_id:
        return f"trace:{trace_id}"
    return f"session:{session_id}:{meta.get('turn')}"


def _value_of(data_type: Any, value: Any, string_value: Any) -> Value:
    if data_type == "BOOLEAN":
        return int(round(float(value or 0)))
    if data_type == "NUMERIC":
        return float(value) if value is not None else None
    return str(string_value) if string_value is not None else None


def store_rows(rows: Iterable[dict[str, Any]]) -> list[StoredRow]:
    """Rows of the embedded store's `scores` table."""
    out = []
    for r in rows:
        try:
            meta = json.loads(r["metadata"] or "{}")
        except ValueError:
            meta = {}
        meta = meta if isinstance(meta, dict) else {}
        author = str(meta.get("reviewer") or meta.get("userId") or r.get("userId") or "?")
        slot = (_answer_of(meta, r.get("traceId"), r.get("sessionId")), author, str(r["name"]))
        out.append(
            StoredRow(
                r["id"],
                slot,
                _value_of(r["dataType"], r["value"], r["stringValue"]),
                (str(r.get("updatedAt") or ""),),
            )
        )
    return out


def standin_rows(rows: Iterable[dict[str, Any]]) -> list[StoredRow]:
    """Physical rows of the Langfuse stand-in (`score_rows()`)."""
    out = []
    for r in rows:
        meta = r.get("metadata") if isinstance(r.get("metadata"), dict) else {}
        assert isinstance(meta, dict)
        author = str(meta.get("reviewer") or meta.get("userId") or "?")
        slot = (_answer_of(meta, r.get("traceId"), r.get("sessionId")), author, str(r["name"]))
        # what a v3 read shows per id: the latest timestamp, then the latest write
        order = (r["timestamp"], r["updatedAt"], r.get("_seq", 0))
        out.append(StoredRow(r["id"], slot, _value_of(r["dataType"], r["value"], r["stringValue"]), order))
    return out


def is_normal(slot: Slot) -> bool:
    return slot[1].startswith("user:voter-")


@dataclass
class Judgement:
    slots: int = 0  # normal slots written or stored
    ok: int = 0
    lost: int = 0
    duplicated: int = 0
    wrong: int = 0
    in_doubt: int = 0  # final value is an unanswered write's, sent after the last acknowledged one
    surplus_rows: int = 0  # physical rows beyond one per slot
    examples: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    def note(self, kind: str, text: str) -> None:
        if len(self.examples[kind]) < 3:
            self.examples[kind].append(text)


def judge(writes: list[Write], rows: list[StoredRow]) -> Judgement:
    """Each normal slot's final stored value against its last acknowledged write.

    - lost: the last acknowledged write set a value and nothing is stored;
    - wrong: something else is stored (an older value, a value no write acknowledged, or a score the
      last acknowledged verdict cleared);
    - in doubt: what is stored is the value of a write that got no answer, sent after the last
      acknowledged one (or the slot holds nothing, and such a write cleared it): not wrong;
    - duplicated: more than one physical row for the slot (two rows of one id, or two ids).
    """
    history: dict[Slot, list[tuple[int, Value, Outcome]]] = defaultdict(list)
    for w in writes:
        for slot, value in w.slots.items():
            history[slot].append((w.index, value, w.outcome))
    stored: dict[Slot, list[StoredRow]] = defaultdict(list)
    for row in rows:
        if is_normal(row.slot):
            stored[row.slot].append(row)
    out = Judgement()
    for slot in sorted(set(history) | set(stored)):
        out.slots += 1
        last_index, expected = -1, None
        for index, value, outcome in sorted(history.get(slot, []), key=lambda h: h[0]):
            if outcome == "ack":
                last_index, expected = index, value
        doubts = [v for i, v, o in history.get(slot, []) if o == "doubt" and i > last_index]
        here = stored.get(slot, [])
        final = max(here, key=lambda r: r.order).value if here else None
        if len(here) > 1:
            out.duplicated += 1
            out.surplus_rows += len(here) - 1
            ids = Counter(r.id for r in here)
            out.note(
                "duplicated", f"{slot}: {len(here)} rows, {len(ids)} id(s), values {[r.value for r in here]}"
            )
        if final == expected:
            out.ok += 1
        elif final in doubts:
            out.in_doubt += 1
        elif final is None:
            out.lost += 1
            out.note("lost", f"{slot}: acknowledged {expected!r}, nothing stored")
        else:
            out.wrong += 1
            out.note("wrong", f"{slot}: acknowledged {expected!r}, stored {final!r}")
    return out


def judge_collision(rows: list[StoredRow], writes: list[tuple[str, Outcome]]) -> dict[str, Any]:
    """Both sides of the colliding pair acknowledged: each of their four scores stored once, with
    its own id, author and value."""
    acked = {name for name, outcome in writes if outcome == "ack"}
    problems = []
    ids: set[str] = set()
    for name, _, slots in COLLISION:
        if name not in acked:
            problems.append(f"{name}: never acknowledged")
            continue
        for slot, value in slots.items():
            here = [r for r in rows if r.slot == slot]
            if not here:
                problems.append(f"{slot[1]} {slot[2]} on {slot[0]}: missing")
            elif len(here) > 1:
                problems.append(f"{slot[1]} {slot[2]} on {slot[0]}: {len(here)} rows")
            elif here[0].value != value:
                problems.append(f"{slot[1]} {slot[2]} on {slot[0]}: {here[0].value!r}, not {value!r}")
            ids.update(r.id for r in here)
    others = [r for r in rows if r.slot[0] in ("trace:t", "trace:t:user") and r.slot not in COLLISION_SLOTS]
    if others:
        problems.append(f"{len(others)} row(s) under a mixed-up answer or author, e.g. {others[0].slot}")
    ids_expected = sum(len(slots) for name, _, slots in COLLISION if name in acked)
    if not problems and len(ids) != ids_expected:
        problems.append(f"{len(ids)} distinct ids for {ids_expected} scores")
    return {"ok": not problems and len(acked) == len(COLLISION), "problems": problems}


def hostile_rows(rows: list[StoredRow]) -> list[StoredRow]:
    """Rows written by hostile requests (none should exist)."""
    return [
        r
        for r in rows
        if not is_normal(r.slot)
        and r.slot not in COLLISION_SLOTS
        and r.slot[0] not in ("trace:t", "trace:t:user")
    ]
