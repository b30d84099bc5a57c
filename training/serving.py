"""Serving reward models to an RL trainer: a batch scoring API in Python and a small HTTP service.

Python::

    scorer = RewardScorer.from_checkpoint("<STEPWISE_HOME>/models/progrm_env/.../final")
    results = score_trajectories(scorer, [trajectory], k=1)
    results[0].scores          # p_t: progress after each action (ProgRM) / success belief (ORM)
    results[0].progress_gains  # r_t = p_t - p_{t-k}, p_{-1} = 0 (ProgRM Eq. 2)

HTTP (stdlib ``http.server``, one model per process)::

    python -m training.serving --checkpoint <model folder> --host 127.0.0.1 --port 8765

    GET  /health      -> {"status": "ok", "kind": ...}
    GET  /v1/model    -> the model's kind, config, training metadata and the request limits
    POST /v1/score    -> per-step scores and rewards

Request body of ``POST /v1/score`` (JSON, ``Content-Type: application/json``), either whole
trajectories::

    {"k": 1,
     "trajectories": [{"id": "ep-1", "instruction": "Enter the username ...",
                       "steps": [{"screen": [{"role": "textbox", "element_id": "username", ...}, ...],
                                  "action": "CLICK(textbox#username)",
                                  "target": 3}, ...],          # optional: index (or ref) of the target
                       "final_screen": [...]}]}          # optional: the screen after the last action

or single states (the caller assembles the history)::

    {"steps": [{"instruction": "...", "history": ["CLICK(...)", ...], "screen": "...", "action": "..."}]}

A screen is a list of element objects (the fields of ``warehouse.model.UIElement``: role, text,
element_id, classes, description, value, clickable, editable, checked, focused, depth, ...) or
a string of pre-rendered lines. ``target`` (optional) names the element the action acted on, so
that its surrounding texts are added to the action as in training (``training.rm_datasets.target_context``:
``CLICK(span.retweet) within "@lacus" ...``). ``steps[t].screen`` is the screen the agent saw *before* action
``t``; for progress models the score of step ``t`` is the progress *after* action ``t``, read from
the next step's screen (``training.rm_datasets.progress_state``).

Response: ``{"model": {...}, "results": [{"id", "scores", "progress_gains", "rewards"}], "elapsed_ms"}``;
``rewards`` are the progress gains for progress/outcome models and the scores themselves for
step judges (PRM, GuidNav: GUI-Shepherd Eq. 3 uses the PRM output as the step reward).

Bad requests get a JSON error and a 4xx status: 400 malformed JSON, 404 unknown path, 405 wrong
method, 411 no Content-Length, 413 body or batch too large, 415 not JSON, 422 invalid fields
(the message names the field, e.g. ``trajectories[0].steps[2].action``).
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal, overload

import numpy as np

from training.models import RewardScorer
from training.rm_datasets import (
    StepState,
    TextStep,
    TextTrajectory,
    action_in_context,
    kind_spec,
    progress_gains,
    screen_lines,
    state_for,
    target_context,
)
from warehouse.model import Screen, UIElement

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# Batch scoring API
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrajectoryScores:
    """A trajectory's per-step scores and rewards."""

    scores: list[float]
    progress_gains: list[float] | None  # Eq. 2, for progress / outcome models
    rewards: list[float]


def score_trajectories(
    scorer: RewardScorer, trajectories: Sequence[TextTrajectory], k: int = 1
) -> list[TrajectoryScores]:
    """Score every step of every trajectory in one batched call.

    Progress and outcome models (ProgRM, ORM) score the state after each action and return
    Eq. 2 gains ``r_t = p_t - p_{t-k}`` as rewards; step judges (PRM, GuidNav) score each
    (state, action) and their scores are the rewards.
    """
    states: list[StepState] = []
    for traj in trajectories:
        states.extend(state_for(scorer.kind, traj, t) for t in range(len(traj)))
    scores = scorer.score_states(states) if states else np.zeros(0)
    progress_kind = kind_spec(scorer.kind).scores_progress
    results, start = [], 0
    for traj in trajectories:
        s = scores[start : start + len(traj)]
        start += len(traj)
        gains = progress_gains(s, k) if progress_kind else None
        results.append(
            TrajectoryScores(
                scores=[float(x) for x in s],
                progress_gains=[float(x) for x in gains] if gains is not None else None,
                rewards=[float(x) for x in (gains if gains is not None else s)],
            )
        )
    return results


