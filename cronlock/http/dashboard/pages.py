"""The dashboard's routes: server-rendered pages, the forms that operate the queue, the login.

Every page is HTML rendered here from ``observe.overview``, ``observe.slots`` and the App's
operate verbs, readable without JavaScript; ``static/dashboard.js`` only adds what needs it
(the overview's pausable auto-refresh, times in the viewer's zone, keyboard shortcuts). Links
are built from the path the router is mounted at, so it works under any prefix. Bad input (an
unknown job, a filter that does not parse) gets a page with one line and a 4xx, never a 500.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

from fastapi import APIRouter, Request, Response
from fastapi.responses import RedirectResponse
from fastapi.templating import Jinja2Templates
from starlette.datastructures import URL

from ... import sql
from ...app import App
from ...errors import CronlockError
from ...observe.browse import browse_jobs
from ...observe.overview import collect_overview
from ...observe.slots import OUTCOMES, slot_picture
from ...outcome import (
    JOB_CANCELLABLE_STATUSES,
    JOB_FINISHED_STATUSES,
    JOB_RETRYABLE_STATUSES,
    JobStatus,
)
from ...queue.operate import ChangeOutcome, JobChange, JobFilter, JobPage
from ..access import Access, GuardedRoute
from .auth import COOKIE, Viewer, same_origin, viewer

__all__ = ["create_dashboard"]

logger = logging.getLogger("cronlock.http")

_HERE = Path(str(resources.files(__package__)))
_STATIC = {
    "dashboard.css": "text/css; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
}
PAGE_SIZE = 50
MAX_DAYS = 14
_NAME = "cronlock_dashboard_"


def _templates() -> Jinja2Templates:
    templates = Jinja2Templates(directory=str(_HERE / "templates"))
    env = templates.env
    env.filters["seconds"] = _seconds
    env.filters["ms"] = _ms
    env.filters["pretty"] = _pretty
    env.filters["count"] = lambda n: f"{n:,}"
    env.filters["parse_time"] = _parse_time
    env.globals["UTC"] = UTC
    env.globals["OUTCOMES"] = OUTCOMES
    return templates


def _seconds(value: float | None) -> str:
    """A duration for people: 850 ms, 12.5 s, 4 min 10 s, 3 h 5 min, 2 d 4 h."""
    if value is None:
        return "—"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 60:
        return f"{value:.1f} s"
    minutes, secs = divmod(int(value), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def _parse_time(value: Any) -> datetime | None:
    """An ISO time stored as text (an error history entry's ``at``), or None."""
    try:
        moment = datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _ms(value: float | None) -> str:
    return "—" if value is None else _seconds(value / 1000)


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def _aware(text: str, name: str) -> datetime:
    """A time from a filter form: ISO 8601; without a zone it is UTC (the form says so)."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        detail = f"{name}: not a date and time (YYYY-MM-DDTHH:MM, UTC): {text[:40]!r}"
        raise _BadInput(detail) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


class _BadInput(Exception):
    """A request whose input does not parse: answered with a page of one line and a 422."""


def create_dashboard(
    app: App,
    *,
    token: str | None = None,
    read_token: str | None = None,
    public: Iterable[str] | str | None = None,
    secure_cookie: bool = True,
) -> APIRouter:
    """The dashboard's pages for ``app``, to mount under any prefix
    (``api.include_router(create_dashboard(app), prefix="/cronlock")``). The tokens and the
    public surfaces are the API's (``create_router``'s arguments and environment); the pages
    are its ``reads``. ``secure_cookie=False`` lets the login cookie travel over plain HTTP
    to a host that is not this machine (never do that outside a test network)."""
    access = Access.configure(token=token, read_token=read_token, public=public)
    templates = _templates()
    router = APIRouter(route_class=GuardedRoute, include_in_schema=False)

    def base(request: Request) -> str:
        return request.url_for(_NAME + "overview").path.rstrip("/")

    def page(
        request: Request,
        who: Viewer,
        template: str,
        status_code: int = 200,
        **context: Any,
    ) -> Response:
        return templates.TemplateResponse(
            request,
            template,
            {"base": base(request), "who": who, "now": datetime.now(UTC), **context},
            status_code=status_code,
            headers={
                "Cache-Control": "no-store",
                "Content-Security-Policy": (
                    "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; "
                    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; "
                    "base-uri 'none'"
                ),
                "Referrer-Policy": "same-origin",
                "X-Content-Type-Options": "nosniff",
            },
        )

    def problem(request: Request, who: Viewer, status_code: int, detail: str) -> Response:
        return page(request, who, "problem.html", status_code, detail=detail)

    def reader(request: Request) -> Viewer | Response:
        """The viewer, or the login page's redirect when the pages need a token it lacks."""
        who = viewer(access, request)
        if who.can_read:
            return who
        target = URL(request.url_for(_NAME + "login").path).include_query_params(
            next=request.url.path + (f"?{request.url.query}" if request.url.query else "")
        )
        return RedirectResponse(str(target), status_code=303)

    async def form(request: Request) -> dict[str, str]:
        body = await request.body()
        try:
            fields = parse_qs(body.decode("utf-8", "replace"), max_num_fields=20)
        except ValueError:  # more fields than any of these forms has: none of its own
            return {}
        return {key: values[-1] for key, values in fields.items()}

    async def writer(request: Request) -> tuple[Viewer, dict[str, str]] | Response:
        """The viewer and the form, or a refusal: a post needs the token, this server's
        origin and the session's CSRF token."""
        who = viewer(access, request)
        if not same_origin(request):
            return problem(request, who, 403, "Refused: this form was posted from another site.")
        if not who.can_write:
            return problem(request, who, 403, f"Refused: {who.read_only_note}")
        fields = await form(request)
        if not who.csrf_ok(fields.get("csrf")):
            return problem(
                request, who, 403, "Refused: the form's CSRF token is missing or stale; reload."
            )
        return who, fields

    # -- static files ------------------------------------------------------------------

    @router.get("/static/{name}", name=_NAME + "static")
    async def static(name: str) -> Response:
        if name not in _STATIC:
            return Response("not found", 404, media_type="text/plain")
        content = (_HERE / "static" / name).read_bytes()
        return Response(content, media_type=_STATIC[name], headers={"Cache-Control": "max-age=300"})

    # -- the overview --------------------------------------------------------------------

    @router.get("/", name=_NAME + "overview")
    async def overview(request: Request) -> Response:
        who = reader(request)
        if isinstance(who, Response):
            return who
        found = await collect_overview(app)
        refresh = request.query_params.get("refresh", "")
        seconds = int(refresh) if refresh.isdigit() and 2 <= int(refresh) <= 600 else None
        return page(request, who, "overview.html", overview=found, refresh=seconds)

    # -- a task, its slots and runs -----------------------------------------------------

    @router.get("/tasks/{name}", name=_NAME + "task")
    async def task_page(request: Request, name: str) -> Response:
        who = reader(request)
        if isinstance(who, Response):
            return who
        days_text = request.query_params.get("days", "2")
        if not days_text.isdigit() or not 1 <= int(days_text) <= MAX_DAYS:
            return problem(request, who, 422, f"days: a whole number from 1 to {MAX_DAYS}")
        days = int(days_text)
        task = app.tasks.get(name)
        now = datetime.now(UTC)
        async with app.database.connect() as conn:
            known = (
                task is not None
                or (await conn.execute(sql.RUN_LATEST_PER_TASK, {"tasks": [name]})).one().id
                is not None
            )
        if not known:
            return problem(request, who, 404, f"No task {name!r}: not registered, and no runs.")
        picture = await slot_picture(app, name, now=now, window=timedelta(days=days))
        params: dict[str, Any] = {"task": name, "limit": PAGE_SIZE + 1}
        before = request.query_params.get("before")
        if before:
            try:
                moment, _, run_id = before.partition("_")
                params["before_started_at"] = datetime.fromisoformat(moment)
                params["before_id"] = int(run_id)
                if params["before_started_at"].tzinfo is None:
                    raise ValueError(before)
            except ValueError:
                return problem(
                    request, who, 422, f"before: not a position of this list: {before[:60]!r}"
                )
        async with app.database.connect() as conn:
            rows = (await conn.execute(sql.run_page(before=bool(before)), params)).mappings().all()
        runs = [dict(row) for row in rows[:PAGE_SIZE]]
        state = (await app.tasks.states()).get(name)
        failing = await app.tasks.parked(name) if task is not None else []
        last = runs[-1] if len(rows) > PAGE_SIZE else None
        older = None if last is None else f"{last['started_at'].isoformat()}_{last['id']}"
        return page(
            request,
            who,
            "task.html",
            name=name,
            task=task,
            picture=picture,
            days=days,
            runs=runs,
            older=older,
            first_page=not before,
            max_days=MAX_DAYS,
            state=state,
            failing=failing,
        )

    @router.get("/runs/{run_id}", name=_NAME + "run")
    async def run_detail(request: Request, run_id: str) -> Response:
        who = reader(request)
        if isinstance(who, Response):
            return who
        if not run_id.isdigit() or len(run_id) > 18:
            return problem(request, who, 422, f"Not a run id: {run_id[:40]!r}")
        async with app.database.connect() as conn:
            row = (await conn.execute(sql.RUN_GET, {"id": int(run_id)})).mappings().first()
        if row is None:
            return problem(request, who, 404, f"No run {run_id}.")
        return page(request, who, "run.html", run=dict(row))

    # -- jobs --------------------------------------------------------------------------

    @router.get("/jobs", name=_NAME + "jobs")
    async def jobs_page(request: Request) -> Response:
        who = reader(request)
        if isinstance(who, Response):
            return who
        query = request.query_params
        chosen = {
            key: query.get(key, "").strip()
            for key in ("queue", "status", "job_type", "created_after", "created_before")
        }
        cursor = query.get("cursor") or None
        error: str | None = None
        try:
            after, before = chosen["created_after"], chosen["created_before"]
            where = JobFilter(
                status=chosen["status"] or None,  # none: every job but a completed one
                queue=chosen["queue"] or None,
                job_type=chosen["job_type"] or None,
                created_after=_aware(after, "created after") if after else None,
                created_before=_aware(before, "created before") if before else None,
            )
            found = await browse_jobs(app.database, where, limit=PAGE_SIZE, cursor=cursor)
        except (CronlockError, _BadInput) as exc:
            found, error = JobPage((), None), str(exc)
        kept = {key: value for key, value in chosen.items() if value}
        next_link = (
            None
            if found.next_cursor is None
            else f"?{urlencode({**kept, 'cursor': found.next_cursor})}"
        )
        first_link = f"?{urlencode(kept)}" if cursor and error is None else None
        return page(
            request,
            who,
            "jobs.html",
            200 if error is None else 422,
            jobs=found.jobs,
            chosen=chosen,
            error=error,
            next_link=next_link,
            first_link=first_link,
            statuses=list(JobStatus),
        )

    @router.get("/jobs/{job_id}", name=_NAME + "job")
    async def job_page(request: Request, job_id: str) -> Response:
        who = reader(request)
        if isinstance(who, Response):
            return who
        try:
            job = await app.get_job(uuid.UUID(job_id))
        except ValueError:
            return problem(request, who, 422, f"Not a job id: {job_id[:60]!r}")
        if job is None:
            return problem(request, who, 404, f"No job {job_id}: it never existed, or was deleted.")
        flash = request.query_params.get("done")
        return page(
            request,
            who,
            "job.html",
            job=job,
            flash=flash[:300] if flash else None,
            can_retry=job.status in JOB_RETRYABLE_STATUSES,
            can_cancel=job.status in JOB_CANCELLABLE_STATUSES,
            can_delete=job.status in JOB_FINISHED_STATUSES,
        )

    async def _job_verb(request: Request, job_id: str, verb: str) -> Response:
        checked = await writer(request)
        if isinstance(checked, Response):
            return checked
        who, _ = checked
        try:
            target = uuid.UUID(job_id)
        except ValueError:
            return problem(request, who, 422, f"Not a job id: {job_id[:60]!r}")
        verbs = {"retry": app.retry_job, "cancel": app.cancel_job, "delete": app.delete_job}
        change: JobChange = await verbs[verb](target)
        logger.info(
            "dashboard: %s job %s: %s",
            verb,
            target,
            change.outcome.value,
            extra={"action": f"dashboard_{verb}", "job": str(target)},
        )
        if change.outcome is ChangeOutcome.NOT_FOUND:
            return problem(request, who, 404, change.detail)
        if not change.changed:
            return problem(request, who, 409, f"Not done: {change.outcome.value}: {change.detail}")
        if change.outcome is ChangeOutcome.DELETED:
            return RedirectResponse(
                f"{base(request)}/jobs?{urlencode({'deleted': str(target)})}", status_code=303
            )
        where = request.url_for(_NAME + "job", job_id=str(target)).path
        return RedirectResponse(f"{where}?{urlencode({'done': change.detail})}", status_code=303)

    @router.post("/jobs/{job_id}/retry", name=_NAME + "retry")
    async def retry(request: Request, job_id: str) -> Response:
        return await _job_verb(request, job_id, "retry")

    @router.post("/jobs/{job_id}/cancel", name=_NAME + "cancel")
    async def cancel(request: Request, job_id: str) -> Response:
        return await _job_verb(request, job_id, "cancel")

    @router.post("/jobs/{job_id}/delete", name=_NAME + "delete")
    async def delete(request: Request, job_id: str) -> Response:
        return await _job_verb(request, job_id, "delete")

    async def _queue_verb(request: Request, name: str, pause: bool) -> Response:
        checked = await writer(request)
        if isinstance(checked, Response):
            return checked
        who, _ = checked
        try:
            state = await (app.pause_queue(name) if pause else app.resume_queue(name))
        except CronlockError as exc:
            return problem(request, who, 422, str(exc))
        logger.info(
            "dashboard: %s queue %s",
            "pause" if pause else "resume",
            name,
            extra={"action": "dashboard_pause" if pause else "dashboard_resume", "queue": name},
        )
        word = "paused" if state.paused else "resumed"
        return RedirectResponse(
            f"{base(request)}/?{urlencode({'done': f'queue {name} {word}'})}#queue-{name}",
            status_code=303,
        )

    @router.post("/queues/{name}/pause", name=_NAME + "pause")
    async def pause(request: Request, name: str) -> Response:
        return await _queue_verb(request, name, True)

    @router.post("/queues/{name}/resume", name=_NAME + "resume")
    async def resume(request: Request, name: str) -> Response:
        return await _queue_verb(request, name, False)

    @router.post("/tasks/{name}/{verb}", name=_NAME + "task_verb")
    async def task_verb(request: Request, name: str, verb: str) -> Response:
        """The task page's buttons: pause, resume, run (now)."""
        if verb not in ("pause", "resume", "run"):
            return problem(request, viewer(access, request), 404, f"No such action: {verb[:40]!r}")
        checked = await writer(request)
        if isinstance(checked, Response):
            return checked
        who, _ = checked
        client = request.client.host if request.client else "unknown"
        try:
            if verb == "run":
                result = await app.tasks.run_now(name)
                done = f"run {result.run_id}: {result.status.value}" + (
                    f" ({result.skip_reason})" if result.skip_reason else ""
                )
            else:
                state = await (
                    app.tasks.pause(name, by=f"dashboard from {client}")
                    if verb == "pause"
                    else app.tasks.resume(name)
                )
                done = f"task {name} {'paused' if state.paused else 'resumed'}"
        except CronlockError as exc:
            return problem(request, who, 422, str(exc))
        logger.info(
            "dashboard: %s task %s",
            verb,
            name,
            extra={"action": f"dashboard_task_{verb}", "task": name},
        )
        where = request.url_for(_NAME + "task", name=name).path
        return RedirectResponse(f"{where}?{urlencode({'done': done})}", status_code=303)

    # -- login -------------------------------------------------------------------------

    def _next(request: Request, given: str | None) -> str:
        """Where to go after logging in: a path of this dashboard, nothing else."""
        home = base(request) + "/"
        if given and given.startswith(home) and not given.startswith("//") and "\\" not in given:
            return given
        return home

    @router.get("/login", name=_NAME + "login")
    async def login_form(request: Request) -> Response:
        who = viewer(access, request)
        return page(
            request,
            who,
            "login.html",
            next=_next(request, request.query_params.get("next")),
            error=None,
            open=access.open,
        )

    @router.post("/login", name=_NAME + "login_post")
    async def login(request: Request) -> Response:
        who = viewer(access, request)
        if not same_origin(request):
            return problem(request, who, 403, "Refused: this form was posted from another site.")
        fields = await form(request)
        given = fields.get("token", "").strip()
        target = _next(request, fields.get("next"))
        if access.grant(f"Bearer {given}") is None:
            return page(
                request,
                who,
                "login.html",
                401,
                next=target,
                error="That is not a token of this server.",
                open=access.open,
            )
        answer = RedirectResponse(target, status_code=303)
        answer.set_cookie(
            COOKIE,
            given,
            path=base(request) + "/",
            secure=secure_cookie,
            httponly=True,
            samesite="strict",
        )
        return answer

    @router.post("/logout", name=_NAME + "logout")
    async def logout(request: Request) -> Response:
        if not same_origin(request):
            who = viewer(access, request)
            return problem(request, who, 403, "Refused: this form was posted from another site.")
        answer = RedirectResponse(base(request) + "/login", status_code=303)
        answer.delete_cookie(
            COOKIE, path=base(request) + "/", secure=secure_cookie, httponly=True, samesite="strict"
        )
        return answer

    return router
