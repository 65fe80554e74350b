"""The vote's score name is said once, `[scores] vote`: the relay writes a user's vote under it and
the night reads it from it.

Before, the relay wrote every vote as the constant `user_feedback` whatever `[scores] vote` said, so
an operator who renamed the vote got votes the night never read. Here the vote goes to the relay
over real HTTP (uvicorn) into the embedded store, and `triage feedback` runs for real on that store.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from click.testing import CliRunner

from tests.factories import trace_line
from tests.relay.test_relay import rows, serving
from triage.cli import cli
from triage.domain.config import TriageConfig
from triage.errors import ExitCode
from triage.relay.api import Credentials
from triage.relay.server import check_startup
from triage.settings import load_config
from triage.sources.store import Store

RENAMED = "thumbs"
KATIB = "https://www.kubeflow.org/docs/components/katib/experiment/"


def renamed(tmp_path: Path, extra: str = "") -> tuple[Path, TriageConfig]:
    """A configuration file that renames the vote (and lets the window end now: the vote is new)."""
    path = tmp_path / "renamed.toml"
    path.write_text(f'[scores]\nvote = "{RENAMED}"\n[window]\nlag_minutes = 0\n{extra}', encoding="utf-8")
    return path, load_config(path)


def test_the_relays_built_in_model_declares_the_vote_under_its_configured_name(tmp_path: Path) -> None:
    _, config = renamed(tmp_path)
    vote = config.relay.declared(RENAMED)
    assert vote is not None and vote.data_type == "BOOLEAN"
    spec = vote.config_spec()  # the Langfuse score config the relay's sink creates
    assert spec is not None and (spec.name, spec.data_type) == (RENAMED, "BOOLEAN")
    assert config.relay.declared("user_feedback") is None
    assert config.relay.may_write("human", RENAMED)
    assert config.review_names().vote == RENAMED
    assert config.relay.problems(config.review_names().relay_writes()) == []
    check_startup(config, Credentials(), "127.0.0.1")  # a coherent model: the relay starts


def test_a_score_model_the_file_declares_is_left_as_declared(tmp_path: Path) -> None:
    own = (
        '[[relay.scores]]\nname = "user_feedback"\ndata_type = "BOOLEAN"\n'
        '[[relay.sources]]\nname = "human"\nscores = ["user_feedback"]\n'
    )
    _, config = renamed(tmp_path, own)
    assert [s.name for s in config.relay.scores] == ["user_feedback"]
    assert [(s.name, s.scores) for s in config.relay.sources] == [("human", ["user_feedback"])]
    # it does not declare the vote the relay writes: the relay names that and refuses to start
    assert f"the 'human' source must be allowed to write '{RENAMED}' (the relay writes it)" in config.relay.problems(
        config.review_names().relay_writes()
    )


def test_a_vote_posted_to_the_relay_under_a_renamed_score_is_triaged_by_the_night(tmp_path: Path) -> None:
    path, config = renamed(tmp_path)
    store = tmp_path / "store.sqlite"  # the relay's sink in `serving`, and the night's source
    answered = trace_line(
        "t-renamed",
        "How do I configure a katib experiment trial?",
        "Use the trial template in the experiment spec.",
        [("search_kubeflow_docs", KATIB, "A katib experiment configures each trial with a trial template.")],
        vote=None,  # the vote comes through the relay
        at=datetime.now(UTC) - timedelta(hours=2),
    )
    with Store(store) as db:
        db.import_lines([json.dumps(answered)], "answers")

    with serving(tmp_path, config=config) as (client, _):
        posted = client.post(
            "/api/feedback", json={"traceId": "t-renamed", "userId": "ana", "value": "down", "comment": "dead link"}
        )
        assert posted.status_code == 200, posted.text
        [listed] = client.get("/api/feedback", params={"traceId": "t-renamed"}).json()["data"]
    assert (listed["vote"], listed["comment"], listed["scores"]) == ("down", "dead link", {})  # read back as the vote

    [row] = rows(tmp_path, RENAMED)
    assert (row["traceId"], row["dataType"], row["value"], row["userId"]) == ("t-renamed", "BOOLEAN", 0.0, "user:ana")
    assert rows(tmp_path, "user_feedback") == []

    summary = tmp_path / "summary.json"
    env = {"TRIAGE_STORE": str(store), "LANGFUSE_PUBLIC_KEY": "", "LANGFUSE_SECRET_KEY": ""}
    night = CliRunner().invoke(
        cli,
        ["feedback", "--since-hours", "24", "--judge", "heuristic", "--report", "--config", str(path),
         "--summary-file", str(summary)],
        env=env,
        catch_exceptions=False,
    )  # fmt: skip
    assert night.exit_code == ExitCode.OK, night.output
    assert json.loads(summary.read_text(encoding="utf-8"))["triaged"] == 1
    report = night.stdout.split("## Not triaged")[0]
    assert "trace `t-renamed`" in report and "user said: dead link" in report, night.stdout
