"""The App: the registry of periodic tasks and job handlers, and its database.

An App is declared at import time in the user's module; the command line finds it with
``--app MODULE[:ATTR]`` and gives it a database. Registration validates everything it can at
import: the cron expression and timezone, the name, and that no two tasks in one lock
namespace share an advisory lock key.
"""

from __future__ import annotations

import functools
import logging
import re
import uuid
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any, Concatenate, ParamSpec, TypeVar, Unpack

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from . import schema
from .cron import CronSchedule
from .database import Database, resolve
from .errors import (
    ConfigurationError,
    DatabaseUnavailable,
    DuplicateName,
    InvalidCron,
    JobFailed,
    LockKeyCollision,
)
from .locks import lock_key, namespace_key
from .observe.status import collect as collect_status
from .observe.tracehooks import Tracer
from .outcome import DrainResult, JobStatus, RunResult
from .periodic import Misfire, PeriodicTask, SlotPolicy, TaskBody, execute
from .periodic.control import Tasks
from .periodic.task import DEFAULT_PARK_AFTER
from .pg import ServerError
from .queue import cancel, control, operate
from .queue.cancel import DEFAULT_CANCEL_WAIT
from .queue.drainer import Drainer, DrainOptions
from .queue.enqueue import EnqueueOptions, enqueue_many
from .queue.jobs import (
    MAX_RETRIES_LIMIT,
    Backoff,
    Enqueued,
    Handler,
    JobDefaults,
    JobHandler,
    JobType,
    PayloadModel,
    check_concurrency_limit,
    check_max_retries,
    check_queue,
)
from .queue.operate import JobFilter
from .queue.payloads import model_of
from .queue.sync import SyncApi, SyncClient, wait_blocking
from .queue.sync import enqueue_many as enqueue_many_sync
from .queue.threads import is_async
from .queue.waits import Waits
from .retention import PRUNE_TASK, PruneResult, Retention, prune
from .sql.tables import DEFAULT_QUEUE, SCHEMA

__all__ = ["App"]

logger = logging.getLogger("cronlock.queue")

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}$")
# The built-in tasks: `cronlock run drain`, `cronlock run prune`.
RESERVED_NAMES = frozenset({"drain", PRUNE_TASK})


# What the operator verbs act on when given no filter: every job (each verb narrowed to the
# statuses it acts on).
_EVERY_JOB = JobFilter()

Seconds = float | timedelta

P = ParamSpec("P")
T = TypeVar("T")
H = TypeVar("H", bound=JobHandler)


