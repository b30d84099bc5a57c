"""Serving reward models to an RL trainer: a batch scoring API in Python and a small HTTP service.

Python::

    scorer = RewardScorer.from_checkpoint("<STEPWISE_HOME>/models/progrm_env/.../final")
    results = score_trajectories(scorer, [trajectory], k=1)
    results[0].scores          # p_t: progress after each action (ProgRM) / success belief (ORM)
    results[0].progress_gains  # r_t = p_t - p_{t-k}, p_{-1} = 0 (ProgRM Eq. 2)

HTTP (FastAPI on uvicorn, one model per process; ``training.reward_models.serving_app``)::

    python -m training.reward_models.serve --checkpoint <model folder> --host 127.0.0.1 --port 8765 \
        [--device cuda --dtype bfloat16]

    GET  /health      -> {"status": "ok", "kind": ...}
    GET  /v1/model    -> the model's kind, config, training metadata and the request limits
    POST /v1/score    -> per-step scores and rewards
    GET  /v1/stats    -> the micro-batcher's counters (batches, requests, states, refusals, queue)
    GET  /docs        -> the OpenAPI page (``/openapi.json``)

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
that its surrounding texts are added to the action as in training (``training.base.states.target_context``:
``CLICK(span.retweet) within "@lacus" ...``). ``steps[t].screen`` is the screen the agent saw *before* action
``t``; for progress models the score of step ``t`` is the progress *after* action ``t``, read from
the next step's screen (``training.base.states.progress_state``).

Response: ``{"model": {...}, "results": [{"id", "scores", "progress_gains", "rewards"}], "elapsed_ms"}``;
``rewards`` are the progress gains for progress/outcome models and the scores themselves for
step judges (PRM, GuidNav: GUI-Shepherd Eq. 3 uses the PRM output as the step reward).

Bad requests get a JSON error and a 4xx status: 400 malformed JSON, 404 unknown path, 405 wrong
method, 408 body not received in time, 411 no Content-Length, 413 body or batch too large, 415 not
JSON, 422 invalid fields (the message names the field, e.g. ``trajectories[0].steps[2].action``).
A full scoring queue is a 503 with ``Retry-After``.

This module is the part every server shares: the batch API, request validation
(``parse_score_request`` and friends) and the device/dtype options. The ASGI app and its
micro-batcher are in ``training.reward_models.serving_app`` and the command line in
``training.reward_models.serve`` (so the RL code that calls :func:`score_trajectories` does not
load FastAPI); the stdlib server it replaced is a benchmark baseline, ``benchmarks.serving_legacy``.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any, Literal, overload

import numpy as np

from training.base.states import StepState, TextStep, TextTrajectory, action_in_context, screen_lines, target_context
from training.reward_models.kinds import kind_spec, state_for
from training.reward_models.labels import progress_gains
from training.reward_models.models import RewardScorer, read_model_config
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
    states = trajectory_states(scorer.kind, trajectories)
    scores = scorer.score_states(states) if states else np.zeros(0)
    return trajectory_scores(scorer.kind, trajectories, scores, k)


def trajectory_states(kind: str, trajectories: Sequence[TextTrajectory]) -> list[StepState]:
    """The state a ``kind`` model scores at every step of every trajectory, in order."""
    return [state_for(kind, traj, t) for traj in trajectories for t in range(len(traj))]


def trajectory_scores(
    kind: str, trajectories: Sequence[TextTrajectory], scores: np.ndarray, k: int = 1
) -> list[TrajectoryScores]:
    """Split the scores of :func:`trajectory_states` back per trajectory, with Eq. 2 gains for
    progress/outcome models (``r_t = p_t - p_{t-k}``) and the scores as rewards for step judges."""
    progress_kind = kind_spec(kind).scores_progress
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
        """The limits as ``GET /v1/model`` reports them."""
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
    """A screen (element list or pre-rendered text) -> its prompt lines."""
    return parse_screen_elements(raw, where, limits)[0]


def parse_action(step: dict, elements: list[UIElement] | None, where: str, limits: ServingLimits) -> str:
    """A step's action as models read it: with the texts around its target when ``target`` (an
    index into the screen's element list, or an element ``ref``) names one (see
    ``training.base.states.target_context``)."""
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
    """One ``trajectories[i]`` object -> TextTrajectory; ``where`` names it in error messages."""
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
    """One ``steps[i]`` object (a single state the caller assembled) -> StepState."""
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
    """A validated ``POST /v1/score`` body: whole trajectories, or single states."""

    k: int = 1
    trajectories: list[TextTrajectory] = field(default_factory=list)
    states: list[StepState] = field(default_factory=list)

    @property
    def n_states(self) -> int:
        """How many states scoring this request runs through the model."""
        return sum(len(t) for t in self.trajectories) if self.trajectories else len(self.states)

    def model_states(self, kind: str) -> list[StepState]:
        """The states a ``kind`` model scores for this request, in order."""
        return trajectory_states(kind, self.trajectories) if self.trajectories else list(self.states)

    def results(self, kind: str, scores: np.ndarray) -> list[dict]:
        """The ``results`` of the response from the scores of :meth:`model_states`."""
        if not self.trajectories:
            return [{"scores": [float(s) for s in scores]}]
        per_trajectory = trajectory_scores(kind, self.trajectories, scores, self.k)
        return [
            {"id": t.episode_id, "scores": r.scores, "progress_gains": r.progress_gains, "rewards": r.rewards}
            for t, r in zip(self.trajectories, per_trajectory, strict=True)
        ]


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
# What every server shares: header checks, body decoding, the error body, the model's description
# ---------------------------------------------------------------------------------------------


def check_content_type(content_type: str | None) -> None:
    """415 unless the body is declared JSON (a missing Content-Type is taken as JSON)."""
    media = (content_type or "application/json").split(";")[0].strip().lower()
    if media != "application/json":
        raise RequestError(415, f"Content-Type must be application/json, got {media}")


def check_content_length(length_header: str | None, limits: ServingLimits) -> int:
    """The declared body length: 411 when missing, 400 when not a number, 413 beyond the limit
    (refused before reading the body)."""
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
    return length


def decode_score_request(body: bytes, limits: ServingLimits, kind: str) -> ScoreRequest:
    """A ``POST /v1/score`` body -> ScoreRequest: 400 for malformed JSON, else
    :func:`parse_score_request`'s verdict."""
    try:
        payload = json.loads(body)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer of too many digits
        raise RequestError(400, f"malformed JSON: {exc}") from None
    except RecursionError:
        raise RequestError(400, "malformed JSON: nested too deeply") from None
    return parse_score_request(payload, limits, kind)