# ---------------------------------------------------------------------------------------------
# Request parsing and validation
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServingLimits:
    """What one request may contain; beyond it the service answers 413."""

    max_body_bytes: int = 8 * 1024 * 1024
    max_trajectories: int = 256
    max_states: int = 4096  # steps over all trajectories, or single states
    max_elements_per_screen: int = 2000
    max_text_chars: int = 20_000
    max_history: int = 1000
    max_k: int = 100

    def to_json(self) -> dict:
        return self.__dict__.copy()


class RequestError(Exception):
    """A request the service refuses: an HTTP status and a message naming the problem."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


ELEMENT_STRING_FIELDS = ("ref", "role", "text", "element_id", "classes", "description", "value", "parent_ref")
ELEMENT_BOOL_FIELDS = ("clickable", "editable", "focused")


@overload
def _string(
    value: Any, where: str, limits: ServingLimits, *, required: Literal[True] = True, allow_empty: bool = True
) -> str: ...


@overload
def _string(
    value: Any, where: str, limits: ServingLimits, *, required: bool, allow_empty: bool = True
) -> str | None: ...


def _string(
    value: Any, where: str, limits: ServingLimits, *, required: bool = True, allow_empty: bool = True
) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise RequestError(422, f"{where} must be a string")
    if len(value) > limits.max_text_chars:
        raise RequestError(413, f"{where} is longer than {limits.max_text_chars} characters")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:  # JSON's "\ud800": no tokenizer can read a lone surrogate
            raise RequestError(
                422, f"{where} is not valid Unicode text (a lone surrogate at character {exc.start})"
            ) from None
    if not allow_empty and not value.strip():
        raise RequestError(422, f"{where} must not be empty")
    return value


def parse_element(raw: Any, where: str, limits: ServingLimits) -> UIElement:
    """One screen element object -> UIElement (unknown keys rejected, types checked)."""
    if not isinstance(raw, dict):
        raise RequestError(422, f"{where} must be an object")
    known = set(ELEMENT_STRING_FIELDS) | set(ELEMENT_BOOL_FIELDS) | {"checked", "depth", "bounds"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise RequestError(422, f"{where} has unknown fields {unknown}; allowed: {sorted(known)}")
    kwargs: dict[str, Any] = {"ref": "", "role": ""}
    for name in ELEMENT_STRING_FIELDS:
        if name in raw and raw[name] is not None:
            kwargs[name] = _string(raw[name], f"{where}.{name}", limits)
    if not (kwargs.get("role") or kwargs.get("text") or kwargs.get("element_id") or kwargs.get("description")):
        raise RequestError(422, f"{where} needs at least one of role, text, element_id, description")
    for name in ELEMENT_BOOL_FIELDS:
        if name in raw:
            if not isinstance(raw[name], bool):
                raise RequestError(422, f"{where}.{name} must be true or false")
            kwargs[name] = raw[name]
    if "checked" in raw:
        if raw["checked"] is not None and not isinstance(raw["checked"], bool):
            raise RequestError(422, f"{where}.checked must be true, false or null")
        kwargs["checked"] = raw["checked"]
    if "depth" in raw:
        if not isinstance(raw["depth"], int) or isinstance(raw["depth"], bool) or not 0 <= raw["depth"] <= 1000:
            raise RequestError(422, f"{where}.depth must be an integer in [0, 1000]")
        kwargs["depth"] = raw["depth"]
    if "bounds" in raw and raw["bounds"] is not None:
        b = raw["bounds"]
        if not (
            isinstance(b, list)
            and len(b) == 4
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in b)
        ):
            raise RequestError(422, f"{where}.bounds must be 4 numbers [left, top, right, bottom]")
        kwargs["bounds"] = tuple(float(x) for x in b)
    return UIElement(**kwargs)


def parse_screen_elements(
    raw: Any, where: str, limits: ServingLimits
) -> tuple[tuple[str, ...], list[UIElement] | None]:
    """A screen (element list or pre-rendered text) -> (prompt lines as ``Screen.to_text``, the
    elements, or None for a text screen)."""
    if isinstance(raw, str):
        _string(raw, where, limits)
        return tuple(line for line in raw.split("\n") if line.strip()), None
    if not isinstance(raw, list):
        raise RequestError(422, f"{where} must be a list of element objects or a string")
    if len(raw) > limits.max_elements_per_screen:
        raise RequestError(413, f"{where} has {len(raw)} elements; at most {limits.max_elements_per_screen}")
    elements = [parse_element(e, f"{where}[{i}]", limits) for i, e in enumerate(raw)]
    return screen_lines(Screen(tuple(elements))), elements


def parse_screen(raw: Any, where: str, limits: ServingLimits) -> tuple[str, ...]:
    return parse_screen_elements(raw, where, limits)[0]


def parse_action(step: dict, elements: list[UIElement] | None, where: str, limits: ServingLimits) -> str:
    """A step's action as models read it: with the texts around its target when ``target`` (an
    index into the screen's element list, or an element ``ref``) names one (see
    ``training.rm_datasets.target_context``)."""
    action = _action(step.get("action"), f"{where}.action", limits)
    if step.get("target") is None:
        return action
    target = step["target"]
    if elements is None:
        raise RequestError(422, f"{where}.target needs the screen as a list of elements")
    if isinstance(target, int) and not isinstance(target, bool):
        if not 0 <= target < len(elements):
            raise RequestError(422, f"{where}.target {target} is not an index of the screen's {len(elements)} elements")
        index = target
    elif isinstance(target, str):
        found = next((i for i, e in enumerate(elements) if e.ref == target), None)
        if found is None:
            raise RequestError(422, f"{where}.target: no element with ref {target!r} on the screen")
        index = found
    else:
        raise RequestError(422, f"{where}.target must be an element index or ref")
    refs = [e.ref for e in elements]
    if all(refs) and len(set(refs)) == len(refs):  # the caller's refs (and parent_refs) are usable
        records = [e.to_dict() for e in elements]
    else:  # no usable refs: number the elements; parents follow from depth and document order
        records = [e.to_dict() | {"ref": str(i), "parent_ref": None} for i, e in enumerate(elements)]
    return action_in_context(action, target_context(records, records[index]["ref"]))


def _action(raw: Any, where: str, limits: ServingLimits) -> str:
    return _string(raw, where, limits, allow_empty=False)


def parse_trajectory(raw: Any, where: str, limits: ServingLimits) -> TextTrajectory:
    if not isinstance(raw, dict):
        raise RequestError(422, f"{where} must be an object")
    unknown = sorted(set(raw) - {"id", "instruction", "steps", "final_screen", "task_id"})
    if unknown:
        raise RequestError(422, f"{where} has unknown fields {unknown}")
    instruction = _string(raw.get("instruction"), f"{where}.instruction", limits, allow_empty=False)
    steps_raw = raw.get("steps")
    if not isinstance(steps_raw, list) or not steps_raw:
        raise RequestError(422, f"{where}.steps must be a non-empty list")
    steps = []
    for t, step in enumerate(steps_raw):
        at = f"{where}.steps[{t}]"
        if not isinstance(step, dict):
            raise RequestError(422, f"{at} must be an object with screen and action")
        extra = sorted(set(step) - {"screen", "action", "target"})
        if extra:
            raise RequestError(422, f"{at} has unknown fields {extra}")
        if "screen" not in step:
            raise RequestError(422, f"{at}.screen is missing")
        lines, elements = parse_screen_elements(step["screen"], f"{at}.screen", limits)
        steps.append(TextStep(lines, parse_action(step, elements, at, limits)))
    final = raw.get("final_screen")
    episode_id = raw.get("id", where)
    if not isinstance(episode_id, (str, int)) or isinstance(episode_id, bool):
        raise RequestError(422, f"{where}.id must be a string or an integer")
    if isinstance(episode_id, str):
        _string(episode_id, f"{where}.id", limits)
    return TextTrajectory(
        episode_id=str(episode_id),
        task_id=_string(raw.get("task_id"), f"{where}.task_id", limits, required=False) or "",
        instruction=instruction or "",
        steps=tuple(steps),
        final_screen_lines=parse_screen(final, f"{where}.final_screen", limits) if final is not None else None,
    )


def parse_state(raw: Any, where: str, limits: ServingLimits) -> StepState:
    if not isinstance(raw, dict):
        raise RequestError(422, f"{where} must be an object")
    unknown = sorted(set(raw) - {"instruction", "history", "screen", "action"})
    if unknown:
        raise RequestError(422, f"{where} has unknown fields {unknown}")
    history = raw.get("history", [])
    if not isinstance(history, list):
        raise RequestError(422, f"{where}.history must be a list of action strings")
    if len(history) > limits.max_history:
        raise RequestError(413, f"{where}.history has {len(history)} actions; at most {limits.max_history}")
    if "screen" not in raw:
        raise RequestError(422, f"{where}.screen is missing")
    action = raw.get("action")
    return StepState(
        instruction=_string(raw.get("instruction"), f"{where}.instruction", limits, allow_empty=False) or "",
        history=tuple(_action(a, f"{where}.history[{i}]", limits) for i, a in enumerate(history)),
        screen_lines=parse_screen(raw["screen"], f"{where}.screen", limits),
        action=_action(action, f"{where}.action", limits) if action is not None else None,
    )


@dataclass
class ScoreRequest:
    k: int = 1
    trajectories: list[TextTrajectory] = field(default_factory=list)
    states: list[StepState] = field(default_factory=list)


def parse_score_request(payload: Any, limits: ServingLimits, kind: str) -> ScoreRequest:
    """Validate a decoded JSON body; raises :class:`RequestError` with the status to answer."""
    if not isinstance(payload, dict):
        raise RequestError(422, "the body must be a JSON object with 'trajectories' or 'steps'")
    unknown = sorted(set(payload) - {"k", "trajectories", "steps"})
    if unknown:
        raise RequestError(422, f"unknown fields {unknown}; expected 'trajectories' or 'steps' (and 'k')")
    has_traj, has_steps = "trajectories" in payload, "steps" in payload
    if has_traj == has_steps:
        raise RequestError(422, "give exactly one of 'trajectories' and 'steps'")
    k = payload.get("k", 1)
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= limits.max_k:
        raise RequestError(422, f"'k' (progress history length, Eq. 2) must be an integer in [1, {limits.max_k}]")
    request = ScoreRequest(k=k)
    if has_traj:
        raw = payload["trajectories"]
        if not isinstance(raw, list) or not raw:
            raise RequestError(422, "'trajectories' must be a non-empty list")
        if len(raw) > limits.max_trajectories:
            raise RequestError(413, f"{len(raw)} trajectories; at most {limits.max_trajectories} per request")
        n_steps = sum(
            len(t.get("steps") or []) if isinstance(t, dict) and isinstance(t.get("steps"), list) else 0 for t in raw
        )
        if n_steps > limits.max_states:
            raise RequestError(413, f"{n_steps} steps; at most {limits.max_states} per request")
        request.trajectories = [parse_trajectory(t, f"trajectories[{i}]", limits) for i, t in enumerate(raw)]
    else:
        raw = payload["steps"]
        if not isinstance(raw, list) or not raw:
            raise RequestError(422, "'steps' must be a non-empty list")
        if len(raw) > limits.max_states:
            raise RequestError(413, f"{len(raw)} steps; at most {limits.max_states} per request")
        request.states = [parse_state(s, f"steps[{i}]", limits) for i, s in enumerate(raw)]
        judge = not kind_spec(kind).scores_progress
        for i, state in enumerate(request.states):
            if judge and state.action is None:
                raise RequestError(422, f"steps[{i}].action is required: a {kind} model judges a candidate action")
    return request


# ---------------------------------------------------------------------------------------------
# HTTP service
# ---------------------------------------------------------------------------------------------


class RewardHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server holding one scorer (calls into the model are serialised)."""

    daemon_threads = True
    server_address: tuple[str, int]  # IPv4 (host, port), as bound: the port is the real one when 0 was asked

    def __init__(self, address: tuple[str, int], scorer: RewardScorer, limits: ServingLimits = ServingLimits()) -> None:
        self.scorer = scorer
        self.limits = limits
        self.model_info = {
            "kind": scorer.kind,
            "model_id": scorer.metadata.get("model_id"),
            "encoder_mode": scorer.config.encoder_mode,
            "backbone": scorer.config.to_dict()["backbone"],
            "scores_progress": kind_spec(scorer.kind).scores_progress,
        }
        super().__init__(address, RewardRequestHandler)


