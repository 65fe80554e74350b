"""SIGTERM (Kubernetes stopping the Pod): traces in flight finish and are written, the rest are listed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from tests.doubles.openai_server import OpenAIServer, keyword_responder
from triage.app import DEMO_DIR, demo_shift
from triage.sources.store import Store


def test_sigterm_finishes_in_flight_traces_and_lists_the_rest(tmp_path: Path) -> None:
    store_path = tmp_path / "store.sqlite"
    traces = DEMO_DIR / "traces.jsonl"
    with Store(store_path) as store:
        store.import_file(traces, shift=demo_shift(traces, datetime.now(UTC)))
    with OpenAIServer(responder=keyword_responder, latency=0.4) as server:
        env = {
            "PATH": os.environ["PATH"],
            "TRIAGE_STORE": str(store_path),
            "OPENAI_BASE_URL": f"{server.url}/v1",
            "OPENAI_API_KEY": "sk-test",
            "TRIAGE_JUDGE_MODEL": "m",
        }
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "triage",
                "feedback",
                "--write",
                "--report",
                "--judge",
                "llm",
                "--concurrency",
                "2",
            ],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 30
        while server.calls < 4 and time.monotonic() < deadline:  # wait until judging is under way
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 4, err
    assert "SIGTERM: finishing the traces in flight" in err
    assert "stopped (SIGTERM) before this trace was triaged" in out
    triaged = int(out.split(" triaged,")[0].rsplit(": ", 1)[1])
    assert 0 < triaged < 29
    with Store(store_path) as store:
        assert len(store.scores_named("triage_layer")) == triaged  # what was triaged was written
