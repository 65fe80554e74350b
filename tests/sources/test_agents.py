"""The agent adapters of `triage check` (`triage.sources.agents`), hardened, and an agent's evidence
on one path:

- a reply is read strictly: a lone surrogate (a JSON `"\\ud83d"`) or output that is not UTF-8 in
  any text the reply gives is that case's error (`bad input: ...`), never the run's crash;
- the 8 MB cap holds while a reply arrives (an HTTP body, a command's output), not after;
- a command runs in its own session: when its time is up, or once it has answered, whatever it
  started goes with it;
- a command gets an allow-listed environment, never triage's keys;
- the agent answer format (docs/commands.md) carries the passages the agent retrieved; an agent's
  trace is read by id from the embedded store too;
- `triage check` (an HTTP agent replying with each pair's new run) and bench/checkeval.py give the
  same offline verdict on every pair of evals/check/pairs.jsonl.

Real HTTP on 127.0.0.1 (a small server below), real subprocesses.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal

import pytest
from click.testing import CliRunner

from tests.factories import trace_line
from triage.cli import cli
from triage.domain.checks import AgentRun
from triage.domain.config import AGENT_ENV, AgentEndpointConfig
from triage.domain.worklist import DatasetItem
from triage.errors import ExitCode
from triage.settings import agent_environment, load_config
from triage.sources import agents
from triage.sources.agents import AgentFailure, CommandAgent, HttpJsonAgent, make_agent, read_reply
from triage.sources.store import Store

REPO = Path(__file__).resolve().parents[2]
TOOLS = load_config().tools
ONCE = agents.AGENT_RETRY.with_(attempts=1)
PAGE = "https://www.kubeflow.org/docs/components/pipelines/caching/"
DATASET = "triage-regressions"
#: a check that did not run through (a crash, a configuration refused); every other exit is a verdict
#: on the cases (the gates: regressed, too many unchecked, not written), which these tests do not test
NOT_RUN = (ExitCode.ERROR, ExitCode.USAGE, ExitCode.CONFIG)


# -- a local agent over HTTP: each question's reply as raw bytes ------------------------------------


@dataclass
class Served:
    """One reply: its body; its `Content-Length` (None: none, the body ends when the connection
    does); `hang`: after the body the connection stays open, unfinished."""

    body: bytes
    length: int | None = -1  # -1: the body's own length
    hang: bool = False


class LocalAgent:
    """An agent on 127.0.0.1 answering `POST /ask` `{"question": ...}` by `respond(question)`."""

    def __init__(self, respond: Callable[[str], Served]) -> None:
        self.respond = respond
        self.release = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True

    def __enter__(self) -> LocalAgent:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self._server.shutdown()
        self._server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/ask"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        agent = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base signature
                pass

            def do_POST(self) -> None:  # noqa: N802 - the base class's name
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                served = agent.respond(json.loads(raw)["question"])
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    if served.length is not None:
                        length = len(served.body) if served.length == -1 else served.length
                        self.send_header("Content-Length", str(length))
                    # one request a connection: the client never reuses one the server is closing
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(served.body)
                    self.wfile.flush()
                    if served.hang:
                        agent.release.wait(60)
                except OSError:
                    pass  # the client dropped the connection (over the cap)
                self.close_connection = True

        return Handler


def http_endpoint(url: str, **paths: Any) -> AgentEndpointConfig:
    return AgentEndpointConfig(kind="http", url=url, **paths)


def ask(agent: Any, question: str = "How do I cache?") -> AgentRun:
    async def go() -> AgentRun:
        try:
            run: AgentRun = await agent.ask(question)
            return run
        finally:
            await agent.aclose()

    return asyncio.run(go())


# -- a lone surrogate, text that is not UTF-8 --------------------------------------------------------

LONE = "\\ud83d"  # as a JSON reply escapes it: json.loads makes it a lone surrogate
GOOD = {
    "answer": f"Turn caching off per task. {PAGE}",
    "sources": [PAGE],
    "retrieved": [{"text": "set_caching_options(False)", "source_url": PAGE}],
    "tool_calls": [{"name": "search_kubeflow_docs", "args": {"query": "cache"}}],
    "trace_id": "t-1",
}
#: where the surrogate goes, and the field the error names
PLACES = {
    "answer": ('"answer": "Turn caching off ', "answer"),
    "source": (f'"sources": ["{PAGE}', "sources[0]"),
    "passage": ('"text": "set_caching_options', "retrieved[0].text"),
    "tool args": ('"query": "cache', "tool_calls[0].args.query"),
    "tool arg key": ('"args": {"query', "tool_calls[0].args key"),
    "trace id": ('"trace_id": "t-1', "trace_id"),
}


def spoiled(place: str) -> bytes:
    """The good reply with a lone surrogate escaped into one of its texts."""
    text, _ = PLACES[place]
    body = json.dumps(GOOD)
    assert text in body
    return body.replace(text, text + LONE, 1).encode("utf-8")


@pytest.mark.parametrize("place", PLACES)
def test_a_lone_surrogate_anywhere_in_a_reply_is_bad_input(place: str) -> None:
    assert read_reply(json.loads(json.dumps(GOOD)), http_endpoint("http://x/ask"), TOOLS).answer
    with pytest.raises(AgentFailure, match=r"^bad input: the reply's ") as caught:
        read_reply(json.loads(spoiled(place)), http_endpoint("http://x/ask"), TOOLS)
    assert PLACES[place][1] in str(caught.value)
    assert not caught.value.retryable
    str(caught.value).encode("utf-8")  # the message itself can be written


@pytest.mark.slow
@pytest.mark.parametrize("place", ["answer", "passage", "trace id"])
def test_a_lone_surrogate_over_http_is_the_cases_error(place: str) -> None:
    with LocalAgent(lambda q: Served(spoiled(place))) as server:
        run = ask(HttpJsonAgent(http_endpoint(server.url), tools=TOOLS, timeout=30, retry=ONCE))
    assert run.answer is None and run.error is not None and run.error.startswith("bad input: the reply's ")
    run.model_dump_json().encode("utf-8")


def test_a_run_names_its_first_unwritable_text() -> None:
    """What the adapters check (and what any agent's run can be checked with, `AgentRun.unwritable`)."""
    assert AgentRun(answer="fine", sources=[PAGE]).unwritable() is None
    assert AgentRun(answer="a\ud83d").unwritable() == "answer (character 1: \\ud83d)"
    run = AgentRun(answer="ok", tool_calls=[{"name": "s", "args": {"q": ["x", "\udc00"]}}])  # type: ignore[list-item]
    assert run.unwritable() == "tool_calls[0].args.q[1] (character 0: \\udc00)"


def test_a_message_quoting_a_bad_reply_can_be_written() -> None:
    # the reply has no answer where the configuration says: the message quotes the reply
    with pytest.raises(AgentFailure) as caught:
        read_reply({"text": "x\ud83d"}, http_endpoint("http://x/ask"), TOOLS)
    assert "\\ud83d" in str(caught.value)
    str(caught.value).encode("utf-8")


def command_endpoint(script: Path, *args: str, output: Literal["text", "json"] = "json") -> AgentEndpointConfig:
    return AgentEndpointConfig(kind="command", command=[sys.executable, str(script), *args], output=output)


@pytest.mark.slow
def test_a_command_whose_output_is_not_utf8_is_bad_input(tmp_path: Path) -> None:
    script = tmp_path / "agent.py"
    script.write_text(
        "import sys\nsys.stdin.read()\nsys.stdout.buffer.write(b'caf\\xe9 au lait')\n", encoding="utf-8"
    )
    run = ask(CommandAgent(command_endpoint(script, output="text"), tools=TOOLS, timeout=30, retry=ONCE))
    assert run.error == "bad input: the command's output is not UTF-8 (byte 3)"


def test_a_question_no_pipe_can_carry_is_the_cases_error() -> None:
    agent = CommandAgent(AgentEndpointConfig(kind="command", command=["cat"]), tools=TOOLS, timeout=5, retry=ONCE)
    assert ask(agent, "Why\ud83d?").error == "bad input: the question is not UTF-8 text (a lone surrogate)"


def write_items(items: list[DatasetItem], dataset: str = DATASET) -> None:
    with Store(Path(os.environ["TRIAGE_STORE"])) as store:
        store.ensure_dataset(dataset, "regression cases", {})
        assert store.upsert_dataset_items(items).failed == {}


def case_item(
    item_id: str, question: str, *, layer: str = "generation", dataset: str = DATASET, **expected: Any
) -> DatasetItem:
    return DatasetItem.model_validate(
        {
            "id": item_id,
            "dataset_name": dataset,
            "input": {"question": question},
            "expected_output": {"expectation": "a test case", **expected},
            "metadata": {"layer": layer, "owners": ["kubeflow/docs-agent"], "signature": f"sig-{item_id}"},
            "source_trace_id": f"prod-{item_id}",
            "status": "ACTIVE",
        }
    )


def check(tmp_path: Path, agent_table: str, *args: str) -> tuple[int, dict[str, Any], str]:
    config = tmp_path / "triage.toml"
    config.write_text(
        agent_table.strip() + "\n\n[check]\ntrace_wait_seconds = 0\nattempts = 1\n", encoding="utf-8"
    )
    out = tmp_path / "out.json"
    run = CliRunner().invoke(
        cli,
        ["check", "--config", str(config), "--judge", "offline", "--output", str(out), *args],
        catch_exceptions=False,
        prog_name="triage",
    )
    data = json.loads(out.read_text(encoding="utf-8")) if out.exists() else {}
    return run.exit_code, data, run.output


def runs_of(data: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["result"]["case"]["item_id"]: c["result"] for c in data["cases"]}


@pytest.mark.slow
def test_triage_check_survives_a_lone_surrogate_and_reports_it(tmp_path: Path) -> None:
    """Measured on main before: exit 1, no report, nothing written (the store could not encode it)."""
    script = tmp_path / "agent.py"
    reply = spoiled("answer").decode("ascii")
    script.write_text(f"import sys\nsys.stdin.read()\nsys.stdout.write({reply!r})\n", encoding="utf-8")
    write_items(
        [
            case_item("c-bad", "How do I cache?", must_cite=[PAGE]),
            case_item("c-also", "Again?", must_cite=[PAGE]),
        ]
    )
    code, data, output = check(
        tmp_path,
        f'[agent_endpoint]\nkind = "command"\ncommand = ["{sys.executable}", "{script}"]\noutput = "json"',
    )
    assert code not in NOT_RUN and data, output
    found = runs_of(data)
    assert found["c-bad"]["outcome"] == "error" and found["c-also"]["outcome"] == "error"
    assert found["c-bad"]["run"]["error"].startswith("bad input: the reply's answer (character ")
    assert "bad input" in output  # the report lists it


# -- the cap on a reply's size, while it arrives --------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "served",
    [
        Served(
            b'{"answer": "' + b"x" * 20_000, length=None, hang=True
        ),  # no length: the body just keeps coming
        Served(b'{"answer": "' + b"x" * 100, length=10**9, hang=True),  # a length over the cap
    ],
    ids=["streamed", "declared"],
)
def test_an_http_reply_over_the_cap_is_dropped_while_it_arrives(
    monkeypatch: pytest.MonkeyPatch, served: Served
) -> None:
    """The reply never ends: the old reading (the whole body, then its size) waited for the case's
    time-out; the cap is counted as the body arrives, so the try fails at once, for its size."""
    monkeypatch.setattr(agents, "MAX_REPLY_BYTES", 4096)
    with LocalAgent(lambda q: served) as server:
        run = ask(HttpJsonAgent(http_endpoint(server.url), tools=TOOLS, timeout=20, retry=ONCE))
    assert run.error is not None and run.error.startswith("the reply is over 4096 bytes"), run.error


