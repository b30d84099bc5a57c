"""The reward-model HTTP service: FastAPI on uvicorn, with requests micro-batched into shared
forward passes.

RL trainers call the service from many rollout workers at once. The stdlib server it replaces
(``benchmarks.serving_legacy``, kept as the benchmark's baseline) had a listen backlog of 5 and
reset connections under load (issue 14: 33 of 200 concurrent requests). Here:

* **uvicorn** (asyncio, uvloop and httptools where installed) owns the connections: a listen
  backlog of 2048, keep-alive timeout, and a deadline on receiving a body (408), so a slow or
  idle client holds one coroutine and blocks nobody.
* **Validation is the shared core** (``training.reward_models.serving.parse_score_request`` and friends): the
  same 4xx statuses and messages naming the field as before. The pydantic models below only
  describe the request and responses on the OpenAPI page (``/docs``); they do not validate, so
  no error changes wording.
* **Micro-batching** (:class:`MicroBatcher`): each validated request joins a queue; one scoring
  thread takes everything waiting (up to ``max_batch_states`` states), scores it in one
  ``RewardScorer.score_states`` call and hands each request its own slice. While the model is
  busy, new requests pile up and form the next batch; when it is idle, a batch waits at most
  ``max_wait_ms`` and only while other requests are still being received (a lone caller pays
  no wait).
* **A bounded queue**: beyond ``max_queue_requests`` requests or ``max_queue_states`` states
  waiting, a request is answered 503 with ``Retry-After`` (the queue's states over the measured
  states/s) right away: never a reset, never a hang.
* ``--device`` / ``--dtype``: see ``training.reward_models.serving.resolve_precision``; the scoring thread runs
  every forward pass inside :meth:`Precision.scoring_context` (CUDA autocast for frozen mode).

Start it with ``python -m training.reward_models.serve`` (:func:`run_server`) or, in tests and benchmarks,
:func:`serve_in_background` (:class:`BackgroundServer`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import socket
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager, nullcontext
from dataclasses import asdict, dataclass
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from training.reward_models.models import RewardScorer
from training.reward_models.serving import (
    Precision,
    RequestError,
    ScoreRequest,
    ServingLimits,
    check_content_length,
    check_content_type,
    decode_score_request,
    error_body,
    model_description,
    model_info,
)

log = logging.getLogger(__name__)

# Bodies above this are parsed on a worker thread: an 8 MiB JSON body takes ~100 ms to parse and
# validate, which on the event loop would stall every other connection; a small one is faster inline.
INLINE_PARSE_BYTES = 64 * 1024
SERVER_HEADER = "StepwiseReward/2.0"


@dataclass(frozen=True)
class BatchingSettings:
    """How the service batches, bounds its queue and treats connections."""

    max_batch_states: int = 512  # states per forward pass (a larger single request is scored alone)
    max_wait_ms: float = 2.0  # how long a batch waits for requests still being received
    max_queue_requests: int = 1024  # requests waiting beyond the batch being scored; then 503
    max_queue_states: int = 16_384  # states waiting; then 503 (an empty queue admits any one request)
    body_timeout_s: float = 30.0  # to receive a request's body once its headers are in; then 408
    backlog: int = 2048  # listen backlog (the kernel caps it at net.core.somaxconn)
    keep_alive_s: int = 5  # an idle keep-alive connection is closed after this
    retry_after_max_s: int = 30

    def __post_init__(self) -> None:
        for name in ("max_batch_states", "max_queue_requests", "max_queue_states", "backlog", "retry_after_max_s"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.max_wait_ms < 0 or self.body_timeout_s <= 0 or self.keep_alive_s < 1:
            raise ValueError("max_wait_ms must be >= 0, body_timeout_s > 0 and keep_alive_s >= 1")

    def to_json(self) -> dict:
        """As ``GET /v1/model`` reports it."""
        return asdict(self)


class ServiceUnavailable(Exception):
    """The queue is full (or the service is stopping): answer 503 with ``Retry-After``."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s


class ScoringFailed(Exception):
    """The model raised on a request's states (a bug, not the caller's fault): answer 500."""


