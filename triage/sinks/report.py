"""The Markdown a run and a calibration leave behind: the report, its summary, the issue drafts, the
calibration and evaluation reports; and where a run's outputs go (`publish_run`).

Markdown comes from jinja2 templates (`templates/`). User text (questions, comments, reviewer names)
is escaped with the `md` filter: it cannot open a heading, a table, a link or HTML. The summary
lines are our own text, not escaped.

A new report section: its data in `domain.outcome` (a field of `Entry` and its line in `Entry.of`,
or a property of `RunResult`), its text in `templates/report.md.j2`, which gets the whole `result`;
`render_report` adds only groupings several sections share.
"""

from __future__ import annotations

import json
import logging
import re
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from jinja2 import Environment, PackageLoader, StrictUndefined

from triage.domain.checks import STATUSES, CaseReport, CheckResult, Status
from triage.domain.outcome import Entry, RunResult, Skipped
from triage.domain.records import Layer
from triage.domain.releases import Rate, ReleaseWindow
from triage.domain.review import LABELLED_FACTS, CalibrationReport, EvalReport, JudgeMeasure
from triage.domain.worklist import NIGHTS
from triage.errors import ConfigError
from triage.redact import printable, redact

log = logging.getLogger("triage")

# -- Markdown: escaping untrusted text, the templates ------------------------------------------

# Inline Markdown that could format, link or break out of a line. Block syntax (headings, lists,
# quotes, tables) needs a line start, and user text never gets one: it is folded onto one line
# that the template starts itself.
# Links and images need `[`, emphasis `*` or `_`, code a backtick, tables `|`, strikethrough `~`.
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~])")
_BLOCK_START = re.compile(r"^(?:(\d+)([.)])|([#>+=-]))")
_AUTOLINK = re.compile(r"(?i)\b(https?|ftp)(:)(//)|\b(www)(\.)")


#: user text in the report is cut to this many characters; the whole of it stays in the trace
USER_TEXT_CHARS = 500


def md(text: object, limit: int = USER_TEXT_CHARS) -> str:
    """Escape untrusted text for one line of Markdown: no HTML, no formatting, no links, no newlines,
    no control or invisible characters, no secret; at most `limit` characters."""
    flat = " ".join(printable(redact(str(text)), limit).split())
    flat = flat.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    flat = _MD_SPECIAL.sub(r"\\\1", flat)
    # should a template ever start a line with user text, it still cannot open a block
    flat = _BLOCK_START.sub(lambda m: f"{m[1]}\\{m[2]}" if m[2] else f"\\{m[3]}", flat)
    # GitHub turns bare URLs into links; an escaped colon or dot stops that and renders the same
    return _AUTOLINK.sub(lambda m: f"{m[1]}\\:{m[3]}" if m[1] else f"{m[4]}\\.", flat)


def code(text: object) -> str:
    """An identifier as inline code; backticks removed so it cannot close the span early."""
    return "`" + printable(redact(str(text)), USER_TEXT_CHARS).replace("`", "'") + "`"


def code_cell(text: object) -> str:
    """An identifier as inline code inside a table cell (release names, versions): `code`, its
    pipes escaped. GFM splits a row at every pipe no backslash precedes, inside a code span too,
    and shows `\\|` there as `|`."""
    return code(text).replace("|", "\\|")


def chart_label(text: object) -> str:
    """A Mermaid string: no quote, bracket or newline can end it early (owners are configuration)."""
    return " ".join(str(text).replace('"', "'").replace("[", "(").replace("]", ")").split())[:40]


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def _rate(rate: Rate, interval: bool = True) -> str:
    """`4/20 = 20.0% (8.1–41.6%)`: a rate with its 95% interval (`–` for a rate of nothing)."""
    if rate.value is None or rate.low is None or rate.high is None:
        return f"{rate.count}/{rate.total}"
    shown = f"{rate.count}/{rate.total} = {_pct(rate.value)}"
    return f"{shown} ({_pct(rate.low)}–{_pct(rate.high)})" if interval else shown