def _schema_checked(
    method: Callable[Concatenate[App, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[App, P], Coroutine[Any, Any, T]]:
    """An App method whose error says cronlock's schema is missing or behind raises the one
    line the command line gives (``run `cronlock migrate` ``), not the driver's error. It costs
    nothing until something fails: no query before the method's own."""

    @functools.wraps(method)
    async def checked(app: App, /, *args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await method(app, *args, **kwargs)
        except (DBAPIError, ServerError) as exc:
            line = schema.schema_missing(app._database, app._schema_of_jobs(), exc)
            if line is None:
                raise
            raise DatabaseUnavailable(line) from None

    return checked


def _duration(name: str, option: str, value: Seconds) -> timedelta:
    if not isinstance(value, timedelta) and (
        isinstance(value, bool) or not isinstance(value, int | float)
    ):
        raise ConfigurationError(
            f"task {name!r}: {option} must be seconds (a number) or a timedelta, not {value!r}"
        )
    duration = value if isinstance(value, timedelta) else timedelta(seconds=value)
    if duration < timedelta(0):
        raise ConfigurationError(f"task {name!r}: {option} must not be negative")
    return duration


def _slot_policy(
    name: str,
    schedule: CronSchedule,
    grace: Seconds,
    early: Seconds,
    misfire: Misfire | str,
    max_lateness: Seconds | None,
    catch_up_limit: int,
    jitter: Seconds,
) -> SlotPolicy:
    """Validate a task's scheduling options at declaration, like its cron expression."""
    try:
        policy_misfire = Misfire(misfire)
    except ValueError:
        choices = ", ".join(m.value for m in Misfire)
        raise ConfigurationError(
            f"task {name!r}: misfire must be one of {choices}, not {misfire!r}"
        ) from None
    if isinstance(catch_up_limit, bool) or not isinstance(catch_up_limit, int):
        raise ConfigurationError(f"task {name!r}: catch_up_limit must be an integer")
    if catch_up_limit < 1:
        raise ConfigurationError(f"task {name!r}: catch_up_limit must be at least 1")
    policy = SlotPolicy(
        grace=_duration(name, "grace", grace),
        early=_duration(name, "early", early),
        misfire=policy_misfire,
        max_lateness=None
        if max_lateness is None
        else _duration(name, "max_lateness", max_lateness),
        catch_up_limit=catch_up_limit,
        jitter=_duration(name, "jitter", jitter),
    )
    # A jittered firing must still map to its own slot: not past the grace, and not so close
    # to the next fire time that it reads as an early invocation of that one.
    if policy.jitter > policy.grace:
        raise ConfigurationError(f"task {name!r}: jitter must not exceed grace")
    gap = schedule.min_interval(datetime.now(UTC))
    if policy.jitter and gap is not None and policy.jitter + policy.early >= gap:
        raise ConfigurationError(
            f"task {name!r}: jitter + early must stay below the shortest interval "
            f"({gap.total_seconds():g} s)"
        )
    return policy


def _verb(name: str) -> operate.Verb:
    try:
        return operate.Verb(name)
    except ValueError:
        raise ConfigurationError(
            f"unknown verb {name!r}: one of {', '.join(v.value for v in operate.Verb)}"
        ) from None


def _model_class(model: PayloadModel | None) -> type[Any] | None:
    return None if model is None else model.cls


def _class_name(cls: type[Any] | None) -> str:
    return "none" if cls is None else cls.__qualname__


def _check_name(kind: str, name: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigurationError(
            f"invalid {kind} name {name!r}: use letters, digits and . _ : - (at most 200)"
        )


class App:
    """The registry of periodic tasks and job handlers, and the database they run against.

    ``retention`` configures the built-in task ``prune`` (``cronlock.Retention``: how long
    finished jobs, runs and dead drainers' rows are kept, and its schedule); ``False`` turns
    it off for this app.
    """

    def __init__(
        self,
        *,
        database_url: str | None = None,
        schema: str = SCHEMA,
        retention: Retention | bool = True,
    ) -> None:
        self.database_url = database_url
        self.schema = schema
        if retention is True:
            retention = Retention()
        self.retention: Retention | None = retention or None
        self._tasks: dict[str, PeriodicTask] = {}
        self._lock_owners: dict[tuple[int, int], str] = {}
        self._database: Database | None = None
        self._handlers: dict[str, Handler] = {}
        self._declared: dict[str, JobType] = {}
        self._warned_unknown: set[str] = set()
        self._waits: Waits | None = None  # app.wait's LISTEN, made on the first wait
        # OpenTelemetry spans, once cronlock.tracing.instrument(self) ran (the 'otel' extra).
        self.tracing: Tracer | None = None

    # -- registration --------------------------------------------------------------------

    def periodic(
        self,
        name: str,
        *,
        cron: str,
        namespace: str | int = "cron",
        timezone: str | None = None,
        grace: Seconds = 60,
        early: Seconds = 5,
        misfire: Misfire | str = Misfire.SKIP,
        max_lateness: Seconds | None = None,
        catch_up_limit: int = 10,
        jitter: Seconds = 0,
        commit_every: int | None = None,
        park_after: int | None = DEFAULT_PARK_AFTER,
    ) -> Callable[[TaskBody], TaskBody]:
        """Declare a periodic task; the decorated coroutine function receives a ``Run``. A
        plain ``def`` body runs in a thread of its own: ``run.sync_session`` and ``with
        run.item(key) as session`` (a sync ``Session``) on the run's transaction.

        Scheduling (README "Scheduling"): an invocation up to ``grace`` late or ``early`` ahead
        belongs to that slot; ``misfire`` says what the scheduler does with slots that passed
        unfired (``skip``, ``once``, ``each`` up to ``catch_up_limit``), and no slot later than
        ``max_lateness`` is run; ``jitter`` delays the scheduler's firing by up to that many
        seconds, the same delay for a given slot on every host, without changing the slot.
        Durations are seconds or ``timedelta``.

        ``commit_every=N`` makes a run chunked (README "Chunked runs"): it commits every N
        top-level items, its lock held by a connection of its own, and its row says how far
        it got; without it a run is one transaction.

        ``park_after=N`` parks an item (by its key) that failed in N consecutive runs: later
        runs leave it out (``run.skip_parked``) and its failures no longer fail a run
        (README "Poison items"); ``None`` never parks.
        """
        _check_name("task", name)
        if commit_every is not None and (
            isinstance(commit_every, bool) or not isinstance(commit_every, int) or commit_every < 1
        ):
            raise ConfigurationError(
                f"task {name!r}: commit_every must be a whole number of items, at least 1"
            )
        if park_after is not None and (
            isinstance(park_after, bool) or not isinstance(park_after, int) or park_after < 1
        ):
            raise ConfigurationError(
                f"task {name!r}: park_after must be a whole number of runs, at least 1, or None"
            )
        if name in RESERVED_NAMES:
            raise DuplicateName(f"task name {name!r} is reserved for the built-in task")
        if name in self._tasks:
            raise DuplicateName(f"periodic task {name!r} is already registered")
        try:
            schedule = CronSchedule.parse(cron, timezone)
        except InvalidCron as exc:
            raise InvalidCron(f"task {name!r}: {exc}") from None
        policy = _slot_policy(
            name, schedule, grace, early, misfire, max_lateness, catch_up_limit, jitter
        )
        if isinstance(namespace, bool) or not isinstance(namespace, str | int):
            raise ConfigurationError(
                f"task {name!r}: namespace must be a name or an int4, not {namespace!r}"
            )
        try:
            ns, key = namespace_key(namespace), lock_key(name)
        except ValueError as exc:
            raise ConfigurationError(f"task {name!r}: {exc}") from None
        owner = self._lock_owners.get((ns, key))
        if owner is not None:
            raise LockKeyCollision(
                f"tasks {owner!r} and {name!r} have the same lock key {key} in namespace "
                f"{namespace!r}: rename one or put it in another namespace"
            )

        def register(body: TaskBody) -> TaskBody:
            self._tasks[name] = PeriodicTask(
                name=name,
                schedule=schedule,
                namespace=namespace,
                lock_namespace=ns,
                lock_key=key,
                body=body,
                description=(body.__doc__ or "").strip().splitlines()[0] if body.__doc__ else "",
                policy=policy,
                commit_every=commit_every,
                park_after=park_after,
                threaded=not is_async(body),
            )
            self._lock_owners[(ns, key)] = name
            return body

        return register

    @property
    def tasks(self) -> Tasks:
        """The registered periodic tasks by name, and their control for the whole cluster:
        ``pause``, ``resume``, ``run_now``, ``parked`` items (``cronlock.periodic.control``)."""
        return Tasks(self, self._tasks)

    def task(self, name: str) -> PeriodicTask:
        return self.tasks.task(name)

    # -- job handlers and enqueueing ---------------------------------------------------------

    def job(
        self,
        job_type: str,
        *,
        max_retries: int = 3,
        backoff: Backoff | None = None,
        timeout: float | None = None,
        queue: str = DEFAULT_QUEUE,
        max_lost_runs: int = Handler.max_lost_runs,
        concurrency_limit: int | None = None,
        payload: type[Any] | None = None,
        result: type[Any] | None = None,
    ) -> Callable[[H], H]:
        """Register ``async def handler(session, payload)`` for ``job_type``.

        A plain ``def handler(session, payload)`` runs in the drainer's thread pool with a sync
        ``Session`` on the same transaction (``cronlock.queue.threads``).
        The handler runs in the job's transaction (``session``); what it returns, if JSON, is
        stored as the job's result. ``max_retries`` and ``queue`` are the defaults for jobs of
        this type; ``backoff`` spaces the retries; a run longer than ``timeout`` seconds is a
        failed attempt. In the ``lease`` commit mode ``session`` is the completion's: what
        the handler writes with it commits with the job's completion, in one transaction at
        the end (see ``cronlock.queue.leased``); a job whose worker was lost
        ``max_lost_runs`` times while it ran is stopped (failed).
        ``concurrency_limit`` is how many of its jobs with one concurrency key
        (``enqueue(..., concurrency_key=...)``) may run at once, across every drainer (1 when
        not given: a key alone makes its jobs run one at a time).
        ``payload`` (a pydantic model or a dataclass) types the payloads: each is checked
        at enqueue against it, on every surface, and the handler receives the model;
        ``result`` checks and stores what the handler returns the same way
        (``cronlock.queue.payloads`` says what each kind checks).
        """
        _check_name("job type", job_type)
        if job_type in self._handlers:
            raise DuplicateName(f"job type {job_type!r} is already registered")
        check_max_retries(max_retries)
        check_queue(queue)
        if concurrency_limit is not None:
            check_concurrency_limit(concurrency_limit)
        if backoff is not None and not isinstance(backoff, Backoff):
            raise ConfigurationError(
                f"job type {job_type!r}: backoff must be a cronlock.Backoff, not {backoff!r}"
            )
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0
        ):
            raise ConfigurationError(f"job type {job_type!r}: timeout must be positive")
        if not 1 <= max_lost_runs <= MAX_RETRIES_LIMIT:
            raise ConfigurationError(
                f"job type {job_type!r}: max_lost_runs must be between 1 and {MAX_RETRIES_LIMIT}"
            )
        payload_model = None if payload is None else model_of(payload, job_type, "payload")
        result_model = None if result is None else model_of(result, job_type, "result")
        self._agree(job_type, queue, max_retries, concurrency_limit, payload, result)

        def register(func: H) -> H:
            if not callable(func):
                raise ConfigurationError(f"job type {job_type!r}: the handler must be callable")
            self._handlers[job_type] = Handler(
                job_type=job_type,
                func=func,
                max_retries=max_retries,
                backoff=backoff or Backoff(),
                timeout=timeout,
                queue=queue,
                max_lost_runs=max_lost_runs,
                concurrency_limit=concurrency_limit,
                threaded=not is_async(func),
                payload_model=payload_model,
                result_model=result_model,
            )
            return func

        return register

    def declare_job(
        self,
        job_type: str,
        *,
        max_retries: int = 3,
        queue: str = DEFAULT_QUEUE,
        concurrency_limit: int | None = None,
        payload: type[Any] | None = None,
        result: type[Any] | None = None,
    ) -> JobType:
        """Declare ``job_type`` without its handler, so that this app can enqueue it: a
        producer (a web application) that does not import the worker's code. Its jobs get
        ``queue``, ``max_retries`` and ``concurrency_limit`` unless the enqueue says otherwise,
        checked as for ``job()``, and their payloads are checked against ``payload`` (its
        ``result`` is for ``GET /job-types``). A handler registered for it in the same app
        must agree."""
        _check_name("job type", job_type)
        if job_type in self._declared:
            raise DuplicateName(f"job type {job_type!r} is already declared")
        check_max_retries(max_retries)
        check_queue(queue)
        if concurrency_limit is not None:
            check_concurrency_limit(concurrency_limit)
        declared = JobType(
            job_type,
            queue=queue,
            max_retries=max_retries,
            concurrency_limit=concurrency_limit,
            payload_model=None if payload is None else model_of(payload, job_type, "payload"),
            result_model=None if result is None else model_of(result, job_type, "result"),
        )
        handler = self._handlers.get(job_type)
        if handler is not None:
            self._declared[job_type] = declared  # checked against the handler next
            try:
                self._agree(
                    job_type,
                    handler.queue,
                    handler.max_retries,
                    handler.concurrency_limit,
                    _model_class(handler.payload_model),
                    _model_class(handler.result_model),
                )
            except DuplicateName:
                del self._declared[job_type]
                raise
        self._declared[job_type] = declared
        return declared

    def _agree(
        self,
        job_type: str,
        queue: str,
        max_retries: int,
        concurrency_limit: int | None,
        payload: type[Any] | None,
        result: type[Any] | None,
    ) -> None:
        """A handler and a declaration of one job type must give its jobs the same defaults
        and models: a producer enqueueing to one queue while the worker drains another loses
        them, and one checking payloads against another model sends what the handler
        refuses."""
        declared = self._declared.get(job_type)
        if declared is None:
            return
        if (declared.queue, declared.max_retries) != (queue, max_retries):
            raise DuplicateName(
                f"job type {job_type!r} is declared with queue {declared.queue!r} and "
                f"max_retries {declared.max_retries}, but its handler has queue {queue!r} and "
                f"max_retries {max_retries}"
            )
        if declared.concurrency_limit != concurrency_limit:
            raise DuplicateName(
                f"job type {job_type!r} is declared with concurrency_limit "
                f"{declared.concurrency_limit}, but its handler has {concurrency_limit}"
            )
        for option, given, theirs in (
            ("payload", payload, _model_class(declared.payload_model)),
            ("result", result, _model_class(declared.result_model)),
        ):
            if given is not theirs:
                raise DuplicateName(
                    f"job type {job_type!r} is declared with {option} {_class_name(theirs)}, "
                    f"but its handler has {_class_name(given)}"
                )

    @property
    def handlers(self) -> Mapping[str, Handler]:
        return MappingProxyType(self._handlers)

    @property
    def job_types(self) -> Mapping[str, JobDefaults]:
        """Every job type this app can enqueue: its declarations and its handlers."""
        known: dict[str, JobDefaults] = {**self._declared, **self._handlers}
        return MappingProxyType(known)

    def knows(self, job_type: str) -> bool:
        """Whether this app has a handler or a declaration for ``job_type``."""
        return job_type in self._handlers or job_type in self._declared

    async def enqueue(
        self,
        job_type: str,
        payload: Any = None,
        *,
        dedup_key: str | None = None,
        concurrency_key: str | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> Enqueued:
        """Add a job and commit it on its own, through the app's database, before this
        returns: one round trip for a job without a dedup key, the fast way to enqueue jobs
        one at a time when no transaction of the caller's needs to include them
        (``enqueue_tx`` adds it in the caller's transaction instead).

        Higher ``priority`` runs first. With a ``dedup_key`` already held by a waiting job,
        nothing is added and the answer carries that job's id with ``created=False``.
        With a ``concurrency_key``, at most ``concurrency_limit`` jobs with that key (default:
        the job type's, else 1) run at once, across every drainer and queue. A run longer
        than ``timeout`` seconds is a failed attempt (default: the job type's timeout).
        A job type this app neither handles nor declares is an ``UnknownJobType`` unless
        ``allow_unknown``: then it is enqueued with the default queue and retries, and a
        WARNING says that only a drainer whose app has its handler can run it.
        """
        [answer] = await self.enqueue_many(
            job_type,
            [payload],
            dedup_keys=None if dedup_key is None else [dedup_key],
            concurrency_keys=None if concurrency_key is None else [concurrency_key],
            **options,
        )
        return answer

    async def enqueue_tx(
        self,
        executor: AsyncSession | AsyncConnection,
        job_type: str,
        payload: Any = None,
        *,
        dedup_key: str | None = None,
        concurrency_key: str | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> Enqueued:
        """``enqueue`` in the caller's transaction (``executor``): the job commits or rolls
        back with the caller's own work; the caller commits."""
        [answer] = await self.enqueue_many_tx(
            executor,
            job_type,
            [payload],
            dedup_keys=None if dedup_key is None else [dedup_key],
            concurrency_keys=None if concurrency_key is None else [concurrency_key],
            **options,
        )
        return answer

    @_schema_checked
    async def enqueue_many(
        self,
        job_type: str,
        payloads: Sequence[Any],
        *,
        dedup_keys: Sequence[str | None] | None = None,
        concurrency_keys: Sequence[str | None] | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> list[Enqueued]:
        """Add one job per payload with one statement, committed together on their own
        before this returns. ``dedup_keys`` and ``concurrency_keys`` give one key (or None)
        per payload; the other options are ``enqueue``'s."""
        return await self._enqueue(
            self.database, job_type, payloads, dedup_keys, concurrency_keys, options
        )

    @_schema_checked
    async def enqueue_many_tx(
        self,
        executor: AsyncSession | AsyncConnection,
        job_type: str,
        payloads: Sequence[Any],
        *,
        dedup_keys: Sequence[str | None] | None = None,
        concurrency_keys: Sequence[str | None] | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> list[Enqueued]:
        """``enqueue_many`` in the caller's transaction (``executor``); the caller commits."""
        return await self._enqueue(
            executor, job_type, payloads, dedup_keys, concurrency_keys, options
        )

    async def _enqueue(
        self,
        into: AsyncSession | AsyncConnection | Database,
        job_type: str,
        payloads: Sequence[Any],
        dedup_keys: Sequence[str | None] | None,
        concurrency_keys: Sequence[str | None] | None,
        options: EnqueueOptions,
    ) -> list[Enqueued]:
        with self._enqueue_span(job_type, len(payloads)) as trace_context:
            return await enqueue_many(
                into,
                self.job_types,
                job_type,
                payloads,
                schema=self._schema_of_jobs(),
                trace_context=trace_context,
                dedup_keys=dedup_keys,
                concurrency_keys=concurrency_keys,
                **options,
            )

    @property
    def sync(self) -> SyncApi:
        """Enqueueing from sync code in the caller's transaction: ``enqueue_tx`` and
        ``enqueue_many_tx`` on a psycopg 3 or psycopg2 connection, Django's connection, or a
        sync SQLAlchemy ``Session`` or ``Connection`` (``cronlock.queue.sync``)."""
        return SyncApi(self._enqueue_sync, self._wait_sync)

    def _enqueue_sync(
        self, client: SyncClient, job_type: str, payloads: Sequence[Any], **options: Any
    ) -> list[Enqueued]:
        schema_name = self._schema_of_jobs()
        with self._enqueue_span(job_type, len(payloads)) as trace_context:
            try:
                return enqueue_many_sync(
                    client,
                    self.job_types,
                    job_type,
                    payloads,
                    schema=schema_name,
                    trace_context=trace_context,
                    **options,
                )
            except Exception as exc:
                line = schema.schema_missing(self._database, schema_name, exc)
                if line is None:
                    raise
                raise DatabaseUnavailable(line) from None

    def _wait_sync(self, job_id: uuid.UUID | str, timeout: float | None) -> Any:
        info = wait_blocking(self.database, operate.job_id_of(job_id), timeout)
        if info.status is not JobStatus.COMPLETED:
            raise JobFailed(info)
        return info.result

    @contextmanager
    def _enqueue_span(self, job_type: str, count: int) -> Iterator[str | None]:
        """A traced app's enqueue is a span, whose context the jobs carry (else None); a
        type this app does not know is warned of once."""
        known = self.knows(job_type)
        tracing = self.tracing
        span = nullcontext(None) if tracing is None else tracing.enqueue(job_type, count)
        with span as trace_context:
            yield trace_context
        if not known and job_type not in self._warned_unknown:
            self._warned_unknown.add(job_type)  # once per type: not a line per job
            logger.warning(
                "job type %r has no handler or declaration in this app: only a drainer "
                "whose app registers its handler runs it (cronlock status flags a queue "
                "whose due jobs nobody takes)",
                job_type,
                extra={"action": "enqueue_unknown_type", "job_type": job_type},
            )

    def _schema_of_jobs(self) -> str:
        return self._database.schema if self._database is not None else self.schema

    def drainer(self, options: DrainOptions | None = None, /, **changes: Any) -> Drainer:
        """A drainer on this app's database, with this app's handlers: ``options`` (a
        ``DrainOptions``, default all defaults) with ``changes``, any of its fields.

        ``queue`` is the queue it drains; ``commit_mode`` is ``strict`` (a job per
        transaction), ``batch`` (``batch_size`` jobs per transaction, default
        ``DEFAULT_BATCH_SIZE``, 50) or ``lease`` (the claim commits and handlers run outside
        any transaction, for long jobs; ``batch_size`` claims at once, 1 by default; a lost
        worker's running jobs are looked for every ``sweep_interval`` seconds:
        ``cronlock.queue.leased``); ``concurrency`` lanes run jobs at once; ``shared=True``
        makes it one of any number of active drainers of the queue instead of its single
        active one (exclusive and shared drainers refuse to meet: ``DrainerConflict``); an
        idle drainer looks for due jobs every ``poll_interval`` seconds when no notification
        wakes it; ``heartbeat_interval`` and ``keepalive`` are its liveness; ``threads`` is how many
        plain ``def`` handlers run at once (in a thread pool; ``concurrency`` if not given).
        ``clock`` and ``rng`` are for tests (the retry backoff's time and jitter). See
        ``cronlock.queue.drainer``.
        """
        return Drainer(self.database, self.handlers, options, tracing=self.tracing, **changes)

    async def drain(
        self,
        options: DrainOptions | None = None,
        /,
        *,
        max_seconds: float | None = None,
        **changes: Any,
    ) -> DrainResult:
        """The built-in task ``drain``: process due jobs until none is due (or ``max_seconds``
        passed); skipped when another exclusive drainer is active. The options are
        ``drainer()``'s. A database not migrated to head is a ``DatabaseUnavailable``, as on
        the command line."""
        await schema.ensure_ready(self.database)
        return await self.drainer(options, **changes).drain(max_seconds=max_seconds)

    # -- results -------------------------------------------------------------------------

    @_schema_checked
    async def wait(self, job_id: uuid.UUID | str, *, timeout: float | None = None) -> Any:  # noqa: ASYNC109
        """The job's result as soon as it completes: woken by the completion's notification
        (``cronlock.queue.waits``), not a polling loop. A job that ended ``failed`` or
        ``cancelled`` raises ``JobFailed`` (its row as ``.job``: status, error, attempts);
        no such job (or a deleted one) ``JobNotFound``; still running after ``timeout``
        seconds, ``TimeoutError``. A job that has already ended answers at once."""
        info = await self.wait_for_end(job_id, timeout=timeout)
        if info.status is not JobStatus.COMPLETED:
            raise JobFailed(info)
        return info.result

    async def wait_for_end(
        self,
        job_id: uuid.UUID | str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> operate.JobInfo:
        """``wait``, answering the job's row however it ended instead of raising."""
        if self._waits is None or self._waits.database is not self.database:
            self._waits = Waits(self.database)
        return await self._waits.wait(operate.job_id_of(job_id), timeout)

    # -- database ------------------------------------------------------------------------

    def use_database(
        self, url: str, *, schema: str | None = None, pgbouncer: bool = False
    ) -> Database:
        """Point the app at a database (the command line does this from its options)."""
        self._database = Database(url, schema=schema or self.schema, pgbouncer=pgbouncer)
        return self._database

    @property
    def database(self) -> Database:
        """The app's database: the one ``use_database`` gave it, else the one the command line
        would use (``$CRONLOCK_DATABASE_URL``, else ``database_url``, else the embedded
        PostgreSQL, which the first use starts; ``$CRONLOCK_SCHEMA``, ``$CRONLOCK_PGBOUNCER``)."""
        if self._database is None:
            resolved = resolve(app_url=self.database_url, app_schema=self.schema)
            if resolved.server is not None:
                note = resolved.server.note().removeprefix("cronlock: ")
                level = logging.WARNING if resolved.server.created else logging.INFO
                logger.log(level, note, extra={"action": "embedded_database"})
            return self.use_database(
                resolved.url, schema=resolved.schema, pgbouncer=resolved.pgbouncer
            )
        return self._database

    @_schema_checked
    async def run(
        self,
        name: str,
        *,
        now: datetime | None = None,
        manual: bool = False,
        grace: timedelta | None = None,
    ) -> RunResult:
        """Run a periodic task once, now, under its lock, for the slot ``now`` belongs to.

        Outside every slot's grace nothing runs (``skipped``, ``no_slot``) unless ``manual``:
        a manual run is recorded as such and claims no slot.
        """
        return await execute(
            self.database,
            self.task(name),
            now=now,
            manual=manual,
            grace=grace,
            tracing=self.tracing,
        )

    async def migrate(
        self, *, lock_timeout: float | None = None, retry_for: float | None = None
    ) -> str:
        """Create or upgrade cronlock's schema in the app's database, as ``cronlock migrate``
        does (idempotent, safe from several hosts at once, online: ``cronlock.online``); the
        revision it is now at.

        An unreachable database, or locks held past ``retry_for``, is a
        ``DatabaseUnavailable`` with one readable line.
        """
        try:
            await schema.upgrade(self.database, lock_timeout=lock_timeout, retry_for=retry_for)
        except (OSError, DBAPIError, TimeoutError) as exc:
            raise DatabaseUnavailable(
                schema.describe_connection_error(self.database, exc)
            ) from None
        return schema.head_revision()

    async def status(self, *, limit: int = 5) -> dict[str, Any]:
        """What ``cronlock status --json`` prints: per task its last ``limit`` runs and its
        health, and the queue (counts, the oldest due job, failures, rates, drainers).

        A database that is unreachable or not migrated to head is a ``DatabaseUnavailable``.
        """
        await schema.ensure_ready(self.database)
        return await collect_status(self.tasks, self.database, limit=limit)

    # -- operating the queue (README "Operating the queue") -------------------------------

    @_schema_checked
    async def get_job(self, job_id: uuid.UUID | str) -> operate.JobInfo | None:
        """The job with that id, or None."""
        return await operate.get_job(self.database, job_id)

    @_schema_checked
    async def list_jobs(
        self, where: JobFilter = _EVERY_JOB, *, limit: int = 50, cursor: str | None = None
    ) -> operate.JobPage:
        """The jobs ``where`` matches (default: every job) newest first, ``limit`` (at most
        1,000) a page. Pass a page's ``next_cursor`` as ``cursor`` for the next one."""
        return await operate.list_jobs(self.database, where, limit=limit, cursor=cursor)

    @_schema_checked
    async def count_jobs(self, where: JobFilter = _EVERY_JOB, *, verb: str | None = None) -> int:
        """How many jobs ``where`` matches (what ``retry_jobs``, ``cancel_jobs`` or
        ``delete_jobs``, named by ``verb``, would act on: narrowed to the statuses it acts
        on)."""
        chosen = None if verb is None else _verb(verb)
        return await operate.count_jobs(self.database, where, chosen)

    @_schema_checked
    async def retry_job(self, job_id: uuid.UUID | str) -> operate.JobChange:
        """Make a failed job, or a retrying one not yet due, due now (its error history kept;
        a failed job gets one more attempt). A job a drainer holds right now is reported
        ``running`` and left alone."""
        return await operate.change_job(self.database, operate.Verb.RETRY, job_id)

    @_schema_checked
    async def retry_jobs(self, where: JobFilter = _EVERY_JOB) -> operate.JobsChanged:
        """``retry_job`` for every failed and retrying job that matches (``status`` narrows
        it to one of them), in batches of short transactions."""
        return await operate.change_jobs(self.database, operate.Verb.RETRY, where)

    @_schema_checked
    async def cancel_job(
        self, job_id: uuid.UUID | str, *, wait: float = DEFAULT_CANCEL_WAIT
    ) -> operate.JobChange:
        """Cancel a job. A waiting one becomes ``cancelled`` and never runs (``cancelled``). A
        running one is cancelled cooperatively: its drainer is told, its handler's task is
        cancelled (it gets ``CancelledError`` at its next await), its writes are rolled back
        and it ends ``cancelled``, not retried; this waits up to ``wait`` seconds to say so
        (``cancelled``), or that it completed first (``completed``, not changed), or that
        it has not stopped yet (``cancel_requested``: the request stands)."""
        return await cancel.cancel_job(self.database, job_id, wait=wait)

    @_schema_checked
    async def cancel_jobs(self, where: JobFilter = _EVERY_JOB) -> operate.JobsChanged:
        """``cancel_job`` for every waiting (pending or retrying) job that matches, in batches
        of short transactions: a waiting one is cancelled; one a drainer runs now is asked to
        stop, without waiting, and counted ``cancel_requested``."""
        return await operate.change_jobs(self.database, operate.Verb.CANCEL, where)

    @_schema_checked
    async def delete_job(self, job_id: uuid.UUID | str) -> operate.JobChange:
        """Delete a finished job (completed, failed or cancelled); a waiting one is not."""
        return await operate.change_job(self.database, operate.Verb.DELETE, job_id)

    @_schema_checked
    async def delete_jobs(self, where: JobFilter = _EVERY_JOB) -> operate.JobsChanged:
        """Delete every finished job that matches, in batches of short transactions."""
        return await operate.change_jobs(self.database, operate.Verb.DELETE, where)

    @_schema_checked
    async def pause_queue(self, queue: str, *, create: bool = False) -> control.QueueState:
        """Pause ``queue`` for every drainer on every host: from the commit on they claim
        nothing; what they hold (a batch in flight) they finish. A queue nothing knows of (no
        job, no row, no handler or declaration of this app) is refused (``InvalidJobOption``:
        a typo) unless ``create``; ``default`` is always known."""
        here = {DEFAULT_QUEUE} | {defaults.queue for defaults in self.job_types.values()}
        return await control.pause_queue(self.database, queue, known=here, create=create)

    @_schema_checked
    async def resume_queue(self, queue: str) -> control.QueueState:
        """Resume ``queue``: its drainers are woken by a notification and claim again."""
        return await control.resume_queue(self.database, queue)

    @_schema_checked
    async def delete_queue(self, queue: str) -> control.QueueDeletion:
        """Remove ``queue``'s row (and its pause) if no job names it; ``deleted`` says whether."""
        return await control.delete_queue(self.database, queue)

    @_schema_checked
    async def queues(self) -> list[control.QueueInfo]:
        """Every queue the tables or this app know of: counts, due jobs, drainers, paused,
        unserved (``cronlock queue list``)."""
        here = {defaults.queue for defaults in self.job_types.values()}
        return await control.list_queues(self.database, here)

    @_schema_checked
    async def prune(self, *, dry_run: bool = False, now: datetime | None = None) -> PruneResult:
        """The built-in task ``prune`` now: delete what ``retention`` no longer keeps
        (``dry_run``: count it only). A ``ConfigurationError`` when retention is off."""
        if self.retention is None:
            raise ConfigurationError("retention is off for this app (App(retention=False))")
        return await prune(self.database, self.retention, dry_run=dry_run, now=now)

    async def aclose(self) -> None:
        if self._waits is not None:
            await self._waits.close()
            self._waits = None
        if self._database is not None:
            await self._database.dispose()
