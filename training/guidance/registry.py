"""Verifiers by name: the one place that knows every verifier, the GUI-PRA judge included (the
judge builds on the verifiers module, so the choice by name cannot live there)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from training.guidance.judge import JudgeSettings, make_judge
from training.guidance.proposals import GuidanceError
from training.guidance.verifiers import (
    ENSEMBLE_KINDS,
    VERIFIERS,
    EnsembleVerifier,
    OracleVerifier,
    ProgressGainVerifier,
    StepJudgeVerifier,
    Verifier,
    load_local_scorer,
)
from training.reward_models.kinds import PROGRESS_KINDS, STEP_JUDGE_KINDS
from warehouse.catalog import Warehouse


def make_verifier(
    name: str,
    warehouse: Warehouse | None = None,
    *,
    checkpoint: Path | str | None = None,
    judge: Any = None,
) -> Verifier:
    """A verifier by name (:data:`VERIFIERS`); models load now, so a missing or wrong one fails
    before any rollout. ``judge``: :class:`training.guidance.judge.JudgeSettings` for ``judge``."""
    if name == "orm":
        raise GuidanceError(
            "the ORM judges whether a whole trajectory succeeded, not which candidate step is best: "
            f"choose one of {', '.join(VERIFIERS)}"
        )
    if name not in VERIFIERS:
        raise GuidanceError(f"unknown verifier {name!r}; choose one of {', '.join(VERIFIERS)}")
    if name in STEP_JUDGE_KINDS:
        return StepJudgeVerifier(load_local_scorer(warehouse, name, checkpoint), name)
    if name in PROGRESS_KINDS:
        return ProgressGainVerifier(load_local_scorer(warehouse, name, checkpoint), name)
    if name == "ensemble":  # its members are the newest models of their kinds (no one checkpoint)
        judge_kind, progress_kind = ENSEMBLE_KINDS
        return EnsembleVerifier(
            (
                StepJudgeVerifier(load_local_scorer(warehouse, judge_kind), judge_kind),
                ProgressGainVerifier(load_local_scorer(warehouse, progress_kind), progress_kind),
            )
        )
    if name == "oracle":
        return OracleVerifier()
    return make_judge(judge if judge is not None else JudgeSettings(), warehouse, checkpoint=checkpoint)