def _p(value: float | None) -> str:
    return "–" if value is None else "< 0.001" if value < 0.001 else f"{value:.3f}"


def measured(measure: JudgeMeasure | None, judge: str) -> str:
    """How far `judge` has been measured against people's labels: one sentence for the report and
    the issue drafts (our own text: the judge's name is configuration)."""
    if measure is None:
        return (
            f"Judge `{judge}`: unmeasured (no `triage calibrate --write` has compared its verdicts with "
            "people's labels): read its verdicts as unchecked."
        )
    kappa = "undefined" if measure.kappa is None else f"{measure.kappa:.2f}"
    interval = (
        "" if measure.kappa_low is None or measure.kappa_high is None
        else f" (95% interval {measure.kappa_low:.2f} to {measure.kappa_high:.2f})"
    )  # fmt: skip
    return (
        f"Judge `{judge}`: layer kappa {kappa}{interval} against people on {measure.labels} labels, "
        f"measured {measure.measured_at.strftime('%Y-%m-%d')} (rule version {measure.rule_version}) by "
        "`triage calibrate`."
    )


templates = Environment(
    loader=PackageLoader("triage.sinks", "templates"),
    undefined=StrictUndefined,
    autoescape=False,  # Markdown, not HTML: escaping is explicit, with the `md` filter
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)
templates.filters.update(md=md, code=code, code_cell=code_cell, chart=chart_label, num=_num, rate=_rate, p=_p)

# -- the run report ----------------------------------------------------------------------------


def grouped(entries: list[Entry]) -> dict[str, dict[str, list[Entry]]]:
    """owner -> layer -> entries, owners sorted, layers in the report's order."""
    groups: dict[str, dict[str, list[Entry]]] = defaultdict(lambda: defaultdict(list))
    for entry in entries:
        for owner in entry.owners:
            groups[owner][entry.layer.value].append(entry)
    order = [layer.value for layer in Layer]
    return {
        owner: {layer: groups[owner][layer] for layer in order if groups[owner].get(layer)}
        for owner in sorted(groups)
    }


def by_signature(entries: list[Entry]) -> list[tuple[str, list[Entry]]]:
    """Entries as signature items, in the order their first member comes (no signature: its own item)."""
    items: dict[str, list[Entry]] = {}
    for entry in entries:
        items.setdefault(entry.signature or f"trace:{entry.trace_id}", []).append(entry)
    return list(items.items())


def _entry_order(entry: Entry) -> tuple[str, str]:
    """When the trace started, then its id: the order traces finished in differs run to run."""
    return (entry.start.isoformat() if entry.start else "", entry.trace_id)


def _skipped_order(item: Skipped) -> tuple[str, str, str]:
    undecided = item.undecided
    return (undecided.kind, undecided.trace_id or "", ",".join(undecided.vote_ids))


def render_report(result: RunResult) -> str:
    """The Markdown report; the same run gives the same bytes (entries and skipped votes in a fixed
    order), so two nights' reports diff line by line."""
    result = replace(
        result,
        entries=sorted(result.entries, key=_entry_order),
        skipped=sorted(result.skipped, key=_skipped_order),
    )
    groups = grouped(result.entries)
    layers = [layer.value for layer in Layer if result.layer_counts.get(layer.value)]
    worklist = result.worklist
    return templates.get_template("report.md.j2").render(
        result=result,
        groups={
            owner: {layer: by_signature(items) for layer, items in by_layer.items()}
            for owner, by_layer in groups.items()
        },
        layers=layers,
        all_layers=[layer.value for layer in Layer],
        totals={
            owner: {layer: len(items) for layer, items in by_layer.items()}
            for owner, by_layer in groups.items()
        },
        worklist=worklist,
        sigs={sig.id: sig for sig in worklist.signatures} if worklist else {},
        nights=NIGHTS + 1,
        summary=summary_lines(result, timing=False),  # our own text: not escaped
        measured=measured(result.judge_measure, result.judge),
    )


# -- the run summary ---------------------------------------------------------------------------


