"""The exit codes `triage calibrate`, `triage eval` and `triage releases` end with, decided by their
result objects (`CalibrationReport.exit_code`, `EvalReport.exit_code`, `ReleaseWindow.exit_code`)
as docs/operations.md documents them: calibrate 6 below `--min-kappa`, eval 1 when a judge's run
failed, releases 7 when the gate's candidate is worse; 0 otherwise. The command line only passes
them on (`sys.exit(result.exit_code)`); tests/calibration/test_calibrate.py, test_eval.py and
test_release_watch.py check them end to end."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from triage.calibration.calibrate import LAYER_CLASSES, agreement, calibrate
from triage.domain.records import Layer
from triage.domain.release_counts import ReleaseCounts
from triage.domain.releases import ReleaseWindow, gate, watch
from triage.domain.review import CalibrationReport, Decision, EvalReport, EvalRun, Label
from triage.errors import ExitCode

T0 = datetime(2026, 12, 1, 3, 0, tzinfo=UTC)


# -- calibrate: 6 when the trust gate fails ----------------------------------------------------


def _calibration(pairs: list[tuple[Layer, Layer]], min_kappa: float | None) -> CalibrationReport:
    labels = [Label(trace_id=f"t{i}", reviewer="ana", layer=human) for i, (human, _) in enumerate(pairs)]
    decisions = {
        f"t{i}": Decision(trace_id=f"t{i}", layer=judged, confidence="high") for i, (_, judged) in enumerate(pairs)
    }
    return calibrate(labels, decisions, min_kappa=min_kappa)


#: 12 of 20 agree on two classes: kappa 0.2, its 95% interval well below 0.5 and above -0.5
MIXED = (
    [(Layer.OK, Layer.OK)] * 6
    + [(Layer.RETRIEVAL, Layer.RETRIEVAL)] * 6
    + [(Layer.OK, Layer.RETRIEVAL)] * 4
    + [(Layer.RETRIEVAL, Layer.OK)] * 4
)
PERFECT = [(Layer.OK, Layer.OK)] * 3 + [(Layer.RETRIEVAL, Layer.RETRIEVAL)] * 3


def test_calibrate_exits_0_without_a_gate_whatever_the_agreement() -> None:
    assert _calibration(MIXED, None).exit_code is ExitCode.OK
    assert _calibration([], None).exit_code is ExitCode.OK  # nothing matched, but no gate asked


def test_calibrate_exits_6_when_the_kappa_lower_bound_is_below_min_kappa() -> None:
    report = _calibration(MIXED, 0.5)
    assert report.layer.kappa_low is not None and -0.5 < report.layer.kappa_low < 0.5
    assert report.exit_code is ExitCode.BELOW_GATE
    assert int(report.exit_code) == 6  # docs/operations.md
    assert _calibration(MIXED, -0.5).exit_code is ExitCode.OK


def test_calibrate_exits_6_when_kappa_is_undefined_under_a_gate() -> None:
    nothing = _calibration([], -1.0)  # no labels matched: no kappa, so the gate cannot pass
    assert nothing.layer.kappa_low is None and nothing.exit_code is ExitCode.BELOW_GATE
    one_class = _calibration([(Layer.OK, Layer.OK)] * 5, -1.0)  # both raters one class: undefined
    assert one_class.layer.kappa is None and one_class.exit_code is ExitCode.BELOW_GATE


def test_calibrate_passes_a_gate_its_lower_bound_meets_exactly() -> None:
    report = _calibration(PERFECT, 1.0)
    assert report.layer.kappa_low == 1.0 and report.exit_code is ExitCode.OK


def test_the_exit_code_stays_out_of_the_calibration_json() -> None:
    assert "exit_code" not in _calibration(MIXED, 0.5).model_dump()


# -- eval: 1 when a judge's run failed ---------------------------------------------------------


def _run(judge: str, *, exit_code: int = 0, error: str | None = None) -> EvalRun:
    layer = agreement([("ok", "ok")], LAYER_CLASSES)
    return EvalRun(
        judge=judge, split="all", cases=1, triaged=1 if error is None else 0, layer=layer, facts={},
        component_accuracy=None, owner_accuracy=None, judge_calls_per_trace=None, exit_code=exit_code, error=error,
    )  # fmt: skip


def test_eval_exits_0_when_every_judge_ran() -> None:
    assert EvalReport(set="s", runs=[_run("heuristic"), _run("replay")]).exit_code is ExitCode.OK
    assert EvalReport(set="s", runs=[]).exit_code is ExitCode.OK


def test_eval_exits_0_when_a_run_was_only_degraded() -> None:
    # a judge that left traces undecided (the night's 4) was still measured: reported, not an error
    report = EvalReport(set="s", runs=[_run("llm", exit_code=int(ExitCode.DEGRADED))])
    assert report.exit_code is ExitCode.OK


def test_eval_exits_1_when_a_judges_run_failed() -> None:
    failed = _run("llm", exit_code=int(ExitCode.CONFIG), error="no TRIAGE_JUDGE_MODEL")
    report = EvalReport(set="s", runs=[_run("heuristic"), failed])
    assert report.exit_code is ExitCode.ERROR
    assert int(report.exit_code) == 1  # docs/commands.md, `triage eval`


# -- releases: 7 when the gate's candidate is worse --------------------------------------------


def _counts(name: str, answers: int, thumbs_down: int, hours: int) -> ReleaseCounts:
    first = T0 + timedelta(hours=hours)
    return ReleaseCounts(
        release=name,
        first_seen=first,
        last_seen=first + timedelta(hours=20),
        answers=answers,
        votes=answers // 2,
        thumbs_down=thumbs_down,
        layers={Layer.RETRIEVAL: thumbs_down},
    )


GOOD = _counts("r1", 1000, 10, 0)
BAD = _counts("r2", 1000, 80, 24)


def _window(*, with_gate: tuple[ReleaseCounts, ReleaseCounts] | None) -> ReleaseWindow:
    return ReleaseWindow(
        start=T0,
        end=T0 + timedelta(days=7),
        counted_by="test",
        unreleased=0,
        watch=watch([GOOD, BAD]),
        gate=None if with_gate is None else gate(*with_gate),
    )


def test_releases_exits_0_without_a_gate_even_when_a_release_is_flagged() -> None:
    window = _window(with_gate=None)
    assert window.watch.flagged == ["r2"]  # shown in the report, never an exit code
    assert window.exit_code is ExitCode.OK


def test_releases_exits_0_when_the_gate_passes() -> None:
    window = _window(with_gate=(GOOD, BAD))  # the better release as the candidate
    assert window.gate is not None and not window.gate.worse
    assert window.exit_code is ExitCode.OK


def test_releases_exits_7_when_the_candidate_is_worse_than_the_baseline() -> None:
    window = _window(with_gate=(BAD, GOOD))
    assert window.gate is not None and window.gate.worse
    assert window.exit_code is ExitCode.REGRESSED
    assert int(window.exit_code) == 7  # docs/operations.md