class RewardRequestHandler(BaseHTTPRequestHandler):
    server: RewardHTTPServer
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
        self._send(status, {"error": {"status": status, "reason": HTTPStatus(status).phrase, "message": message}})

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        if self.path == "/health":
            self._send(200, {"status": "ok", "kind": self.server.scorer.kind})
        elif self.path == "/v1/model":
            meta = self.server.scorer.metadata
            self._send(
                200,
                self.server.model_info
                | {
                    "config": self.server.scorer.config.to_dict(),
                    "validation_metrics": meta.get("validation_metrics"),
                    "label_versions": meta.get("label_versions"),
                    "limits": self.server.limits.to_json(),
                },
            )
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
        except Exception:  # a bug in reading the request: still answer, in JSON (the fuzz tests look for these)
            log.exception("reading the request failed")
            self._error(500, "internal error while reading the request")
            return
        started = time.perf_counter()
        try:
            if request.trajectories:
                results = score_trajectories(self.server.scorer, request.trajectories, request.k)
                out = [
                    {"id": t.episode_id, "scores": r.scores, "progress_gains": r.progress_gains, "rewards": r.rewards}
                    for t, r in zip(request.trajectories, results, strict=True)
                ]
            else:
                scores = self.server.scorer.score_states(request.states)
                out = [{"scores": [float(s) for s in scores]}]
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
        content_type = (self.headers.get("Content-Type") or "application/json").split(";")[0].strip().lower()
        if content_type != "application/json":
            raise RequestError(415, f"Content-Type must be application/json, got {content_type}")
        length_header = self.headers.get("Content-Length")
        if length_header is None:
            raise RequestError(411, "Content-Length is required")
        try:
            length = int(length_header)
        except ValueError:
            raise RequestError(400, "Content-Length is not a number") from None
        if length < 0:
            raise RequestError(400, "Content-Length is negative")
        if length > limits.max_body_bytes:
            raise RequestError(413, f"body of {length} bytes; at most {limits.max_body_bytes}")
        body = self.rfile.read(length)
        try:
            payload = json.loads(body)
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer of too many digits
            raise RequestError(400, f"malformed JSON: {exc}") from None
        except RecursionError:
            raise RequestError(400, "malformed JSON: nested too deeply") from None
        return parse_score_request(payload, limits, self.server.scorer.kind)