@pytest.mark.slow
def test_a_command_writing_over_the_cap_is_killed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(agents, "MAX_REPLY_BYTES", 4096)
    script = tmp_path / "agent.py"
    script.write_text(
        "import sys, time\nsys.stdout.write('x' * 20000)\nsys.stdout.flush()\ntime.sleep(600)\n",
        encoding="utf-8",
    )
    run = ask(CommandAgent(command_endpoint(script), tools=TOOLS, timeout=20, retry=ONCE))
    assert run.error == "the command wrote over 4096 bytes"


# -- a command's children --------------------------------------------------------------------------

SPAWNER = """
import subprocess, sys, time
mode = sys.argv[2]
out = None if mode == "holding" else subprocess.DEVNULL  # holding: the child keeps the output pipe open
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], stdout=out, stderr=out)
with open(sys.argv[1], "w") as f:
    f.write(str(child.pid))
if mode == "answers":
    print("Done: the pipeline caches by default.")
    sys.exit(0)
time.sleep(3600)
"""


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper is gone: it runs no more)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
def grandchild(tmp_path: Path) -> Iterator[Path]:
    """Where the command writes its child's pid; that process is killed at the end if still alive."""
    pid_file = tmp_path / "grandchild.pid"
    yield pid_file
    if pid_file.exists() and alive(pid := int(pid_file.read_text())):
        os.kill(pid, signal.SIGKILL)