@dataclass(eq=False)
class _Job:
    request: ScoreRequest
    n_states: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future


class MicroBatcher:
    """A bounded queue of validated requests and the one thread that scores them in batches.

    Request handlers (on the event loop) call :meth:`submit` and await the future it returns; the
    scoring thread settles it through the loop's ``call_soon_threadsafe``. One thread does every
    forward pass, so the model, its segment cache and the CUDA stream are used by one thread only.
    Counters (``batches``, ``requests``, ``states``, ``rejected``, ...) are written by that thread
    and :meth:`submit` and read by :meth:`stats`.
    """

    def __init__(
        self,
        scorer: RewardScorer,
        settings: BatchingSettings = BatchingSettings(),
        scoring_context: Callable[[], AbstractContextManager] = nullcontext,
    ) -> None:
        self.scorer = scorer
        self.settings = settings
        self._scoring_context = scoring_context
        self._cond = threading.Condition()
        self._queue: deque[_Job] = deque()
        self._queued_states = 0
        self._batch_states = 0  # states of the batch being scored now
        self._arriving = 0  # requests whose body is being received or parsed
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._states_per_s: float | None = None  # moving average, for Retry-After
        self.batches = 0
        self.requests = 0
        self.states = 0
        self.rejected = 0
        self.failed = 0
        self.largest_batch_requests = 0
        self.largest_batch_states = 0
        self.busy_s = 0.0  # time in forward passes: busy_s over wall time is the model's utilisation

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Start the scoring thread."""
        with self._cond:
            if self._thread is not None:
                return
            self._stopping = False
            self._thread = threading.Thread(target=self._run, name="reward-scoring", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop taking requests, answer the queued ones 503, and let the current batch finish."""
        with self._cond:
            self._stopping = True
            pending = list(self._queue)
            self._queue.clear()
            self._queued_states = 0
            self._cond.notify_all()
            thread, self._thread = self._thread, None
        for job in pending:
            self._settle(job, error=ServiceUnavailable("the service is shutting down", 1))
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # -- the request side (event loop) -------------------------------------------------------

    @contextmanager
    def arriving(self) -> Iterator[None]:
        """Mark a request as on its way (body being received or parsed): an idle scorer waits up
        to ``max_wait_ms`` for such requests before starting a batch without them."""
        with self._cond:
            self._arriving += 1
        try:
            yield
        finally:
            with self._cond:
                self._arriving -= 1
                self._cond.notify_all()

    def submit(self, request: ScoreRequest) -> asyncio.Future:
        """Queue a validated request (from a coroutine); the future resolves to its ``results``
        list, or raises :class:`ScoringFailed` / :class:`ServiceUnavailable`. Raises
        :class:`ServiceUnavailable` at once when the queue is full."""
        loop = asyncio.get_running_loop()
        job = _Job(request, request.n_states, loop, loop.create_future())
        s = self.settings
        with self._cond:
            if self._stopping or self._thread is None:
                raise ServiceUnavailable("the service is not scoring (starting or shutting down)", 1)
            # An empty queue admits any request, so one larger than max_queue_states is still served.
            if self._queue and (
                len(self._queue) >= s.max_queue_requests or self._queued_states + job.n_states > s.max_queue_states
            ):
                self.rejected += 1
                raise ServiceUnavailable(
                    f"the scoring queue is full ({len(self._queue)} requests, {self._queued_states} states "
                    f"waiting; at most {s.max_queue_requests} requests, {s.max_queue_states} states)",
                    self._retry_after_locked(),
                )
            self._queue.append(job)
            self._queued_states += job.n_states
            self._cond.notify_all()
        return job.future

    def _retry_after_locked(self) -> int:
        pending = self._queued_states + self._batch_states
        seconds = pending / self._states_per_s if self._states_per_s else 1.0
        return max(1, min(self.settings.retry_after_max_s, math.ceil(seconds)))

    def stats(self) -> dict:
        """Counters for ``GET /v1/stats`` and the tests."""
        with self._cond:
            return {
                "batches": self.batches,
                "requests": self.requests,
                "states": self.states,
                "rejected": self.rejected,
                "failed": self.failed,
                "largest_batch_requests": self.largest_batch_requests,
                "largest_batch_states": self.largest_batch_states,
                "queued_requests": len(self._queue),
                "queued_states": self._queued_states,
                "arriving": self._arriving,
                "states_per_s": round(self._states_per_s, 1) if self._states_per_s else None,
                "busy_s": round(self.busy_s, 3),
            }

    # -- the scoring thread -----------------------------------------------------------------

    def _run(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            try:
                self._score(batch)
            except BaseException as exc:  # never let the thread die with requests waiting on it
                log.exception("the scoring thread failed")
                for job in batch:
                    self._settle(job, error=ScoringFailed(str(exc)))
            finally:
                with self._cond:
                    self._batch_states = 0

    def _next_batch(self) -> list[_Job] | None:
        s = self.settings
        with self._cond:
            while not self._queue and not self._stopping:
                self._cond.wait()
            if self._stopping:
                return None
            batch = [self._queue.popleft()]
            n = batch[0].n_states
            deadline = time.monotonic() + s.max_wait_ms / 1000
            while n < s.max_batch_states and not self._stopping:
                if self._queue:
                    if n + self._queue[0].n_states > s.max_batch_states:
                        break
                    job = self._queue.popleft()
                    batch.append(job)
                    n += job.n_states
                    continue
                remaining = deadline - time.monotonic()
                if self._arriving <= 0 or remaining <= 0:  # nothing on its way: waiting is pure latency
                    break
                self._cond.wait(remaining)
            self._queued_states -= n
            self._batch_states = n
            return batch

    def _score(self, jobs: list[_Job]) -> None:
        kind = self.scorer.kind
        ready: list[tuple[_Job, int]] = []
        states = []
        for job in jobs:
            try:
                job_states = job.request.model_states(kind)
            except Exception as exc:  # noqa: BLE001 - a bug in building one request's states: its 500 only
                log.exception("building the states of a request failed")
                self._settle(job, error=ScoringFailed(str(exc)))
                continue
            ready.append((job, len(job_states)))
            states.extend(job_states)
        if not ready:
            return
        started = time.perf_counter()
        with self._cond:
            self.batches += 1
        try:
            with self._scoring_context():
                scores = self.scorer.score_states(states)
        except Exception as exc:
            if len(ready) > 1:  # one request's states broke the pass: alone, the 500 reaches only that one
                for job, _ in ready:
                    self._score([job])
                return
            log.exception("scoring failed")
            with self._cond:
                self.failed += 1
            self._settle(ready[0][0], error=ScoringFailed(str(exc)))
            return
        seconds = time.perf_counter() - started
        rate = len(states) / max(seconds, 1e-6)
        with self._cond:
            self.busy_s += seconds
            self._states_per_s = rate if self._states_per_s is None else 0.8 * self._states_per_s + 0.2 * rate
            self.requests += len(ready)
            self.states += len(states)
            self.largest_batch_requests = max(self.largest_batch_requests, len(ready))
            self.largest_batch_states = max(self.largest_batch_states, len(states))
        start = 0
        for job, n in ready:
            job_scores = scores[start : start + n]
            start += n
            try:
                self._settle(job, results=job.request.results(kind, job_scores))
            except Exception as exc:  # noqa: BLE001 - the same: one request's 500
                log.exception("building the results of a request failed")
                self._settle(job, error=ScoringFailed(str(exc)))

    @staticmethod
    def _settle(job: _Job, *, results: list[dict] | None = None, error: Exception | None = None) -> None:
        def settle() -> None:
            if job.future.done():  # the handler went away (client disconnected, server stopping)
                return
            if error is not None:
                job.future.set_exception(error)
            else:
                job.future.set_result(results)

        try:
            job.loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the loop is closed: the server stopped and nobody is waiting
            pass


# ---------------------------------------------------------------------------------------------
# Request and response models: the OpenAPI page's description (validation is parse_score_request)
# ---------------------------------------------------------------------------------------------


class ElementIn(BaseModel):
    """A screen element (the fields of ``warehouse.model.UIElement``); it needs at least one of
    role, text, element_id, description."""

    model_config = ConfigDict(extra="forbid")
    ref: str | None = None
    role: str | None = None
    text: str | None = None
    element_id: str | None = None
    classes: str | None = None
    description: str | None = None
    value: str | None = None
    parent_ref: str | None = None
    clickable: bool = False
    editable: bool = False
    focused: bool = False
    checked: bool | None = None
    depth: int = Field(0, ge=0, le=1000)
    bounds: tuple[float, float, float, float] | None = Field(None, description="[left, top, right, bottom]")


class StepIn(BaseModel):
    """One step of a trajectory: the screen the agent saw before the action, and the action."""

    model_config = ConfigDict(extra="forbid")
    screen: list[ElementIn] | str = Field(description="element objects, or pre-rendered lines")
    action: str = Field(description='canonical action text, e.g. CLICK(button#subbtn "Login")')
    target: int | str | None = Field(
        None, description="index (or ref) of the acted-on element; adds its surrounding texts as in training"
    )


class TrajectoryIn(BaseModel):
    """A whole trajectory, scored at every step."""

    model_config = ConfigDict(extra="forbid")
    id: str | int | None = None
    task_id: str | None = None
    instruction: str
    steps: list[StepIn] = Field(min_length=1)
    final_screen: list[ElementIn] | str | None = Field(None, description="the screen after the last action")


class StateIn(BaseModel):
    """A single state the caller assembled (history included)."""

    model_config = ConfigDict(extra="forbid")
    instruction: str
    history: list[str] = Field(default_factory=list)
    screen: list[ElementIn] | str
    action: str | None = Field(None, description="the candidate action (required for prm and guidnav)")


class ScoreRequestBody(BaseModel):
    """``POST /v1/score``: exactly one of ``trajectories`` and ``steps``."""

    model_config = ConfigDict(extra="forbid")
    k: int = Field(1, ge=1, le=100, description="progress history length of Eq. 2: r_t = p_t - p_{t-k}")
    trajectories: list[TrajectoryIn] | None = None
    steps: list[StateIn] | None = None


class ModelInfo(BaseModel):
    """The model that answered."""

    kind: str
    model_id: str | None = None
    encoder_mode: str
    backbone: str
    scores_progress: bool


class TrajectoryResult(BaseModel):
    """Per-step scores of one trajectory (or, for ``steps``, of all states)."""

    id: str | None = None
    scores: list[float]
    progress_gains: list[float] | None = None
    rewards: list[float] | None = None


class ScoreResponse(BaseModel):
    """A scored request; ``elapsed_ms`` is from queueing to its batch's scores."""

    model: ModelInfo
    results: list[TrajectoryResult]
    elapsed_ms: float


class ErrorDetail(BaseModel):
    """Why a request was refused."""

    status: int
    reason: str
    message: str


class ErrorResponse(BaseModel):
    """Every refusal (4xx, 500, 503)."""

    error: ErrorDetail


class Health(BaseModel):
    """``GET /health``."""

    status: str
    kind: str


def _json(status: int, payload: Any, headers: dict[str, str] | None = None) -> Response:
    # json.dumps as the stdlib server wrote it (Starlette's JSONResponse would refuse a NaN score)
    return Response(json.dumps(payload).encode(), status_code=status, media_type="application/json", headers=headers)


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    # Connection: close as before: after a refusal the client starts over on a fresh connection
    return _json(status, error_body(status, message), {"Connection": "close", **(headers or {})})


async def _receive_body(request: Request, declared: int, timeout_s: float) -> bytes:
    try:
        return await asyncio.wait_for(request.body(), timeout_s)
    except TimeoutError:
        raise RequestError(408, f"the body ({declared} bytes declared) did not arrive within {timeout_s:g} s") from None


_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": description}
    for status, description in {
        400: "malformed JSON",
        408: "the body did not arrive in time",
        411: "no Content-Length",
        413: "body, batch, screen or text too large",
        415: "not application/json",
        422: "invalid fields (the message names the field)",
        500: "scoring failed",
        503: "the scoring queue is full: retry after the Retry-After header's seconds",
    }.items()
}


