"""The HTTP API's routes: the reference's enqueue and status endpoints, operating the queue
(list, retry, cancel and delete jobs; pause and resume queues), runs, health and metrics.

``create_router(app)`` is a FastAPI router to mount in your own application;
``create_api(app)`` wraps it in a FastAPI app, which ``cronlock serve`` runs with uvicorn. Both
are the same code. Every write validates first and writes in one transaction, so a bad request
gets a 4xx with a readable ``detail`` and leaves nothing behind. Who may call which route, and
how that is decided before a body is read, is ``access.py``'s: here each route names its
surface and the router is built on its ``GuardedRoute``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Iterable
from datetime import datetime
from typing import Annotated, Any, TypeVar

from .. import schema, sql
from ..app import App
from ..errors import (
    ConfigurationError,
    CronlockError,
    DatabaseUnavailable,
    InvalidJobOption,
    InvalidPayload,
    JobNotFound,
    UnknownTask,
)
from ..outcome import JobStatus, RunResult
from ..queue.cancel import DEFAULT_CANCEL_WAIT
from ..queue.control import QueueInfo, QueueState
from ..queue.jobs import MAX_CONCURRENCY_LIMIT, MAX_DELAY, MAX_NAME_LENGTH, MAX_RETRIES_LIMIT
from ..queue.operate import MAX_PAGE_SIZE, ChangeOutcome, JobChange, JobFilter
from .access import TOKEN_ENV, Access, Guard, GuardedRoute, Surface

try:
    from fastapi import APIRouter, FastAPI, HTTPException, Path, Query, Request, Security
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, RedirectResponse, Response
    from pydantic import (
        BaseModel,
        ConfigDict,
        Field,
        StrictBool,
        StrictFloat,
        StrictInt,
        StrictStr,
        field_validator,
        model_validator,
    )

    from ..observe.prometheus import CONTENT_TYPE, render_metrics, scrape
    from .dashboard import create_dashboard
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ConfigurationError(
        "the HTTP API needs the 'http' extra: pip install 'cronlock[http]'"
    ) from exc

__all__ = ["DASHBOARD_PATH", "create_api", "create_router"]

logger = logging.getLogger("cronlock.http")

T = TypeVar("T")

# Where `cronlock serve` (create_api) mounts the dashboard; / redirects there.
DASHBOARD_PATH = "/dashboard"

# A queue's name in a route's path, with the Python API's limits.
QueueName = Annotated[str, Path(min_length=1, max_length=MAX_NAME_LENGTH)]


class ErrorBody(BaseModel):
    """Every error answer: one readable line, and the field errors for a 422."""

    detail: str
    errors: list[dict[str, Any]] | None = None


class EnqueueRequest(BaseModel):
    """The body of ``POST /jobs``: the types are checked here (strictly: no coercion of "3" to
    3), the limits are the Python API's own (``queue.jobs``), which checks them again."""

    model_config = ConfigDict(extra="forbid")

    job_type: StrictStr = Field(min_length=1, max_length=MAX_NAME_LENGTH)
    payload: dict[str, Any] = Field(default_factory=dict, description="A JSON object.")
    max_retries: StrictInt | None = Field(default=None, ge=0, le=MAX_RETRIES_LIMIT)
    delay: StrictInt | StrictFloat | None = Field(
        default=None, ge=0, le=MAX_DELAY.total_seconds(), description="Seconds from now."
    )
    run_at: datetime | None = Field(default=None, description="An aware ISO 8601 time.")
    priority: StrictInt = Field(default=0, ge=-(2**31), lt=2**31)
    queue: StrictStr | None = Field(default=None, min_length=1, max_length=MAX_NAME_LENGTH)
    dedup_key: StrictStr | None = Field(default=None, min_length=1, max_length=MAX_NAME_LENGTH)
    concurrency_key: StrictStr | None = Field(
        default=None, min_length=1, max_length=MAX_NAME_LENGTH
    )
    concurrency_limit: StrictInt | None = Field(default=None, ge=1, le=MAX_CONCURRENCY_LIMIT)
    timeout: StrictInt | StrictFloat | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="Seconds a run may take."
    )
    allow_unknown: StrictBool = Field(
        default=False, description="Enqueue a job type the server's app does not know."
    )
    depends_on: list[uuid.UUID] | None = Field(
        default=None,
        max_length=10_000,
        description="Ids of existing jobs: this one runs once they all completed.",
    )

    @model_validator(mode="after")
    def _one_schedule(self) -> EnqueueRequest:
        if self.delay is not None and self.run_at is not None:
            raise ValueError("give delay or run_at, not both")
        if self.run_at is not None and self.run_at.tzinfo is None:
            raise ValueError("run_at needs a timezone (for example 2026-12-01T10:00:00Z)")
        return self