def gone(pid: int) -> bool:
    # SIGKILL is delivered at once; the process's end is observed on the next scheduling
    for _ in range(200):
        if not alive(pid):
            return True
        threading.Event().wait(0.02)
    return False


def ask_at_most(agent: Any, bound: float) -> AgentRun | None:
    """`ask(agent)` in a thread; None when it has not returned within `bound` seconds (it hangs:
    a liveness bound far above the case's time-out, not a measurement)."""
    answer: list[AgentRun] = []
    thread = threading.Thread(target=lambda: answer.append(ask(agent)), daemon=True)
    thread.start()
    thread.join(bound)
    return answer[0] if answer else None


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["quiet", "holding"])
def test_the_timeout_kills_the_commands_children_too(tmp_path: Path, grandchild: Path, mode: str) -> None:
    """quiet: the child outlived the case (before: only the command was killed). holding: its child
    holds the command's output open, and the case outlived its time-out (before: until the child
    ended, an hour here)."""
    script = tmp_path / "spawner.py"
    script.write_text(SPAWNER, encoding="utf-8")
    endpoint = command_endpoint(script, str(grandchild), mode)
    run = ask_at_most(CommandAgent(endpoint, tools=TOOLS, timeout=3, retry=ONCE), bound=60)
    assert run is not None, "the case did not end at its time-out"
    assert run.error == "no answer within 3 s"
    assert grandchild.exists(), "the command never started its child"
    assert gone(int(grandchild.read_text())), "the command's child outlived the case"


