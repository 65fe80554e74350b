"""Score configs, annotation queues and their items (`triage queue`).

Page-numbered listings (`page`, `limit` at most 100, `meta.totalPages`), unlike the cursor-paged
score and observation reads. Two Langfuse behaviours shape the writes:

- a queue's name is unique in a project (a second POST is a 409): a 409 means it exists, so it is
  read back instead of retried;
- queue items are NOT de-duplicated (the same object POSTed twice makes two items,
  langfuse/langfuse#12938): the caller lists the items first, and a POST whose answer was lost
  (timeout, dropped connection, 5xx) is checked by listing the items again before it is re-sent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
import pydantic

from triage.domain.review import (
    Category,
    ObjectType,
    QueueItem,
    ReviewQueue,
    ScoreConfig,
    ScoreConfigSpec,
)
from triage.errors import LangfuseError
from triage.sources.langfuse.http import HttpStatus, LangfuseHttp, fail, parsed

log = logging.getLogger("triage.sources.langfuse")

PAGE_LIMIT = 100  # Langfuse's maximum for these listings
MAX_PAGES = 10_000  # a server whose totalPages never ends is stopped here
UNSURE_ROUNDS = 3  # lost answers to an item POST, each checked by a listing, before giving up

R = TypeVar("R")


class _Wire(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="ignore", populate_by_name=True)


class PageMeta(_Wire):
    page: int
    limit: int
    total_items: int = pydantic.Field(alias="totalItems")
    total_pages: int = pydantic.Field(alias="totalPages")


class WireCategory(_Wire):
    label: str
    value: float


class ScoreConfigRow(_Wire):
    id: str
    name: str
    data_type: str = pydantic.Field(alias="dataType")
    is_archived: bool = pydantic.Field(default=False, alias="isArchived")
    categories: list[WireCategory] | None = None
    description: str | None = None
    min_value: float | None = pydantic.Field(default=None, alias="minValue")
    max_value: float | None = pydantic.Field(default=None, alias="maxValue")


class QueueRow(_Wire):
    id: str
    name: str
    description: str | None = None
    score_config_ids: list[str] = pydantic.Field(default_factory=list, alias="scoreConfigIds")


class QueueItemRow(_Wire):
    id: str
    queue_id: str = pydantic.Field(alias="queueId")
    object_id: str = pydantic.Field(alias="objectId")
    object_type: str = pydantic.Field(alias="objectType")
    status: str


class Page(_Wire, Generic[R]):
    """One page of a page-numbered listing (`PaginatedAnnotationQueues`, `ScoreConfigs`, ...)."""

    data: list[R]
    meta: PageMeta


class _Unsure(Exception):
    """A write whose answer was lost: it may or may not have landed."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class _Conflict(Exception):
    """A 409: the object exists already."""


_SAFE_TRANSPORT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)  # nothing was sent


def _config(row: ScoreConfigRow) -> ScoreConfig:
    categories = (
        None if row.categories is None else [Category(label=c.label, value=c.value) for c in row.categories]
    )
    return ScoreConfig(
        id=row.id,
        name=row.name,
        data_type=row.data_type,
        is_archived=row.is_archived,
        categories=categories,
        description=row.description,
        min_value=row.min_value,
        max_value=row.max_value,
    )


def _queue(row: QueueRow) -> ReviewQueue:
    return ReviewQueue(id=row.id, name=row.name, score_config_ids=list(row.score_config_ids))


def _item(row: QueueItemRow) -> QueueItem:
    return QueueItem(id=row.id, object_id=row.object_id, object_type=row.object_type, status=row.status)


def config_body(spec: ScoreConfigSpec) -> dict[str, Any]:
    """The POST body of a score config (a BOOLEAN config takes no categories: Langfuse makes them)."""
    body: dict[str, Any] = {"name": spec.name, "dataType": spec.data_type}
    if spec.data_type == "CATEGORICAL":
        body["categories"] = [{"label": c.label, "value": c.value} for c in spec.categories or []]
    if spec.data_type == "NUMERIC":
        body.update(minValue=spec.min_value, maxValue=spec.max_value)
    if spec.description:
        body["description"] = spec.description
    return body