# long: the routes are closures over one scorer, batcher and limits; FastAPI declares them inside
# the factory, and each route is a few lines.
def create_app(
    scorer: RewardScorer,
    limits: ServingLimits | None = None,
    batching: BatchingSettings | None = None,
    precision: Precision | None = None,
) -> FastAPI:
    """The ASGI app serving ``scorer``; ``app.state.batcher`` is its :class:`MicroBatcher`
    (started and stopped with the app's lifespan)."""
    limits = limits or ServingLimits()
    batching = batching or BatchingSettings()
    precision = precision or Precision(device=str(scorer.device))
    batcher = MicroBatcher(scorer, batching, precision.scoring_context)
    info = model_info(scorer)
    description = model_description(scorer, limits) | {
        "precision": precision.to_json(),
        "batching": batching.to_json(),
    }

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        try:
            yield
        finally:
            await asyncio.to_thread(batcher.stop)  # joins the scoring thread: not on the event loop

    app = FastAPI(
        title="Stepwise reward-model service",
        version="2.0",
        description=(
            f"Scores GUI-agent trajectories with a trained **{scorer.kind}** reward model (ProgRM, ORM, "
            "GUI-Shepherd PRM or GuidNav). Concurrent requests are scored together in shared forward passes."
        ),
        lifespan=lifespan,
    )
    app.state.batcher = batcher

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        path = request.url.path
        if exc.status_code == 404:
            message = f"no such path {path}; try GET /health, GET /v1/model, POST /v1/score"
        elif exc.status_code == 405:
            message = "use POST /v1/score" if path == "/v1/score" else f"{request.method} {path} is not served; use GET"
        else:
            message = str(exc.detail)
        return _error(exc.status_code, message, dict(exc.headers or {}))

    app.add_exception_handler(StarletteHTTPException, http_error)

    @app.get("/health", responses={200: {"model": Health}})
    async def health() -> Response:
        """Liveness, and the kind of model served."""
        return _json(200, {"status": "ok", "kind": scorer.kind})

    @app.get("/v1/model")
    async def model() -> Response:
        """The model's kind, config, training metadata, request limits, device/dtype and batching."""
        return _json(200, description)

    @app.get("/v1/stats")
    async def stats() -> Response:
        """The micro-batcher's counters: forward passes (``batches``), requests, states, refusals, queue."""
        return _json(200, batcher.stats())

    @app.post(
        "/v1/score",
        responses={200: {"model": ScoreResponse}, **_ERRORS},
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ScoreRequestBody"}}},
            }
        },
    )
    async def score(request: Request) -> Response:
        """Per-step scores and rewards of whole trajectories (or of single states)."""
        started = time.perf_counter()
        with batcher.arriving():
            try:
                declared = check_content_length(request.headers.get("content-length"), limits)
                body = await _receive_body(request, declared, batching.body_timeout_s)
                # (after the body: a refusal that leaves the body unread can reach the client as a reset)
                check_content_type(request.headers.get("content-type"))
                if len(body) > INLINE_PARSE_BYTES:
                    parsed = await run_in_threadpool(decode_score_request, body, limits, scorer.kind)
                else:
                    parsed = decode_score_request(body, limits, scorer.kind)
            except RequestError as exc:
                return _error(exc.status, exc.message)
            except ClientDisconnect:
                return _error(400, "the client disconnected before sending its body")
            except Exception:  # a bug in reading the request: still answer, in JSON (the fuzz tests look)
                log.exception("reading the request failed")
                return _error(500, "internal error while reading the request")
            try:
                future = batcher.submit(parsed)
            except ServiceUnavailable as exc:
                return _error(503, exc.message, {"Retry-After": str(exc.retry_after_s)})
        try:
            results = await future
        except ServiceUnavailable as exc:
            return _error(503, exc.message, {"Retry-After": str(exc.retry_after_s)})
        except ScoringFailed as exc:
            return _error(500, f"scoring failed: {exc}")
        return _json(
            200, {"model": info, "results": results, "elapsed_ms": round((time.perf_counter() - started) * 1000, 3)}
        )

    def openapi() -> dict[str, Any]:
        # The request body is documented from ScoreRequestBody without FastAPI validating it (the
        # handler reads the raw body so that parse_score_request's errors stay as they were).
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            request_schema = ScoreRequestBody.model_json_schema(ref_template="#/components/schemas/{model}")
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.update(request_schema.pop("$defs", {}))
            components["ScoreRequestBody"] = request_schema
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