@pytest.mark.slow
def test_what_a_command_leaves_running_goes_once_it_answered(tmp_path: Path, grandchild: Path) -> None:
    script = tmp_path / "spawner.py"
    script.write_text(SPAWNER, encoding="utf-8")
    endpoint = command_endpoint(script, str(grandchild), "answers", output="text")
    run = ask(CommandAgent(endpoint, tools=TOOLS, timeout=30, retry=ONCE))
    assert (run.error, run.answer) == (None, "Done: the pipeline caches by default.")
    assert gone(int(grandchild.read_text()))


# -- a command's environment -----------------------------------------------------------------------

ENV_SCRIPT = """
import json, os, sys
sys.stdin.read()
print(json.dumps({"answer": json.dumps(dict(os.environ))}))
"""


def test_the_agent_environment_is_the_allow_list_and_what_env_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-never")
    monkeypatch.setenv("MY_AGENT_TOKEN", "for-the-agent")
    monkeypatch.setenv("UNLISTED", "no")
    monkeypatch.setenv("LANG", "C.UTF-8")
    env = agent_environment(["MY_AGENT_TOKEN", "NOT_SET_ANYWHERE"])
    assert env["MY_AGENT_TOKEN"] == "for-the-agent" and env["LANG"] == "C.UTF-8"
    assert set(env) <= {*AGENT_ENV, "MY_AGENT_TOKEN"}
    assert "OPENAI_API_KEY" not in env and "UNLISTED" not in env
    assert AgentEndpointConfig(kind="command", command=["x"], env=["BAD-NAME"]).problems() == [
        "[agent_endpoint] env 'BAD-NAME' is not a variable name"
    ]


@pytest.mark.slow
def test_a_command_agent_gets_no_key_of_triages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through `triage check`: settings read the allowed variables, the command gets them and no
    other (before: the whole environment, OPENAI_API_KEY and every other key included)."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-never-for-the-agent")
    monkeypatch.setenv("TRIAGE_RELAY_TOKEN", "relay-token-never")
    monkeypatch.setenv("MY_AGENT_TOKEN", "for-the-agent")
    script = tmp_path / "agent.py"
    script.write_text(ENV_SCRIPT, encoding="utf-8")
    write_items([case_item("c-env", "What do I get?", must_cite=[PAGE])])
    table = f'[agent_endpoint]\nkind = "command"\ncommand = ["{sys.executable}", "{script}"]\noutput = "json"'
    table += '\nenv = ["MY_AGENT_TOKEN"]'
    code, data, output = check(tmp_path, table)
    assert code not in NOT_RUN and data, output
    seen = json.loads(runs_of(data)["c-env"]["run"]["answer"])
    assert seen["MY_AGENT_TOKEN"] == "for-the-agent" and seen.get("PATH") == os.environ["PATH"]
    assert not {"OPENAI_API_KEY", "TRIAGE_RELAY_TOKEN", "TRIAGE_STORE"} & set(seen)
    assert set(seen) <= {*AGENT_ENV, "MY_AGENT_TOKEN", "LC_CTYPE", "PWD"}  # the last two: Python's own