class EnqueueResponse(BaseModel):
    """``job_id`` is the reference's name for the id; ``id`` is kept beside it."""

    job_id: uuid.UUID
    id: uuid.UUID
    created: bool
    detail: str
    warning: str | None = None


class JobTypeView(BaseModel):
    """A job type this app enqueues: its defaults, whether this app has its handler (else it
    is only declared), and the JSON Schema of its payload and of its result (null: any JSON
    object, any JSON) for a producer in another language to check what it sends."""

    job_type: str
    queue: str
    max_retries: int
    concurrency_limit: int | None
    handled: bool
    payload_model: str | None
    payload_schema: dict[str, Any] | None
    result_model: str | None
    result_schema: dict[str, Any] | None


class JobView(BaseModel):
    """A job's row. Its times are the database's clock, whichever host ran the job:
    ``created_at`` its enqueue, ``started_at`` its last claim, ``completed_at`` the statement
    that wrote its outcome (just before that outcome's commit), ``run_at`` of a retry or a
    snooze, and the ``at``/``until`` of an ``error_history`` entry too."""

    id: uuid.UUID
    job_type: str
    queue: str
    status: str
    priority: int
    payload: Any
    result: Any
    retry_count: int
    max_retries: int
    error_message: str | None
    error_history: list[dict[str, Any]]
    created_at: datetime
    run_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    cancel_requested_at: datetime | None = None
    depends_on: list[uuid.UUID] = Field(
        default_factory=list, description="The jobs it waits for (status blocked) or waited for."
    )
    parents_left: int | None = Field(
        default=None, description="How many of depends_on have not completed yet."
    )

    @field_validator("depends_on", mode="before")
    @classmethod
    def _no_parents(cls, value: Any) -> Any:
        return [] if value is None else value  # the row's NULL: enqueued without depends_on


class JobPageView(BaseModel):
    """A page of jobs, newest first; ``next_cursor`` (null on the last page) for the next."""

    jobs: list[JobView]
    next_cursor: str | None


class JobChangeView(BaseModel):
    """What a retry, cancel or delete did: ``outcome`` (retried, cancelled, deleted) and the
    job's status now (null once deleted)."""

    id: uuid.UUID
    outcome: str
    changed: bool
    status: str | None
    detail: str


class QueueStateView(BaseModel):
    queue: str
    paused: bool
    paused_at: datetime | None
    changed: bool


class QueueDeletionView(BaseModel):
    queue: str
    deleted: bool
    was_paused: bool
    has_jobs: bool
    detail: str


class QueueView(BaseModel):
    queue: str
    paused: bool
    paused_at: datetime | None
    counts: dict[str, int]
    counts_capped: list[str]  # statuses counted up to the cap: at least that many
    due: int
    oldest_due_age_seconds: float | None
    active_drainers: int
    standby_drainers: int
    unserved: bool
    handled_here: bool


class RunView(BaseModel):
    id: int
    task: str
    slot: datetime | None
    status: str
    started_at: datetime
    finished_at: datetime | None
    items_ok: int
    items_failed: int
    items_parked: int = 0
    failures: list[dict[str, Any]]
    error: str | None
    skip_reason: str | None
    host: str
    pid: int | None
    trigger: str
    lateness_ms: float | None


class TaskStateView(BaseModel):
    task: str
    paused: bool
    paused_at: datetime | None
    paused_by: str | None
    changed: bool