# ---------------------------------------------------------------------------------------------
# Running it
# ---------------------------------------------------------------------------------------------


def bind_socket(host: str, port: int, backlog: int) -> socket.socket:
    """A listening TCP socket on (host, port); port 0 picks a free one. Bound here rather than by
    uvicorn so that the caller knows the real port before the server starts."""
    addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = addresses[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock


def uvicorn_config(app: FastAPI, batching: BatchingSettings, *, log_level: str = "info") -> uvicorn.Config:
    """uvicorn's settings for the service (no access log: one line per request costs more than
    scoring a small one; logging is left as the caller configured it)."""
    return uvicorn.Config(
        app,
        lifespan="on",
        backlog=batching.backlog,
        timeout_keep_alive=batching.keep_alive_s,
        timeout_graceful_shutdown=max(5, math.ceil(batching.body_timeout_s)),
        access_log=False,
        log_config=None,
        log_level=log_level,
        server_header=False,
        headers=[("server", SERVER_HEADER)],
    )


class BackgroundServer:
    """The service on a daemon thread, shaped like the stdlib server it replaced:
    ``server_address``, ``shutdown()``, ``server_close()``; plus ``batcher`` and ``app``."""

    def __init__(self, app: FastAPI, sock: socket.socket, config: uvicorn.Config) -> None:
        self.app = app
        self.batcher: MicroBatcher = app.state.batcher
        self._sock = sock
        host, port = sock.getsockname()[:2]
        self.server_address: tuple[str, int] = (host, port)
        self._server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="reward-http", daemon=True
        )

    def start(self, timeout_s: float = 60.0) -> None:
        """Start serving; returns once uvicorn has started (the lifespan ran, the socket is served)."""
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the reward-model service did not start (see the log)")
            if time.monotonic() > deadline:
                self.shutdown()
                raise RuntimeError(f"the reward-model service did not start within {timeout_s:g} s")
            time.sleep(0.01)

    def shutdown(self, timeout_s: float = 60.0) -> None:
        """Stop: no new connections, in-flight requests finish, the scoring thread stops."""
        self._server.should_exit = True
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join(timeout_s)

    def server_close(self) -> None:
        """Close the listening socket (uvicorn closes it on shutdown; this is for a server that
        never started)."""
        self._sock.close()