def test_make_agent_passes_nothing_of_the_environment_by_default() -> None:
    agent = make_agent(AgentEndpointConfig(kind="command", command=["x"]), tools=TOOLS, timeout=1, attempts=1)
    assert isinstance(agent, CommandAgent) and agent.env == {}


# -- the agent answer format -------------------------------------------------------------------------


def documented_reply() -> dict[str, Any]:
    """The example of docs/commands.md, "The agent's answer format"."""
    text = (REPO / "docs" / "commands.md").read_text(encoding="utf-8")
    after = text[text.index("**The agent's answer format**") :]
    block = after[after.index("```json") + len("```json") : after.index("```", after.index("```json") + 7)]
    reply: dict[str, Any] = json.loads(block)
    return reply


def test_the_documented_answer_format_is_read_with_the_default_pointers() -> None:
    reply = documented_reply()
    kinds: tuple[Literal["http", "command"], ...] = ("http", "command")
    for kind in kinds:
        endpoint = AgentEndpointConfig(kind=kind, url="http://x/ask", command=["x"], output="json")
        run = read_reply(reply, endpoint, TOOLS)
        assert run.answer == reply["answer"] and run.sources == reply["sources"]
        assert run.trace_id == reply["trace_id"]
        [passage] = run.retrieved
        assert (passage.id, passage.text, passage.source_url, passage.title, passage.collection) == (
            "p1",
            reply["retrieved"][0]["text"],
            reply["retrieved"][0]["source_url"],
            "Configure an Experiment",
            "docs",
        )
        assert run.tool_calls is not None and [c.model_dump() for c in run.tool_calls] == reply["tool_calls"]


def test_the_retrieved_pointer_is_configurable_and_passages_without_text_are_left_out() -> None:
    reply = {
        "out": {
            "text": "See the page.",
            "passages": [
                {"text": "A", "url": PAGE},
                {"source_url": PAGE},
                "x",
                {"text": " "},
                {"text": "B", "id": 7},
            ],
        },
    }
    endpoint = http_endpoint("http://x/ask", answer_path="/out/text", retrieved_path="/out/passages")
    run = read_reply(reply, endpoint, TOOLS)
    assert [(p.id, p.text, p.source_url) for p in run.retrieved] == [("R1", "A", PAGE), ("7", "B", None)]
    assert (
        read_reply(
            reply, http_endpoint("http://x/ask", answer_path="/out/text", retrieved_path=""), TOOLS
        ).retrieved
        == []
    )
    assert http_endpoint("http://x", retrieved_path="passages").problems() == [
        "[agent_endpoint] retrieved_path 'passages' is not a JSON pointer (it starts with /)"
    ]


ISSUES_PAGE = "https://github.com/kubeflow/katib/issues/2417"
ISSUES = "call search_github_issues (the issues collection)"


@pytest.mark.slow
def test_an_agents_trace_in_the_embedded_store_is_read_by_id(tmp_path: Path) -> None:
    """The agent returns a trace id the store holds: its tool calls and passages are the judge's
    evidence (before: traces were read from Langfuse only, and the tool behaviour went undecided)."""
    question = "My Katib trials hang after the upgrade, why?"
    with Store(Path(os.environ["TRIAGE_STORE"])) as store:
        searched = [("search_github_issues", ISSUES_PAGE, "Trials hang: fixed in 0.18.")]
        store.import_lines(
            [json.dumps(trace_line("t-agent", question, "Upgrade Katib.", searched, vote=None))], "agent"
        )
    write_items([case_item("c-routed", question, layer="tool_routing", tool_behavior=ISSUES)])
    reply = {"answer": "Trials hang until Katib 0.18: upgrade Katib.", "trace_id": "t-agent"}
    with LocalAgent(lambda q: Served(json.dumps(reply).encode())) as server:
        code, data, output = check(tmp_path, f'[agent_endpoint]\nkind = "http"\nurl = "{server.url}"')
    assert code not in NOT_RUN and data, output
    run = runs_of(data)["c-routed"]
    assert run["run"]["tool_calls"] == [
        {"name": "search_github_issues", "collection": "issues", "args": {"query": question}}
    ]
    assert [p["source_url"] for p in run["run"]["retrieved"]] == [ISSUES_PAGE]
    decided = {c["name"]: c["passed"] for c in run["checks"]}
    assert decided["tool_behavior"] is True, run["checks"]