def error_body(status: int, message: str) -> dict:
    """The JSON of every refusal: ``{"error": {"status", "reason", "message"}}``."""
    return {"error": {"status": status, "reason": HTTPStatus(status).phrase, "message": message}}


def model_info(scorer: RewardScorer) -> dict:
    """What every score response says about the model that answered."""
    return {
        "kind": scorer.kind,
        "model_id": scorer.metadata.get("model_id"),
        "encoder_mode": scorer.config.encoder_mode,
        "backbone": scorer.config.to_dict()["backbone"],
        "scores_progress": kind_spec(scorer.kind).scores_progress,
    }


def model_description(scorer: RewardScorer, limits: ServingLimits) -> dict:
    """``GET /v1/model``: the model's kind, config, training metadata and the request limits."""
    meta = scorer.metadata
    return model_info(scorer) | {
        "config": scorer.config.to_dict(),
        "validation_metrics": meta.get("validation_metrics"),
        "label_versions": meta.get("label_versions"),
        "limits": limits.to_json(),
    }


# ---------------------------------------------------------------------------------------------
# Device and precision
# ---------------------------------------------------------------------------------------------

DTYPES = ("float32", "bfloat16", "float16")
_DEVICE = re.compile(r"cpu|cuda(:\d+)?")


@dataclass(frozen=True)
class Precision:
    """Where and in what precision a served model runs.

    ``weights_dtype`` is what :meth:`RewardScorer.from_checkpoint` loads a full-mode backbone in
    (``torch_dtype``); ``autocast_dtype`` is the autocast the scoring thread runs under: the
    frozen-segment mode's encoder and fusion are built in float32, so on CUDA they reach bf16 /
    fp16 through autocast instead of converted weights. None: float32.
    """

    device: str = "cpu"
    dtype: str = "float32"
    weights_dtype: str | None = None
    autocast_dtype: str | None = None

    def to_json(self) -> dict:
        """As ``GET /v1/model`` reports it."""
        return {"device": self.device, "dtype": self.dtype}

    def scoring_context(self) -> AbstractContextManager:
        """The context every forward pass runs in (autocast on CUDA, or nothing)."""
        if self.autocast_dtype is None:
            return nullcontext()
        import torch

        return torch.autocast(device_type="cuda", dtype=getattr(torch, self.autocast_dtype))