def serve_in_background(
    scorer: RewardScorer,
    host: str = "127.0.0.1",
    port: int = 0,
    limits: ServingLimits | None = None,
    batching: BatchingSettings | None = None,
    precision: Precision | None = None,
) -> tuple[BackgroundServer, threading.Thread]:
    """Serve ``scorer`` on a daemon thread (port 0: a free one); returns (server, thread) once it
    serves."""
    batching = batching or BatchingSettings()
    sock = bind_socket(host, port, batching.backlog)
    app = create_app(scorer, limits, batching, precision)
    server = BackgroundServer(app, sock, uvicorn_config(app, batching, log_level="warning"))
    server.start()
    return server, server.thread


def run_server(
    scorer: RewardScorer,
    host: str,
    port: int,
    limits: ServingLimits | None = None,
    batching: BatchingSettings | None = None,
    precision: Precision | None = None,
    *,
    on_listening: Callable[[str, int], None] | None = None,
) -> None:
    """Serve ``scorer`` in this thread until SIGINT/SIGTERM (uvicorn handles both gracefully).
    ``on_listening(host, port)`` is called once the socket listens (port 0: the real one)."""
    batching = batching or BatchingSettings()
    sock = bind_socket(host, port, batching.backlog)
    app = create_app(scorer, limits, batching, precision)
    bound_host, bound_port = sock.getsockname()[:2]
    if on_listening is not None:
        on_listening(bound_host, bound_port)
    uvicorn.Server(uvicorn_config(app, batching)).run(sockets=[sock])