@pytest.mark.slow
def test_a_trace_id_the_store_does_not_hold_is_judged_on_the_reply_without_waiting(tmp_path: Path) -> None:
    write_items([case_item("c-cite", "How do I cache?", must_cite=[PAGE])])
    reply = {"answer": f"Turn it off per task: {PAGE}", "trace_id": "t-in-langfuse-only"}
    with LocalAgent(lambda q: Served(json.dumps(reply).encode())) as server:
        config = f'[agent_endpoint]\nkind = "http"\nurl = "{server.url}"\n'
        # a wait that would outlast the test's patience if the store were polled like Langfuse
        (tmp_path / "triage.toml").write_text(
            config + "\n[check]\ntrace_wait_seconds = 3600\n", encoding="utf-8"
        )
        out = tmp_path / "out.json"
        run = CliRunner().invoke(
            cli, ["check", "--config", str(tmp_path / "triage.toml"), "--judge", "offline", "--output", str(out)],
            catch_exceptions=False,
        )  # fmt: skip
    assert run.exit_code not in NOT_RUN, run.output
    assert runs_of(json.loads(out.read_text()))["c-cite"]["run"]["trace_id"] == "t-in-langfuse-only"


# -- triage check and bench/checkeval.py: one verdict per pair ---------------------------------------


def checkeval() -> Any:
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import checkeval as module
    finally:
        sys.path.remove(str(REPO / "bench"))
    return module


def rounds(pairs: list[Any]) -> list[list[Any]]:
    """The pairs in rounds whose questions differ (an agent answers by the question alone, and some
    pairs share one)."""
    out: list[list[Any]] = []
    for pair in pairs:
        free = next((r for r in out if all(p.case.question != pair.case.question for p in r)), None)
        if free is None:
            out.append(free := [])
        free.append(pair)
    return out


def check_verdicts(
    tmp_path: Path,
    pairs: list[Any],
    replies: Mapping[str, dict[str, Any]],
    *,
    retrieved_path: str | None = None,
) -> dict[str, str]:
    """`triage check` on the pairs' cases (the embedded store), asking an HTTP agent that replies
    with each pair's new run in the agent answer format: the outcome per pair."""
    bench = checkeval()
    found: dict[str, str] = {}
    for n, group in enumerate(rounds(pairs)):
        dataset = f"check-eval-{n}"
        write_items([bench.pair_item(p.raw, dataset) for p in group], dataset)
        by_question = {p.case.question: json.dumps(replies[p.id]).encode("utf-8") for p in group}
        with LocalAgent(lambda q, known=by_question: Served(known[q])) as server:  # type: ignore[misc]
            table = f'[agent_endpoint]\nkind = "http"\nurl = "{server.url}"'
            if retrieved_path is not None:
                table += f'\nretrieved_path = "{retrieved_path}"'
            code, data, output = check(tmp_path, table, "--dataset", dataset)
        assert code not in NOT_RUN and data, output
        found |= {item_id: result["outcome"] for item_id, result in runs_of(data).items()}
    return found


@pytest.mark.slow
@pytest.mark.corpus
def test_triage_check_and_checkeval_give_the_same_verdict_on_every_pair(tmp_path: Path, corpus: Path) -> None:
    bench = checkeval()
    pairs = bench.load_pairs("all", corpus)
    verify = bench.verifier()
    reader = verify.Corpus.load(corpus)
    replies = {p.id: bench.agent_reply(p.raw["new_run"], reader, verify) for p in pairs}
    evaluated = asyncio.run(bench.run_judge("offline", pairs, "all"))
    expected = {j.pair.id: j.outcome for j in evaluated.judged}
    found = check_verdicts(tmp_path, pairs, replies)
    assert len(found) == len(pairs)
    differ = {k: (expected[k], found[k]) for k in expected if expected[k] != found[k]}
    assert not differ, f"{len(differ)} of {len(pairs)} pairs differ (checkeval, triage check): {differ}"
