"""The calibration report: Markdown for people, JSON for tools (the same figures)."""

from __future__ import annotations

from triage.domain.calibration import LABELLED_FACTS, CalibrationReport, EvalReport
from triage.sinks.markdown import templates


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


templates.filters["num"] = _num


def render_calibration(report: CalibrationReport) -> str:
    """The Markdown report; every reviewer name, trace id and reason escaped as untrusted text."""
    return templates.get_template("calibration.md.j2").render(r=report)


def calibration_json(report: CalibrationReport) -> str:
    return report.model_dump_json(indent=2) + "\n"


def render_eval(report: EvalReport) -> str:
    """The evaluation table (a row per judge and split) and each judge's misses."""
    splits = [run.split for run in report.runs]
    detail = "all" if "all" in splits else (splits[0] if splits else "all")
    return templates.get_template("eval.md.j2").render(report=report, facts=LABELLED_FACTS, detail=detail)


def eval_json(report: EvalReport) -> str:
    return report.model_dump_json(indent=2) + "\n"
