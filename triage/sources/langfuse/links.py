"""Links to traces in the Langfuse UI: the project id is read once, when the source opens."""

from __future__ import annotations

import logging
from urllib.parse import quote

from triage.errors import LangfuseError
from triage.retry import RetryPolicy
from triage.sources.langfuse.http import HttpStatus, LangfuseHttp, short
from triage.sources.langfuse.wire import ProjectsPage

log = logging.getLogger("triage.sources.langfuse")

#: a link is a convenience: a few quick tries, never the whole deadline of a data read
LINKS_RETRY = RetryPolicy(attempts=3, initial=0.5, maximum=2.0)


class TraceLinks:
    """`url(trace_id)` with no I/O, after `resolve()` has read the project id (or failed to)."""

    def __init__(self, base_url: str, project_id: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.project_id = project_id

    def resolve(self, http: LangfuseHttp, retry: RetryPolicy = LINKS_RETRY) -> None:
        """Read the project id. Without one there are no links (logged); refused keys raise."""
        try:
            projects = http.call(
                "reading the project",
                lambda: ProjectsPage.model_validate(http.raw("GET", "api/public/projects")),
                retry=retry,
            )
            self.project_id = projects.data[0].id if projects.data else None
        except (LangfuseError, HttpStatus) as ex:
            log.warning("no trace links: the project could not be read (%s)", short(ex))
            self.project_id = None

    def url(self, trace_id: str) -> str | None:
        if self.project_id is None:
            return None
        return f"{self.base_url}/project/{quote(self.project_id, safe='')}/traces/{quote(trace_id, safe='')}"