class LangfuseAnnotations:
    """`AnnotationPort` on Langfuse's public API (`triage.domain.review`)."""

    def __init__(self, http: LangfuseHttp) -> None:
        self.http = http

    # -- reads ----------------------------------------------------------------------------------

    def _rows(self, what: str, path: str, model: type[Page[R]]) -> Iterator[R]:
        """The rows of every page, page 1 first, until `meta.totalPages`."""
        page = 1
        while page <= MAX_PAGES:
            rows = parsed(what, model, self._get(what, path, {"page": page, "limit": PAGE_LIMIT}))
            yield from rows.data
            if page >= rows.meta.total_pages or not rows.data:
                return
            page += 1
        raise LangfuseError(f"{what}: more than {MAX_PAGES} pages")

    def _get(self, what: str, path: str, params: dict[str, Any]) -> Any:
        try:
            return self.http.call(what, lambda: self.http.raw("GET", path, params=params))
        except HttpStatus as ex:
            raise fail(what, ex) from None

    def score_configs(self) -> list[ScoreConfig]:
        rows = self._rows("reading score configs", "api/public/score-configs", Page[ScoreConfigRow])
        return [_config(row) for row in rows]

    def queues(self) -> list[ReviewQueue]:
        rows = self._rows("reading annotation queues", "api/public/annotation-queues", Page[QueueRow])
        return [_queue(row) for row in rows]

    def queue_items(self, queue_id: str) -> list[QueueItem]:
        path = f"api/public/annotation-queues/{quote(queue_id, safe='')}/items"
        items: dict[str, QueueItem] = {}
        for row in self._rows("reading the annotation queue's items", path, Page[QueueItemRow]):
            items[row.id] = _item(row)  # offset paging repeats a row when items are added meanwhile
        return list(items.values())

    # -- writes ---------------------------------------------------------------------------------

    def _post(self, what: str, path: str, body: dict[str, Any], *, unsure: bool = False) -> Any:
        """POST with the usual retries for failures that prove nothing landed (refused connections,
        429). With `unsure`, a failure after the request may have been processed raises `_Unsure`;
        a 409 raises `_Conflict`."""

        def send() -> Any:
            try:
                return self.http.raw("POST", path, json_body=body)
            except HttpStatus as ex:
                if ex.status == 409:
                    raise _Conflict(ex.detail()) from ex
                if unsure and ex.status >= 500:
                    raise _Unsure(ex) from ex
                raise
            except _SAFE_TRANSPORT:
                raise
            except httpx.TransportError as ex:
                if unsure:
                    raise _Unsure(ex) from ex
                raise

        try:
            return self.http.call(what, send)
        except HttpStatus as ex:
            raise fail(what, ex) from None

    def create_score_config(self, spec: ScoreConfigSpec) -> ScoreConfig:
        """Create it. Names are not unique in Langfuse, so a lost answer is checked by listing the
        configs (one of that name and type that was not there before) before the POST is re-sent."""
        what = f"creating score config {spec.name!r}"
        before = {c.id for c in self.score_configs()}

        def landed() -> ScoreConfig | None:
            return next(
                (
                    c
                    for c in self.score_configs()
                    if c.id not in before and c.name == spec.name and c.data_type == spec.data_type
                ),
                None,
            )

        answer = self._post_checked(what, "api/public/score-configs", config_body(spec), landed)
        return answer if isinstance(answer, ScoreConfig) else _config(parsed(what, ScoreConfigRow, answer))

    def _post_checked(self, what: str, path: str, body: dict[str, Any], landed: Callable[[], Any]) -> Any:
        """POST a write Langfuse does not de-duplicate: on a lost answer, `landed()` (a listing)
        says whether it arrived; only if not is it sent again. The JSON answer, or what `landed` found."""
        lost: BaseException | None = None
        for _ in range(UNSURE_ROUNDS):
            try:
                return self._post(what, path, body, unsure=True)
            except _Unsure as ex:
                lost = ex.cause
                log.info(
                    "langfuse %s: the answer was lost (%s); checking whether it landed",
                    what,
                    type(lost).__name__,
                )
                found = landed()
                if found is not None:
                    return found
            except _Conflict as ex:
                raise LangfuseError(f"{what} failed: {ex}") from None
        raise LangfuseError(f"{what}: gave up after {UNSURE_ROUNDS} lost answers ({type(lost).__name__})")

    def create_queue(
        self, name: str, description: str | None, score_config_ids: Sequence[str]
    ) -> ReviewQueue:
        what = f"creating annotation queue {name!r}"
        body: dict[str, Any] = {"name": name, "scoreConfigIds": list(score_config_ids)}
        if description:
            body["description"] = description
        try:
            answer = self._post(what, "api/public/annotation-queues", body)
        except _Conflict:
            # its name is taken: created by an earlier attempt whose answer was lost, or by someone else
            existing = [q for q in self.queues() if q.name == name]
            if not existing:
                raise LangfuseError(f"{what}: Langfuse says the name exists, but no queue has it") from None
            return existing[0]
        return _queue(parsed(what, QueueRow, answer))

    def add_item(self, queue_id: str, object_id: str, object_type: ObjectType = "TRACE") -> QueueItem:
        what = f"adding {object_type.lower()} {object_id} to the annotation queue"
        path = f"api/public/annotation-queues/{quote(queue_id, safe='')}/items"
        # the object alone: no status, no score, nothing a reviewer could be anchored by
        body = {"objectId": object_id, "objectType": object_type}

        def landed() -> QueueItem | None:
            items = self.queue_items(queue_id)
            return next((i for i in items if i.object_id == object_id and i.object_type == object_type), None)

        answer = self._post_checked(what, path, body, landed)
        return answer if isinstance(answer, QueueItem) else _item(parsed(what, QueueItemRow, answer))
