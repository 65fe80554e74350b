"""The text of a signature's tracker issue and its comments (`triage issues sync`), fit for a public
tracker: the question, the layer, the public docs pages and links to the traces (which need a
Langfuse login), never a user's comment (unless `[tracker] include_comments`) or identity; every
field masked (`redact.mask_private`: secrets, e-mails, credentials in URLs, tokens, keys) and
escaped (`report.md`), each carrying the marker the sync finds it by again."""

from __future__ import annotations

import re
from collections.abc import Callable

from triage.domain.tracker import Event, SignatureState, SyncResult, as_of_marker, event_marker, issue_marker
from triage.redact import mask_private
from triage.sinks.report import code, md

TITLE_CHARS = 120

#: a link the issue may make clickable: https, a plain host and path, nothing that could carry a
#: script or break out of the Markdown link
_SAFE_URL = re.compile(r"https://[A-Za-z0-9.-]+(?::\d+)?(?:/[A-Za-z0-9._~/%+#=&?-]*)?")


def _text(value: str, limit: int = 300) -> str:
    return md(mask_private(value), limit)


def _link(label: str, url: str | None) -> str:
    if url and _SAFE_URL.fullmatch(url) and "@" not in url:
        return f"[{md(label, 80)}]({url})"
    return md(mask_private(url or label), 200)


def _day(state: SignatureState) -> str:
    return state.at.strftime("%Y-%m-%d")


def issue_title(state: SignatureState) -> str:
    """`[triage] retrieval / katib: <the signature's first question>`, masked and cut."""
    title = " ".join(mask_private(state.title).split())
    head = f"[triage] {state.layer} / {state.component}: "
    room = max(TITLE_CHARS - len(head), 20)
    return head + (title if len(title) <= room else title[: room - 1].rstrip() + "…")


def issue_body(
    state: SignatureState, *, trust: str, trace_url: Callable[[str], str | None], include_comments: bool
) -> str:
    """The issue as opened: what fails, since when and in which releases, where the docs answer it,
    the traces, and why the verdict is trusted."""
    releases = f"first seen in release {code(state.first_release)}" if state.first_release else "no release recorded"
    if state.last_release and state.last_release != state.first_release:
        releases += f", last in {code(state.last_release)}"
    lines = [
        issue_marker(state.signature),
        as_of_marker(state),
        f"**Layer** {code(state.layer)} · **component** {code(state.component)} · "
        f"**signature** {code(state.signature)}",
        "",
        f"{state.count} failure(s) over the last {len(state.nights)} nights, {state.tonight} on the night of "
        f"{_day(state)} ({state.share:.0%} of that night's failures); {releases}."
        + (f" Escalating (one-sided Fisher p = {state.escalation_p:.3g})." if state.escalating and state.escalation_p
           is not None else ""),
        "",
        "**What users asked**",
        "",
        *(f"- {_text(q)}" for q in state.questions),
    ]
    if state.pages:
        lines += ["", "**Where the docs answer it**", "", *(f"- {_link(p, p)}" for p in state.pages)]
    if include_comments and state.comments:
        lines += ["", "**What users said**", "", *(f"- {_text(c)}" for c in state.comments)]
    lines += [
        "",
        "**Traces** (a Langfuse login is needed)",
        "",
        *(f"- {_link(t, trace_url(t))}" for t in state.traces[:10]),
        "",
        f"Verdict trusted: {md(trust, 200)}. Judge: {code(state.judge or 'unknown')}.",
        "",
        "_Kept in step by `triage issues sync`: a comment when it recurs, escalates or regresses; closed "
        "when `triage check` shows it fixed in a release._",
    ]
    return "\n".join(lines) + "\n"


def event_comment(state: SignatureState, event: Event) -> str:
    """The comment telling an open (or reopened) issue of one event, with the event's marker."""
    if event.kind == "fixed":
        said = (
            f"Fixed in release {code(state.fixed_in)}: check run {code(state.fixed_by)} passed every "
            "regression case of this signature. Closing; it is reopened if it comes back in that release "
            "or a later one."
        )
    elif event.kind == "regressed":
        said = (
            f"Regressed in release {code(state.regressed_in)} (fixed in {code(state.fixed_in)} by check run "
            f"{code(state.fixed_by)}): {state.tonight} failure(s) on the night of {_day(state)}."
        )
    elif event.kind == "escalating":
        p = f" (one-sided Fisher p = {state.escalation_p:.3g})" if state.escalation_p is not None else ""
        said = f"Escalating on the night of {_day(state)}: {state.share:.0%} of the night's failures{p}."
    else:
        release = f" (release {code(state.last_release)})" if state.last_release else ""
        said = (
            f"Seen again on the night of {_day(state)}: {state.tonight} failure(s){release}, "
            f"{state.count} over the last {len(state.nights)} nights."
        )
    return f"{event_marker(state.signature, event.key)}\n{said}\n"


def render_sync(result: SyncResult) -> str:
    """`triage issues sync`'s report: the steps (planned, or done with their issue), the drafts
    left in the report with why, and what could not be read."""
    mode = "applied" if result.applied else "dry run (nothing written; --apply writes)"
    lines = [f"# Issues sync: {mode}", ""]
    if not result.looked_up:
        lines += ["No GitHub token: the owners' trackers were not read; planned as if no issue existed yet.", ""]
    lines += [
        f"{result.signatures} signature(s) read, {result.below} below the thresholds ([tracker] min_count, "
        f"min_share, escalating); {len(result.steps)} step(s), {len(result.drafts)} draft(s).",
        "",
    ]
    if result.steps:
        lines += ["| step | signature | repository | issue | what |", "|---|---|---|---|---|"]
        for step in result.steps:
            issue = f"#{step.number}" if step.number is not None else "new"
            done = _link(step.url, step.url) if step.url else md(step.title, 120)
            what = md(step.error, 200) if step.error else done
            lines.append(f"| {step.kind} | {code(step.signature)} | {code(step.repo)} | {issue} | {what} |")
        lines.append("")
    if result.drafts:
        lines += ["## Drafts (not filed)", "", "| signature | owner | title | why not |", "|---|---|---|---|"]
        for draft in result.drafts:
            title, why = _text(draft.title, 100), md(draft.reason, 200)
            lines.append(f"| {code(draft.signature)} | {code(draft.owner)} | {title} | {why} |")
        lines.append("")
    if result.unreadable:
        lines += ["## Unreadable states", "", *(f"- {md(r, 200)}" for r in result.unreadable), ""]
    if result.failed:
        lines += [f"{len(result.failed)} step(s) failed: a rerun finishes them (nothing is done twice).", ""]
    return "\n".join(lines)
