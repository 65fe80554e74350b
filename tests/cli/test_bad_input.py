"""Every command reports its bad input as docs/commands.md promises, never a crash (#27 B).

Each test runs the command for real (click's runner, the whole CLI): a bad line is named by its
file, its number and the reason, with the command's documented exit code; never "unexpected
failure" and a traceback. The findings:

- a JSONL line nested just short of the parser's limit decodes, and then crashed whatever walked it
  next (`triage calibrate` quoting a bad layer, `triage promote --jsonl` rewriting its file): the
  window is a few levels wide and moves with the stack, so the tests try every depth up to past it;
- `triage import` stored a score's comment (or id, name, ...) that is an object straight into SQLite,
  and a lone UTF-16 surrogate (`\\ud83d` in the JSON) as text UTF-8 cannot encode;
- `triage eval` read a set's files as UTF-8 text whole, and dropped its bad label lines unreported;
- `triage votes` (and `triage calibrate`) on a mistyped TRIAGE_STORE made an empty store and
  reported nothing in it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from tests.calibration.test_eval import _set
from tests.regression.test_promote import SELECT, records
from triage.cli import cli
from triage.domain.review import EvalReport
from triage.errors import ExitCode
from triage.sinks.report import render_eval
from triage.sources.store import Store

#: depths from well below to past where `json.loads` gives up (about 1000 less the stack in use)
DEPTHS = range(700, 1001)
ALL_TIME = (datetime(2000, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC))


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def invoke(args: list[str], env: dict[str, str] | None = None) -> Result:
    result = CliRunner().invoke(cli, args, env=env, catch_exceptions=False)
    assert "unexpected failure" not in result.output and "Traceback" not in result.output, result.output[-2000:]
    return result


def store_env(path: Path) -> dict[str, str]:
    return {"TRIAGE_STORE": str(path), "LANGFUSE_PUBLIC_KEY": "", "LANGFUSE_SECRET_KEY": ""}


# -- triage calibrate: "bad labels never stop the run" -------------------------------------------


@pytest.mark.parametrize("field", ["layer", "verdict"])
def test_calibrate_lists_a_label_nested_at_any_depth_and_goes_on(tmp_path: Path, field: str) -> None:
    labels = tmp_path / "labels.jsonl"
    good = {"trace_id": "t1", "reviewer": "ana", "layer": "ok"}
    lines = [json.dumps(good)] + [f'{{"trace_id": "t{d}", "reviewer": "bo", "{field}": {nested(d)}}}' for d in DEPTHS]
    labels.write_text("\n".join(lines) + "\n", encoding="utf-8")
    facts = tmp_path / "facts.jsonl"
    facts.write_text("", encoding="utf-8")
    result = invoke(["calibrate", "--labels-file", str(labels), "--facts-file", str(facts), "--format", "json"])
    assert result.exit_code == ExitCode.OK
    report = json.loads(result.stdout)
    assert report["labels"] == 1 + len(DEPTHS)
    set_aside = {b["where"]: b["reason"] for b in report["bad_labels"]}
    assert set(set_aside) == {f"labels.jsonl:{n}" for n in range(1, len(lines) + 1)}  # 1: never triaged
    assert all("nested too deeply" in set_aside[f"labels.jsonl:{n}"] for n in range(2, len(lines) + 1))


# -- triage import: "a bad line is reported with its number and nothing is loaded" ---------------


def export_line(trace_id: str, **score: Any) -> dict[str, Any]:
    vote = {"id": f"v-{trace_id}", "name": "user_feedback", "dataType": "BOOLEAN", "value": 0,
            "comment": "wrong", "traceId": trace_id, "timestamp": "2026-11-29T10:01:00Z", **score}  # fmt: skip
    return {"traceId": trace_id, "observations": [], "scores": [vote]}


@pytest.mark.parametrize(
    ("second", "message"),
    [
        (json.dumps(export_line("t2", comment={"text": "wrong"})), "score 'v-t2': comment must be text or null"),
        (json.dumps(export_line("t2", comment=["wrong"])), "score 'v-t2': comment must be text or null"),
        (json.dumps(export_line("t2", name={"a": 1})), "score 'v-t2': name must be text or null"),
        (json.dumps(export_line("t2", id=["v"])), "a score: id must be text or null"),
        (json.dumps(export_line("t2", userId={"id": 7})), "userId must be text or null"),
        (json.dumps(export_line("t2", comment="cut \ud83d")), "scores[0].comment holds a lone UTF-16 surrogate"),
        (json.dumps(export_line("t2", metadata={"turn\udc00": 1})), "scores[0].metadata.turn"),
        (json.dumps(export_line("t2")).replace('"wrong"', nested(990)), "nested too deeply"),
    ],
    ids=["comment-object", "comment-list", "name-object", "id-list", "userId-object", "surrogate", "surrogate-key",
         "deep"],
)
def test_import_names_the_bad_line_and_loads_nothing(tmp_path: Path, second: str, message: str) -> None:
    export = tmp_path / "export.jsonl"
    export.write_text(json.dumps(export_line("t1")) + "\n" + second + "\n", encoding="utf-8")
    path = tmp_path / "store.sqlite"
    result = invoke(["import", str(export)], store_env(path))
    assert result.exit_code == 1
    assert f"{export}, line 2: " in result.output and message in result.output, result.output
    with Store(path) as store:
        assert store.votes("user_feedback", *ALL_TIME).votes == []  # the good first line is not loaded either


# -- triage eval: a set's bad lines ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (b"{not json", "line 5: not JSON"),
        (b'{"traceId": "x", "observations": [], "scores": [], "note": "\xff"}', "line 5: not UTF-8"),
        (json.dumps(export_line("x", comment={"a": 1})).encode(), "line 5: score 'v-x': comment must be text"),
        (json.dumps(export_line("x", comment="\ud83d")).encode(), "line 5: the text at scores[0].comment"),
    ],
    ids=["not-json", "not-utf8", "comment-object", "surrogate"],
)
def test_eval_names_a_bad_line_of_traces_jsonl(tmp_path: Path, bad: bytes, message: str) -> None:
    folder = _set(tmp_path / "set")
    traces = folder / "traces.jsonl"
    traces.write_bytes(traces.read_bytes() + bad + b"\n")
    result = invoke(["eval", str(folder), "--judge", "replay"])
    assert result.exit_code == ExitCode.ERROR
    assert f"{traces}, {message}" in result.output, result.output


@pytest.mark.slow
def test_eval_lists_its_bad_label_lines_and_measures_the_rest(tmp_path: Path) -> None:
    folder = _set(tmp_path / "set")  # labels on lines 1-5, line 5 an unknown layer
    labels = folder / "labels.jsonl"
    bad = [b"{not json", b'{"trace_id": "e5", "layer": "ok", "note": "\xff"}',
           json.dumps({"trace_id": "e7\ud83d", "layer": "ok"}).encode(),
           f'{{"trace_id": "e8", "layer": "ok", "facts": {nested(200)}}}'.encode()]  # fmt: skip
    labels.write_bytes(labels.read_bytes() + b"\n".join(bad) + b"\n")
    result = invoke(["eval", str(folder), "--judge", "replay", "--format", "json"])
    assert result.exit_code == ExitCode.OK, result.output
    report = json.loads(result.stdout)
    set_aside = {b["where"]: b["reason"] for b in report["bad_labels"]}
    assert set(set_aside) == {f"labels.jsonl:{n}" for n in range(5, 6 + len(bad))}, set_aside
    assert set_aside["labels.jsonl:6"].startswith("not a JSON object")
    assert set_aside["labels.jsonl:7"].startswith("not a JSON object") and "utf-8" in set_aside["labels.jsonl:7"]
    assert "lone UTF-16 surrogate" in set_aside["labels.jsonl:8"]
    assert "nested too deeply" in set_aside["labels.jsonl:9"]
    assert {run["split"]: run["cases"] for run in report["runs"]}["all"] == 4  # e0-e3, measured as ever
    markdown = render_eval(EvalReport.model_validate(report))
    assert f"## Labels set aside ({len(set_aside)})" in markdown
    assert "- labels.jsonl:6: not a JSON object" in markdown


# -- triage promote --jsonl: a file that cannot be read is named, line and reason -----------------


def test_promote_names_a_jsonl_line_nested_at_any_depth(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    with Store(path) as store:
        store.import_lines([json.dumps(r) for r in records()], "promote")
    cases = tmp_path / "cases.jsonl"
    refused = {}
    for depth in DEPTHS:  # an item of another dataset: read, then written back beside the new ones
        cases.write_text(f'{{"id": "i-1", "datasetName": "other", "input": {nested(depth)}}}\n', encoding="utf-8")
        result = invoke(["promote", *SELECT, "--jsonl", str(cases)], store_env(path))
        refused[depth] = result.exit_code == ExitCode.ERROR and (
            f"{cases}, line 1: not a dataset item: JSON nested too deeply" in result.output
        )
    assert all(refused.values()), [depth for depth, ok in refused.items() if not ok]


# -- triage votes: a store that does not exist is a configuration error ---------------------------


@pytest.mark.parametrize("command", [["votes"], ["calibrate"]])
def test_a_mistyped_store_is_a_configuration_error_not_an_empty_store(tmp_path: Path, command: list[str]) -> None:
    missing = tmp_path / "stroe.sqlite"
    result = invoke(command, store_env(missing))
    assert result.exit_code == ExitCode.CONFIG, result.output
    assert f"there is no embedded store at {missing}" in result.output
    assert not missing.exists()  # a command that only reads never creates one