def make_server(
    scorer: RewardScorer, host: str = "127.0.0.1", port: int = 0, limits: ServingLimits = ServingLimits()
) -> RewardHTTPServer:
    """A server bound to (host, port); port 0 picks a free one (``server.server_address``)."""
    return RewardHTTPServer((host, port), scorer, limits)


def serve_in_background(
    scorer: RewardScorer, host: str = "127.0.0.1", port: int = 0, limits: ServingLimits = ServingLimits()
):
    """Start a server on a daemon thread; returns (server, thread). Stop with ``server.shutdown()``."""
    server = make_server(scorer, host, port, limits)
    thread = threading.Thread(target=server.serve_forever, name="reward-http", daemon=True)
    thread.start()
    return server, thread


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve a trained reward model over HTTP (JSON).")
    parser.add_argument("--checkpoint", required=True, help="an exported model folder (models.checkpoint_path)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--warm-cache", default=None, help="a saved segment-embedding cache folder to start from")
    parser.add_argument(
        "--home", default=None, help="start from the segment cache training saved under this STEPWISE_HOME"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--max-body-bytes", type=int, default=ServingLimits.max_body_bytes)
    parser.add_argument("--max-states", type=int, default=ServingLimits.max_states)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import torch

    torch.set_num_threads(args.threads)
    scorer = RewardScorer.from_checkpoint(Path(args.checkpoint), warm_cache=args.warm_cache)
    if args.home:
        log.info("segment cache: %d entries from %s", scorer.load_home_cache(args.home), args.home)
    limits = ServingLimits(max_body_bytes=args.max_body_bytes, max_states=args.max_states)
    server = make_server(scorer, args.host, args.port, limits)
    host, port = server.server_address[:2]
    print(
        json.dumps({"serving": scorer.kind, "url": f"http://{host}:{port}", "checkpoint": str(args.checkpoint)}),
        flush=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