def _not_triaged(result: RunResult) -> dict[str, int]:
    kinds: dict[str, int] = defaultdict(int)
    for skipped in result.skipped:
        kinds[skipped.undecided.kind] += 1
    return dict(sorted(kinds.items()))


def summary_lines(result: RunResult, *, timing: bool = True) -> list[str]:
    """The run summary: counts per layer, undecided, written, time, requests and cost. Without
    `timing` (the report), no wall time: the same input then gives the same report."""
    triaged = len(result.entries)
    per_layer = (
        ", ".join(f"{layer} {count}" for layer, count in sorted(result.layer_counts.items())) or "none"
    )
    undecided = ", ".join(f"{kind} {count}" for kind, count in _not_triaged(result).items()) or "none"
    per_trace = result.requests / triaged if triaged else 0.0
    usage = result.usage
    lines = [
        f"thumbs-down {result.thumbs_down} (of {result.votes_seen} votes), already triaged {result.already_triaged}, "
        f"triaged {triaged}, not triaged {len(result.skipped)}",
        f"layers: {per_layer}",
        f"not triaged: {undecided}",
        f"written: {result.written} scores" if result.write else "written: nothing (no --write)",
        f"judge {result.judge}: {usage.calls} calls, {usage.input_tokens} input + {usage.output_tokens} output "
        f"tokens, est. ${result.cost:.4f}"
        + (
            f" ({usage.calls / triaged:.2f} calls, {(usage.input_tokens + usage.output_tokens) / triaged:.0f} "
            f"tokens per trace)"
            if triaged
            else ""
        ),
        f"search calls {result.search_calls}; backend requests {result.requests} ({per_trace:.2f} per triaged trace)",
    ]
    if usage.batch_calls or usage.cached_input_tokens:
        # batch mode, a prompt cache: what the calls cost as billed, beside the direct price above
        share = usage.cached_input_tokens / usage.input_tokens if usage.input_tokens else 0.0
        lines.insert(
            5,
            f"judge cost as billed: est. ${result.billed_cost:.4f} (${result.cost:.4f} at the direct price): "
            f"{usage.batch_calls} of {usage.calls} calls in batches, at the batch price; "
            f"{usage.cached_input_tokens} of {usage.input_tokens} input tokens cached ({share:.0%}), "
            "at the cached price",
        )
    if timing:
        lines.append(f"time {result.elapsed:.1f}s")
    if result.worklist is not None:
        status = result.worklist.status_counts()
        lines.insert(
            4,
            f"signatures: {len(result.worklist.signatures)} tonight ({status['new']} new, {status['recurring']} "
            f"recurring, {status['regressed']} regressed), {status['resolved']} resolved"
            + (f"; {result.signatures_written} signature scores written" if result.write else ""),
        )
    return lines


def summary_record(result: RunResult) -> dict[str, object]:
    """The run's figures for a machine (`--summary-file`): what the summary lines say, as JSON."""
    return {
        "exit_code": int(result.exit_code),
        "votes_seen": result.votes_seen,
        "thumbs_down": result.thumbs_down,
        "already_triaged": result.already_triaged,
        "triaged": len(result.entries),
        "not_triaged": _not_triaged(result),
        "layers": dict(sorted(result.layer_counts.items())),
        "written": result.written,
        "judge": result.judge,
        "judge_calls": result.usage.calls,
        "input_tokens": result.usage.input_tokens,
        "output_tokens": result.usage.output_tokens,
        "cost_usd": round(result.cost, 6),
        "cost_usd_billed": round(result.billed_cost, 6),
        "cached_input_tokens": result.usage.cached_input_tokens,
        "batch_calls": result.usage.batch_calls,
        "batch_input_tokens": result.usage.batch_input_tokens,
        "batch_cached_input_tokens": result.usage.batch_cached_input_tokens,
        "batch_output_tokens": result.usage.batch_output_tokens,
        "search_calls": result.search_calls,
        "backend_requests": result.requests,
        "elapsed_seconds": round(result.elapsed, 3),
        # the releases worse than the one before them (the report's Releases section), for an alert
        "releases_flagged": result.releases.watch.flagged if result.releases else [],
        # the judge's last `triage calibrate --write` layer kappa; None: unmeasured (or undefined)
        "judge_layer_kappa": result.judge_measure.kappa if result.judge_measure else None,
    }


