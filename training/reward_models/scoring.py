"""Reward models as the RL sources call them: in-process (a checkpoint loaded here) or over the
project's HTTP scoring service (``python -m training.reward_models.serve``), behind one interface."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from training.base.registry import latest_models, model_by_id
from training.base.states import TextTrajectory
from training.reward_models.kinds import KINDS
from training.reward_models.serving import TrajectoryScores, score_trajectories
from warehouse.catalog import LineageInput, Warehouse


class RewardModelError(ValueError):
    """No usable reward model: none trained of the kind, a missing checkpoint, a service that is
    down, answers garbage or serves another kind."""


class TrajectoryScorer(Protocol):
    """Scores every step of whole trajectories (``training.reward_models.serving.score_trajectories``)."""

    kind: str
    model_id: str | None

    def score(self, trajectories: Sequence[TextTrajectory], k: int = 1) -> list[TrajectoryScores]: ...

    def lineage(self) -> list[LineageInput]: ...


class LocalScorer:
    """A checkpoint loaded in this process (the batch scoring API)."""

    def __init__(
        self, checkpoint: Path | str, *, home: Path | str | None = None, materialization_id: str | None = None
    ):
        from training.reward_models.models import RewardScorer

        if not Path(checkpoint).is_dir():
            raise RewardModelError(f"reward-model checkpoint not found: {checkpoint}")
        self.checkpoint = str(checkpoint)
        self.scorer = RewardScorer.from_checkpoint(checkpoint)
        if home is not None:
            self.scorer.load_home_cache(home)
        self.kind = self.scorer.kind
        self.model_id = self.scorer.metadata.get("model_id")
        self.materialization_id = materialization_id

    def score(self, trajectories: Sequence[TextTrajectory], k: int = 1) -> list[TrajectoryScores]:
        return score_trajectories(self.scorer, trajectories, k=k)

    def lineage(self) -> list[LineageInput]:
        return [
            LineageInput(
                kind="asset",
                input_asset="reward_model",
                input_materialization_id=self.materialization_id,
                path=self.checkpoint,
                version=self.model_id,
            )
        ]


class HTTPScorer:
    """The HTTP scoring service: ``POST /v1/score`` with whole trajectories (screens as lines)."""

    def __init__(self, url: str, *, timeout_s: float = 120.0, expect_kind: str | None = None):
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        info = self._call("GET", "/v1/model")
        if not isinstance(info, dict) or info.get("kind") not in KINDS:
            raise RewardModelError(f"{self.url}/v1/model did not describe a reward model: {str(info)[:200]}")
        if expect_kind is not None and info["kind"] != expect_kind:
            raise RewardModelError(f"{self.url} serves a {info['kind']} model, not the {expect_kind} this source needs")
        self.kind = str(info["kind"])
        self.model_id = info.get("model_id")

    def _call(self, method: str, path: str, payload: dict | None = None) -> object:
        data = json.dumps(payload).encode() if payload is not None else None
        request = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            raise RewardModelError(f"{method} {self.url}{path}: HTTP {exc.code}: {exc.read()[:300]!r}") from None
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise RewardModelError(f"{method} {self.url}{path}: the service is not reachable ({exc})") from None
        try:
            return json.loads(body)
        except json.JSONDecodeError:
            raise RewardModelError(f"{method} {self.url}{path} answered something that is not JSON") from None

    def score(self, trajectories: Sequence[TextTrajectory], k: int = 1) -> list[TrajectoryScores]:
        payload = {
            "k": k,
            "trajectories": [
                {
                    "id": t.episode_id,
                    "instruction": t.instruction,
                    "steps": [{"screen": "\n".join(s.screen_lines) or "(empty)", "action": s.action} for s in t.steps],
                    **({"final_screen": "\n".join(t.final_screen_lines) or "(empty)"} if t.final_screen_lines else {}),
                }
                for t in trajectories
            ],
        }
        answer = self._call("POST", "/v1/score", payload)
        results = answer.get("results") if isinstance(answer, dict) else None
        if not isinstance(results, list) or len(results) != len(trajectories):
            raise RewardModelError(f"{self.url}/v1/score answered without one result per trajectory")
        out = []
        for t, r in zip(trajectories, results, strict=True):
            scores = r.get("scores") if isinstance(r, dict) else None
            if not isinstance(scores, list) or len(scores) != len(t.steps):
                raise RewardModelError(f"{self.url}/v1/score: no score per step for {t.episode_id}")
            out.append(TrajectoryScores(scores, r.get("progress_gains"), r.get("rewards") or scores))
        return out

    def lineage(self) -> list[LineageInput]:
        return [LineageInput(kind="file", path=self.url, version=self.model_id)]


def load_scorer(
    warehouse: Warehouse, kind: str, *, endpoint: str | None = None, model_id: str | None = None
) -> TrajectoryScorer:
    """The latest trained model of ``kind`` (``models`` table), the registered model ``model_id``
    (which must be of ``kind``), or the service at ``endpoint``."""
    if kind not in KINDS:
        raise RewardModelError(f"unknown reward-model kind {kind!r}; expected one of {', '.join(KINDS)}")
    if endpoint:
        served = HTTPScorer(endpoint, expect_kind=kind)
        if model_id is not None and served.model_id != model_id:
            raise RewardModelError(f"{endpoint} serves {served.model_id}, not the pinned {model_id}")
        return served
    if model_id is not None:
        try:
            model = model_by_id(warehouse, model_id)
        except LookupError as exc:
            raise RewardModelError(str(exc)) from None
        if model.kind != kind:
            raise RewardModelError(f"reward model {model_id} is a {model.kind} model, not a {kind} one")
    else:
        found = latest_models(warehouse, [kind])
        if not found:
            raise RewardModelError(
                f"no trained {kind} reward model in the warehouse: materialize reward_model[{kind}] first "
                f"(stepwise reward-models --kinds {kind})"
            )
        model = found[0]
    return LocalScorer(model.checkpoint_path, home=warehouse.home, materialization_id=model.materialization_id)


def report_threshold(warehouse: Warehouse, model_id: str | None, default: float = 0.5) -> float:
    """The success threshold the evaluation report chose for a model on the validation split
    (``rm_metrics`` metric ``threshold``), or ``default`` when the model was never reported."""
    if model_id is None:
        return default
    try:
        rows = warehouse.query(
            "SELECT value FROM rm_metrics WHERE model_id = ? AND metric = 'threshold' AND value IS NOT NULL LIMIT 1",
            [model_id],
        ).to_pylist()
    except Exception:  # noqa: BLE001 - no rm_metrics yet: the default
        return default
    return float(rows[0]["value"]) if rows else default