class FailingItemView(BaseModel):
    """An item of a task that failed in its latest ``failures`` runs; ``parked`` once it
    reached the task's ``park_after`` (later runs leave it out)."""

    task: str
    item: str
    parked: bool
    failures: int
    error: str
    first_failed_at: datetime
    last_failed_at: datetime
    parked_at: datetime | None


class Health(BaseModel):
    status: str
    revision: str | None = None
    detail: str | None = None


# A periodic task's name in a path.
TaskName = Annotated[str, Path(min_length=1, max_length=MAX_NAME_LENGTH)]

# The longest an HTTP cancel waits for a running job to stop (a client's request timeout).
MAX_CANCEL_WAIT = 60.0
# The longest GET /jobs/{id}?wait= holds a request (a long-poll: the client asks again).
MAX_WAIT = 60.0


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": ErrorBody} for code in codes}


def create_router(
    app: App,
    *,
    token: str | None = None,
    read_token: str | None = None,
    public: Iterable[str] | str | None = None,
) -> APIRouter:
    """The API's routes for ``app``. ``token`` (default ``$CRONLOCK_API_TOKEN``) opens every
    route, ``read_token`` (default ``$CRONLOCK_API_READ_TOKEN``) every route but writes;
    ``public`` names the surfaces that need no token (``reads``, ``metrics``, ``healthz``;
    default ``$CRONLOCK_API_PUBLIC``, then ``healthz``). With no token at all, every route
    answers anyone, and this logs a WARNING saying so."""
    access = Access.configure(token=token, read_token=read_token, public=public)
    if access.open:
        logger.warning(
            "the HTTP API has no token: every endpoint, POST /jobs included, answers anyone "
            "who can reach it (set %s)",
            TOKEN_ENV,
            extra={"action": "http_open"},
        )
    router = APIRouter(route_class=GuardedRoute)

    def guarded(
        surface: Surface, *codes: int, responses: dict[int | str, dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        """A route's guard (none when its surface is public) and the answers it documents."""
        if access.needs_token(surface):
            dependencies = [Security(Guard(access, surface))]
            codes = (401, 403, *codes) if surface == "writes" else (401, *codes)
        else:
            dependencies = []
        return {"dependencies": dependencies, "responses": {**(responses or {}), **_errors(*codes)}}

    @router.post(
        "/jobs",
        status_code=201,
        response_model=EnqueueResponse,
        **guarded("writes", 413, 422, responses={200: {"model": EnqueueResponse}}),
        summary="Enqueue a job",
    )
    async def enqueue(body: EnqueueRequest) -> Response:
        # Committed on its own (one INSERT without a dedup key); bad input writes nothing.
        # The body's other fields are the enqueue's options, by name.
        given = body.model_dump(exclude={"job_type", "payload"})
        try:
            answer = await app.enqueue(body.job_type, body.payload, **given)
        except DatabaseUnavailable:
            raise  # a 503 (GuardedRoute), not the request's fault
        except InvalidPayload as exc:
            if not exc.errors:
                raise HTTPException(422, str(exc)) from None
            # A typed payload's fields, where a client looks for them: as a body's own.
            errors = [{**error, "loc": ["body", "payload", *error["loc"]]} for error in exc.errors]
            refused = ErrorBody(detail=str(exc), errors=errors)
            return JSONResponse(refused.model_dump(), status_code=422)
        except CronlockError as exc:
            raise HTTPException(422, str(exc)) from None
        warning = (
            None
            if app.knows(body.job_type)
            else f"job type {body.job_type!r} has no handler or declaration in this app: only "
            "a drainer whose app registers its handler runs it"
        )
        detail = (
            "enqueued"
            if answer.created
            else "not enqueued: a waiting job already holds this dedup_key; this is its id"
        )
        view = EnqueueResponse(
            job_id=answer.id, id=answer.id, created=answer.created, detail=detail, warning=warning
        )
        return JSONResponse(
            view.model_dump(mode="json"), status_code=201 if answer.created else 200
        )

    @router.get("/jobs", response_model=JobPageView, **guarded("reads", 422), summary="Find jobs")
    async def list_jobs(
        status: Annotated[list[JobStatus] | None, Query()] = None,
        queue: Annotated[str | None, Query(min_length=1, max_length=MAX_NAME_LENGTH)] = None,
        job_type: Annotated[str | None, Query(min_length=1, max_length=MAX_NAME_LENGTH)] = None,
        created_after: Annotated[datetime | None, Query()] = None,
        created_before: Annotated[datetime | None, Query()] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE)] = 50,
        cursor: Annotated[str | None, Query(max_length=200)] = None,
    ) -> JobPageView:
        try:
            where = JobFilter(
                status=status,
                queue=queue,
                job_type=job_type,
                created_after=created_after,
                created_before=created_before,
            )
            page = await app.list_jobs(where, limit=limit, cursor=cursor)
        except DatabaseUnavailable:
            raise  # a 503 (GuardedRoute), not the request's fault
        except CronlockError as exc:
            raise HTTPException(422, str(exc)) from None
        return JobPageView.model_validate(page.to_dict())

    def _changed(change: JobChange) -> JobChangeView:
        """200 with what changed; 404 for no such job; 409 when the job's state forbids it
        (running now, a status the verb does not act on, its dedup key held)."""
        if change.outcome is ChangeOutcome.NOT_FOUND:
            raise HTTPException(404, change.detail)
        if not change.changed:
            raise HTTPException(409, f"{change.outcome.value}: {change.detail}")
        return JobChangeView.model_validate(change.to_dict())

    @router.post(
        "/jobs/{job_id}/retry",
        response_model=JobChangeView,
        **guarded("writes", 404, 409, 422),
        summary="Make a failed or retrying job due now",
    )
    async def retry_job(job_id: Annotated[uuid.UUID, Path()]) -> JobChangeView:
        return _changed(await app.retry_job(job_id))

    @router.post(
        "/jobs/{job_id}/cancel",
        response_model=JobChangeView,
        **guarded("writes", 404, 409, 422, responses={202: {"model": JobChangeView}}),
        summary="Cancel a job: a waiting one at once, a running one cooperatively",
    )
    async def cancel_job(
        job_id: Annotated[uuid.UUID, Path()],
        wait: Annotated[float, Query(ge=0, le=MAX_CANCEL_WAIT)] = DEFAULT_CANCEL_WAIT,
    ) -> Response:
        """200 ``cancelled``; 202 ``cancel_requested`` when the drainer running the job has
        not stopped it within ``wait`` seconds (the request stands); 409 ``completed`` when it
        completed first, or for a job not waiting or running; 404."""
        change = await app.cancel_job(job_id, wait=wait)
        if change.outcome is ChangeOutcome.CANCEL_REQUESTED:
            view = JobChangeView.model_validate(change.to_dict())
            return JSONResponse(view.model_dump(mode="json"), status_code=202)
        changed = _changed(change)
        return JSONResponse(changed.model_dump(mode="json"), status_code=200)

    @router.delete(
        "/jobs/{job_id}",
        response_model=JobChangeView,
        **guarded("writes", 404, 409, 422),
        summary="Delete a finished job",
    )
    async def delete_job(job_id: Annotated[uuid.UUID, Path()]) -> JobChangeView:
        return _changed(await app.delete_job(job_id))

    def _state(state: QueueState) -> QueueStateView:
        return QueueStateView.model_validate(state.to_dict())

    @router.post(
        "/queues/{name}/pause",
        response_model=QueueStateView,
        **guarded("writes", 422),
        summary="Pause a queue for every drainer",
    )
    async def pause_queue(
        name: QueueName,
        create: bool = False,
    ) -> QueueStateView:
        try:
            return _state(await app.pause_queue(name, create=create))
        except InvalidJobOption as exc:  # a queue nothing knows of: a typo?
            raise HTTPException(422, str(exc)) from None

    @router.delete(
        "/queues/{name}",
        response_model=QueueDeletionView,
        **guarded("writes", 404, 409, 422),
        summary="Delete an empty queue's row",
    )
    async def delete_queue(
        name: QueueName,
    ) -> QueueDeletionView:
        done = await app.delete_queue(name)
        if not done.deleted:
            raise HTTPException(409 if done.has_jobs else 404, done.detail)
        return QueueDeletionView.model_validate(done.to_dict())

    @router.post(
        "/queues/{name}/resume",
        response_model=QueueStateView,
        **guarded("writes", 422),
        summary="Resume a paused queue",
    )
    async def resume_queue(
        name: QueueName,
    ) -> QueueStateView:
        return _state(await app.resume_queue(name))

    async def _of_task(work: Awaitable[T]) -> T:
        """A periodic task's verb: an unknown task is a 404."""
        try:
            return await work
        except UnknownTask as exc:
            raise HTTPException(404, str(exc)) from None

    @router.post(
        "/tasks/{name}/pause",
        response_model=TaskStateView,
        **guarded("writes", 404, 422),
        summary="Pause a periodic task everywhere (its slots are recorded skipped: paused)",
    )
    async def pause_task(
        name: TaskName,
        request: Request,
        by: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
    ) -> TaskStateView:
        who = by or f"http from {request.client.host if request.client else 'unknown'}"
        state = await _of_task(app.tasks.pause(name, by=who))
        return TaskStateView.model_validate(state.to_dict())

    @router.post(
        "/tasks/{name}/resume",
        response_model=TaskStateView,
        **guarded("writes", 404, 422),
        summary="Resume a paused periodic task",
    )
    async def resume_task(name: TaskName) -> TaskStateView:
        state = await _of_task(app.tasks.resume(name))
        return TaskStateView.model_validate(state.to_dict())

    @router.post(
        "/tasks/{name}/run",
        **guarded("writes", 404, 422),
        summary="Run a periodic task now, in this server, under its lock (a manual run)",
    )
    async def run_task_now(name: TaskName) -> dict[str, Any]:
        """The run's outcome once it ended (``skipped``, ``lock_busy``, while another run
        holds the task's lock). It runs here, in the server's process, which has the app and
        its database: no scheduler need be running (a crontab-only deployment has none)."""
        result: RunResult = await _of_task(app.tasks.run_now(name))
        return result.to_dict()

    @router.get(
        "/tasks/{name}/parked",
        response_model=list[FailingItemView],
        **guarded("reads", 404, 422),
        summary="A periodic task's failing items, parked ones first, with their last error",
    )
    async def parked_items(name: TaskName) -> list[FailingItemView]:
        found = await _of_task(app.tasks.parked(name))
        return [FailingItemView.model_validate(item.to_dict()) for item in found]

    def _job_type(name: str) -> JobTypeView:
        defaults = app.job_types[name]
        handler = app.handlers.get(name)
        payload = defaults.payload_model
        result = defaults.result_model
        return JobTypeView(
            job_type=name,
            queue=defaults.queue,
            max_retries=defaults.max_retries,
            concurrency_limit=defaults.concurrency_limit,
            handled=handler is not None,
            payload_model=None if payload is None else payload.name,
            payload_schema=None if payload is None else payload.json_schema(),
            result_model=None if result is None else result.name,
            result_schema=None if result is None else result.json_schema(),
        )

    @router.get(
        "/job-types",
        response_model=list[JobTypeView],
        **guarded("reads"),
        summary="The job types this app enqueues, with their payloads' JSON Schema",
    )
    async def list_job_types() -> list[JobTypeView]:
        return [_job_type(name) for name in sorted(app.job_types)]

    @router.get(
        "/job-types/{job_type}",
        response_model=JobTypeView,
        **guarded("reads", 404, 422),
        summary="A job type, with its payload's JSON Schema",
    )
    async def get_job_type(
        job_type: Annotated[str, Path(min_length=1, max_length=MAX_NAME_LENGTH)],
    ) -> JobTypeView:
        if job_type not in app.job_types:
            raise HTTPException(404, f"no job type {job_type!r} in this app")
        return _job_type(job_type)

    @router.get("/queues", response_model=list[QueueView], **guarded("reads"), summary="Queues")
    async def list_queues() -> list[QueueView]:
        found: list[QueueInfo] = await app.queues()
        return [QueueView.model_validate(queue.to_dict()) for queue in found]

    @router.get(
        "/jobs/{job_id}", response_model=JobView, **guarded("reads", 404, 422), summary="A job"
    )
    async def get_job(
        job_id: Annotated[uuid.UUID, Path()],
        wait: Annotated[
            float | None,
            Query(
                ge=0,
                le=MAX_WAIT,
                description="Seconds to wait for the job to end (long-poll): the answer comes "
                "as soon as it completes, fails or is cancelled, or after that long as it is.",
            ),
        ] = None,
    ) -> JobView:
        if wait:
            try:
                await app.wait_for_end(job_id, timeout=wait)
            except TimeoutError:
                pass  # answered as it is now: the client reads its status
            except JobNotFound:
                raise HTTPException(404, f"no job {job_id}") from None
        job = await app.get_job(job_id)
        if job is None:
            raise HTTPException(404, f"no job {job_id}")
        return JobView.model_validate(job.to_dict())

    @router.get(
        "/runs", response_model=list[RunView], **guarded("reads", 422), summary="Recent runs"
    )
    async def list_runs(
        task: Annotated[str | None, Query(max_length=200)] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    ) -> list[RunView]:
        async with app.database.connect() as conn:
            rows = await conn.execute(sql.RUN_RECENT, {"task": task, "limit": limit})
            return [RunView.model_validate(dict(row)) for row in rows.mappings()]

    @router.get(
        "/healthz",
        response_model=Health,
        **guarded("healthz", responses={503: {"model": Health}}),
        summary="Database reachable and migrated",
    )
    async def healthz(request: Request) -> Response:
        try:
            await schema.ensure_ready(app.database)
        except CronlockError as exc:
            # The reason names the database's host and name: a public /healthz gives it only
            # to a caller with a token (a load balancer needs the status code alone).
            told = access.open or access.grant(request.headers.get("authorization")) is not None
            health = Health(status="unavailable", detail=str(exc) if told else None)
            return JSONResponse(health.model_dump(), 503)
        health = Health(status="ok", revision=schema.head_revision())
        return JSONResponse(health.model_dump())

    @router.get(
        "/metrics",
        response_class=Response,
        **guarded("metrics", responses={200: {"content": {CONTENT_TYPE: {}}}}),
        summary="Prometheus metrics",
    )
    async def metrics() -> Response:
        families = await scrape(app.database, app.tasks.values())
        return Response(render_metrics(families), media_type=CONTENT_TYPE)

    return router