def summary_json(result: RunResult) -> str:
    return json.dumps(summary_record(result), indent=2) + "\n"


# -- issue drafts ------------------------------------------------------------------------------
# One Markdown file per owner, and one per signature seen often, ready to paste. Nothing is filed:
# a person reads the draft, checks the traces and files it. File names are made from configuration
# (owners) and signature ids only, never from user text.

DEFAULT_MIN_SIZE = 3  # a signature with this many members in the last nights gets its own draft


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()[:80] or "owner"


def write_issue_drafts(result: RunResult, folder: Path, min_size: int = DEFAULT_MIN_SIZE) -> list[Path]:
    """Write the drafts; returns the files written (owners first, then signatures)."""
    try:
        folder.mkdir(exist_ok=True)
    except OSError as ex:
        raise ConfigError(f"cannot create the issues folder {folder}: {ex.strerror or ex}") from ex
    sigs = {sig.id: sig for sig in result.worklist.signatures} if result.worklist else {}
    written = []
    for owner, by_layer in grouped(result.entries).items():
        items = {layer: by_signature(entries) for layer, entries in by_layer.items()}
        text = templates.get_template("issue_owner.md.j2").render(
            owner=owner,
            count=sum(len(entries) for entries in by_layer.values()),
            by_layer=items,
            result=result,
            sigs=sigs,
            nights=NIGHTS + 1,
            measured=measured(result.judge_measure, result.judge),
        )
        path = folder / f"owner-{_slug(owner)}.md"
        path.write_text(text, encoding="utf-8")
        written.append(path)
    members: dict[str, list[Entry]] = {}
    for entry in result.entries:
        if entry.signature in sigs:
            members.setdefault(entry.signature, []).append(entry)
    for sig_id, entries in members.items():
        sig = sigs[sig_id]
        if sig.count < min_size:
            continue
        owners = list(dict.fromkeys(owner for entry in entries for owner in entry.owners))
        text = templates.get_template("issue_signature.md.j2").render(
            sig=sig, members=entries, sigs=sigs, owners=owners, nights=NIGHTS + 1,
            measured=measured(result.judge_measure, result.judge),
        )  # fmt: skip
        path = folder / f"signature-{_slug(sig.id)}.md"
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


# -- the release watch (`triage releases`) -----------------------------------------------------


def render_releases(window: ReleaseWindow) -> str:
    """`triage releases`' Markdown: the window's releases, each comparison's tests, the gate."""
    text = templates.get_template("release_watch.md.j2").render(w=window)
    return re.sub(r"\n{3,}", "\n\n", text)  # one blank line between blocks, however the parts end


def releases_json(window: ReleaseWindow) -> str:
    return window.model_dump_json(indent=2) + "\n"


#: `--format` of `triage releases`: name -> renderer, the first the default
RELEASES_FORMATS: Mapping[str, Callable[[ReleaseWindow], str]] = {
    "markdown": render_releases,
    "json": releases_json,
}


# -- where a run's outputs go ------------------------------------------------------------------


@dataclass(frozen=True)
class RunOutputs:
    """What `triage feedback` and `triage demo` were asked to leave behind, besides the log."""

    report: bool = False  # the report on standard output
    report_file: Path | None = None
    summary_file: Path | None = None
    issues_dir: Path | None = None
    issue_min_size: int = DEFAULT_MIN_SIZE


