"""The stdlib HTTP server the reward-model service ran on before ``training.reward_models.serving_app``:
**a benchmark baseline only** (``benchmarks/bench_serving.py``), not for serving.

It is the server of issue 14 as it was: ``http.server.ThreadingHTTPServer`` with the
socketserver's listen backlog of 5 (``request_queue_size``), one thread per connection, every
model call serialised behind the scorer's lock, no queue bound. Under 200 concurrent clients it
reset about a sixth of the connections. The request validation is the shared one
(``training.reward_models.serving``), so both servers answer the same requests the same way.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from training.reward_models.models import RewardScorer
from training.reward_models.serving import (
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


class LegacyRewardHTTPServer(ThreadingHTTPServer):
    """BASELINE: the old threading stdlib server holding one scorer (model calls serialised)."""

    daemon_threads = True
    server_address: tuple[str, int]  # IPv4 (host, port), as bound: the port is the real one when 0 was asked

    def __init__(self, address: tuple[str, int], scorer: RewardScorer, limits: ServingLimits | None = None) -> None:
        self.scorer = scorer
        self.limits = limits or ServingLimits()
        self.model_info = model_info(scorer)
        super().__init__(address, LegacyRewardRequestHandler)


class LegacyRewardRequestHandler(BaseHTTPRequestHandler):
    """BASELINE: the old request handler (one thread per connection)."""

    server: LegacyRewardHTTPServer
    protocol_version = "HTTP/1.1"
    server_version = "StepwiseReward/1.0"

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the stdlib's name
        log.info("%s %s", self.address_string(), format % args)

    def _send(self, status: int, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if status >= 400:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str) -> None:
        self._send(status, error_body(status, message))

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        if self.path == "/health":
            self._send(200, {"status": "ok", "kind": self.server.scorer.kind})
        elif self.path == "/v1/model":
            self._send(200, model_description(self.server.scorer, self.server.limits))
        elif self.path == "/v1/score":
            self._error(405, "use POST /v1/score")
        else:
            self._error(404, f"no such path {self.path}; try GET /health, GET /v1/model, POST /v1/score")

    def do_POST(self) -> None:  # noqa: N802
        if self.path != "/v1/score":
            self._error(
                404 if self.path not in ("/health", "/v1/model") else 405,
                f"POST {self.path} is not served; use POST /v1/score",
            )
            return
        try:
            request = self._read_request()
        except RequestError as exc:
            self._error(exc.status, exc.message)
            return
        except Exception:  # a bug in reading the request: still answer, in JSON
            log.exception("reading the request failed")
            self._error(500, "internal error while reading the request")
            return
        started = time.perf_counter()
        try:
            scorer = self.server.scorer
            states = request.model_states(scorer.kind)
            out = request.results(scorer.kind, scorer.score_states(states))
        except Exception as exc:  # a bug, not the caller's fault: 500 with the reason
            log.exception("scoring failed")
            self._error(500, f"scoring failed: {exc}")
            return
        self._send(
            200,
            {
                "model": self.server.model_info,
                "results": out,
                "elapsed_ms": round((time.perf_counter() - started) * 1000, 3),
            },
        )

    def _read_request(self) -> ScoreRequest:
        limits = self.server.limits
        check_content_type(self.headers.get("Content-Type"))
        length = check_content_length(self.headers.get("Content-Length"), limits)
        return decode_score_request(self.rfile.read(length), limits, self.server.scorer.kind)


def legacy_serve_in_background(
    scorer: RewardScorer, host: str = "127.0.0.1", port: int = 0, limits: ServingLimits | None = None
) -> tuple[LegacyRewardHTTPServer, threading.Thread]:
    """BASELINE: start the old server on a daemon thread; returns (server, thread)."""
    server = LegacyRewardHTTPServer((host, port), scorer, limits)
    thread = threading.Thread(target=server.serve_forever, name="legacy-reward-http", daemon=True)
    thread.start()
    return server, thread