def _readable(exc: RequestValidationError) -> str:
    parts = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error.get("loc", ()) if part != "body")
        parts.append(f"{where}: {error.get('msg')}" if where else str(error.get("msg")))
    return "; ".join(parts) or "invalid request"


def create_api(
    app: App,
    *,
    token: str | None = None,
    read_token: str | None = None,
    public: Iterable[str] | str | None = None,
    dashboard: bool = True,
) -> FastAPI:
    """A FastAPI application serving ``create_router(app, ...)`` (what ``cronlock serve``
    runs), with one error shape for every 4xx, and the dashboard at ``/dashboard/``
    (``dashboard=False``: the API alone)."""
    api = FastAPI(
        title="cronlock",
        summary="Periodic tasks and a job queue that need nothing but PostgreSQL.",
        responses=_errors(422),
    )

    @api.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {key: value for key, value in error.items() if key in ("loc", "msg", "type")}
            for error in exc.errors()
        ]
        return JSONResponse(
            ErrorBody(detail=_readable(exc), errors=errors).model_dump(), status_code=422
        )

    @api.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse(
            ErrorBody(detail=str(exc.detail)).model_dump(exclude_none=True),
            status_code=exc.status_code,
            headers=exc.headers,
        )

    api.include_router(create_router(app, token=token, read_token=read_token, public=public))
    if dashboard:
        pages = create_dashboard(app, token=token, read_token=read_token, public=public)
        api.include_router(pages, prefix=DASHBOARD_PATH)

        @api.get("/", include_in_schema=False)
        async def home() -> RedirectResponse:
            return RedirectResponse(DASHBOARD_PATH + "/", status_code=307)

    return api