def publish_run(result: RunResult, outputs: RunOutputs, stdout: Callable[[str], None]) -> None:
    """The summary to the log, then each output asked for: issue drafts, the summary file, the
    report (to `stdout`, and to its file)."""
    for line in summary_lines(result):
        log.info("summary: %s", line, extra={"event": "summary"})
    if outputs.issues_dir:
        drafts = write_issue_drafts(result, outputs.issues_dir, outputs.issue_min_size)
        log.info("%d issue drafts written to %s", len(drafts), outputs.issues_dir, extra={"event": "issue_drafts"})
    if outputs.summary_file:
        outputs.summary_file.write_text(summary_json(result), encoding="utf-8")
    if outputs.report or outputs.report_file:
        text = render_report(result)
        if outputs.report:
            stdout(text)
        if outputs.report_file:
            outputs.report_file.write_text(text, encoding="utf-8")
            log.info("report written to %s", outputs.report_file, extra={"event": "report_file"})


# -- calibration and evaluation reports --------------------------------------------------------


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


#: `--format` of `triage calibrate` and `triage eval`: name -> renderer, the first the default
CALIBRATION_FORMATS: Mapping[str, Callable[[CalibrationReport], str]] = {
    "markdown": render_calibration,
    "json": calibration_json,
}
EVAL_FORMATS: Mapping[str, Callable[[EvalReport], str]] = {"markdown": render_eval, "json": eval_json}


# -- triage check --------------------------------------------------------------------------------

#: the report's section titles, in its order
CHECK_TITLES: dict[Status, str] = {
    "newly_failing": "Newly failing",
    "still_failing": "Still failing",
    "fixed": "Fixed",
    "undecided": "Undecided",
    "error": "Agent errors",
    "still_passing": "Still passing",
}
NO_OWNER = "(no owner)"


def check_groups(cases: list[CaseReport]) -> dict[Status, dict[str, list[tuple[str | None, list[CaseReport]]]]]:
    """status -> owner -> (signature, cases): owners sorted, signatures in the order of their first
    case (cases in item order); a case with several owners is listed under each."""
    groups: dict[Status, dict[str, dict[str | None, list[CaseReport]]]] = {s: defaultdict(dict) for s in STATUSES}
    for case in sorted(cases, key=lambda c: c.result.case.item_id):
        for owner in case.result.case.owners or [NO_OWNER]:
            groups[case.status][owner].setdefault(case.result.case.signature, []).append(case)
    return {
        status: {owner: list(by_owner[owner].items()) for owner in sorted(by_owner)}
        for status, by_owner in groups.items()
    }


def render_check(result: CheckResult) -> str:
    """`triage check`'s Markdown report; every question, answer, evidence and reason escaped as
    untrusted text. The same result gives the same bytes."""
    owners = sorted({owner for case in result.cases for owner in case.result.case.owners or [NO_OWNER]})
    totals = {owner: dict.fromkeys(CHECK_TITLES, 0) for owner in owners}
    for case in result.cases:
        for owner in case.result.case.owners or [NO_OWNER]:
            totals[owner][case.status] += 1
    return templates.get_template("check.md.j2").render(
        result=result,
        rate=result.pass_rate,
        regressed=len(result.regressed),
        unchecked=len(result.unchecked),
        lost=len(result.lost),
        statuses=list(CHECK_TITLES),
        titles=CHECK_TITLES,
        counts={status: result.count(status) for status in CHECK_TITLES},
        totals=totals,
        groups=check_groups(result.cases),
        passing=sorted(
            (c for c in result.cases if c.status == "still_passing"), key=lambda c: c.result.case.item_id
        ),
    )


def check_record(result: CheckResult) -> dict[str, object]:
    """`triage check --output`: the result as JSON, with the figures the report states."""
    data = result.model_dump(mode="json")
    data.update(
        exit_code=int(result.exit_code),
        passed=result.passed,
        pass_rate=result.pass_rate,
        regressed=[c.result.case.item_id for c in result.regressed],
        unchecked=[c.result.case.item_id for c in result.unchecked],
        lost=[c.result.case.item_id for c in result.lost],
        counts={status: result.count(status) for status in STATUSES},
    )
    return data


def check_json(result: CheckResult) -> str:
    return json.dumps(check_record(result), indent=2, ensure_ascii=False) + "\n"