def resolve_precision(encoder_mode: str, device: str, dtype: str) -> Precision:
    """How a model of ``encoder_mode`` runs on ``device`` (cpu, cuda, cuda:N) in ``dtype``
    (float32, bfloat16, float16); ValueError for a combination that cannot run as asked.

    * full mode: the backbone is loaded in ``dtype`` (the head stays float32, the pooled vector
      is cast to it), on CPU or CUDA; float16 only on CUDA (CPU half-precision kernels are slow
      or missing).
    * frozen_segments on CPU: float32 only; the CPU path is the int8-quantised encoder and a
      float32 fusion, and the model was trained that way.
    * frozen_segments on CUDA: float32, or bfloat16 / float16 autocast around the (unquantised)
      encoder and the fusion.
    """
    if not _DEVICE.fullmatch(device):
        raise ValueError(f"device must be cpu, cuda or cuda:N, got {device!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if encoder_mode not in ("full", "frozen_segments"):
        raise ValueError(f"unknown encoder_mode {encoder_mode!r}")
    on_cuda = device.startswith("cuda")
    if dtype == "float32":
        return Precision(device, dtype)
    if not on_cuda and dtype == "float16":
        raise ValueError("--dtype float16 needs a CUDA device (use bfloat16 or float32 on CPU)")
    if encoder_mode == "full":
        return Precision(device, dtype, weights_dtype=dtype)
    if not on_cuda:
        raise ValueError(
            f"a frozen_segments model on CPU scores in float32 (its int8 encoder and float32 fusion, as "
            f"trained); --dtype {dtype} applies to full-mode models, or to CUDA (autocast)"
        )
    return Precision(device, dtype, autocast_dtype=dtype)


def load_serving_scorer(
    checkpoint: Path | str, *, device: str = "cpu", dtype: str = "float32", warm_cache: Path | str | None = None
) -> tuple[RewardScorer, Precision]:
    """Load an exported model for serving on ``device`` in ``dtype`` (see
    :func:`resolve_precision`); ValueError when that cannot run here (e.g. no CUDA)."""
    import torch

    config, _ = read_model_config(checkpoint)
    precision = resolve_precision(config.encoder_mode, device, dtype)
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"--device {device}: this torch sees no CUDA device")
        index = int(device.split(":")[1]) if ":" in device else 0
        if index >= torch.cuda.device_count():
            raise ValueError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) here")
    weights = getattr(torch, precision.weights_dtype) if precision.weights_dtype else None
    scorer = RewardScorer.from_checkpoint(Path(checkpoint), device=device, warm_cache=warm_cache, torch_dtype=weights)
    return scorer, precision
