"""The model registry: which reward models the ``models`` table lists, and which this code can load.

Every stage that uses a trained reward model (the report, RL's reward sources, guidance's
verifiers, the flywheel, ``stepwise figures``) finds it here: the newest usable model of a kind
(:func:`latest_models`) or one model by id (:func:`model_by_id`). A frozen-segment checkpoint
records the fingerprint of the encoder it was trained on; one trained on another encoder's
embeddings (another padding, quantisation or torch) cannot be loaded by this code
(:func:`stale_encoder_reason`) and is passed over.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from warehouse.catalog import Warehouse

log = logging.getLogger(__name__)

#: The asset whose runs are the reward-model reports (ProgRM Tables 2-3, the agent-episode AUCs).
REPORT_ASSET = "reward_model_report"
#: The newest report run's id, as a scalar SQL subquery: the rows of ``rm_metrics``,
#: ``rm_agent_auc`` and ``rm_alternative_top1`` that belong together are those of one report run.
LATEST_REPORT_RUN = (
    f"(SELECT run_id FROM lineage_materializations WHERE asset = '{REPORT_ASSET}' ORDER BY created_at DESC LIMIT 1)"
)

#: A reward model checkpoint's config file (written by ``training.reward_models.models.save_reward_model``).
CHECKPOINT_CONFIG_FILE = "reward_model_config.json"


@dataclass
class ModelRecord:
    """A trained model as the ``models`` table lists it."""

    model_id: str
    kind: str
    checkpoint_path: str
    materialization_id: str | None = None


def stale_encoder_reason(directory: Path | str) -> str | None:
    """Why this code cannot use a frozen-encoder checkpoint on CPU (it was trained on the embeddings
    of another encoder: padding, quantisation or torch), or None when it can. Models saved before
    fingerprints were recorded were trained on the old, batch-dependent encoder: stale too."""
    from training.base.encoder import EncoderConfig, encoder_fingerprint  # (loads torch: when asked)

    directory = Path(directory)
    saved = json.loads((directory / CHECKPOINT_CONFIG_FILE).read_text())
    if saved.get("encoder_mode", "frozen_segments") == "full":
        return None
    config = EncoderConfig.from_dict(saved)
    trained_with = saved.get("encoder_fingerprint")
    current = encoder_fingerprint(config, config.quantize_encoder)
    if trained_with == current:
        return None
    return (
        f"reward model {directory} was trained on the embeddings of encoder {trained_with or 'unrecorded'}; "
        f"this code's encoder is {current} (another padding, quantisation or torch): retrain it "
        "(stepwise reward-models)"
    )


def _unloadable_reason(model: ModelRecord) -> str | None:
    """Why this code cannot load ``model`` (``stale_encoder_reason``: another encoder's embeddings),
    None if it can. A checkpoint that cannot be read counts as loadable: loading it says what is wrong."""
    checkpoint = Path(model.checkpoint_path)
    return stale_encoder_reason(checkpoint) if (checkpoint / CHECKPOINT_CONFIG_FILE).is_file() else None


def registered_models(warehouse: Warehouse, model_id: str | None = None) -> list[ModelRecord]:
    """Every model of the ``models`` table (or only ``model_id``), newest first."""
    if not warehouse.has_table("models"):
        return []
    where, params = ("WHERE v.model_id = ?", [model_id]) if model_id is not None else ("", [])
    rows = warehouse.query(
        f"""
        SELECT v.model_id, v.kind, v.checkpoint_path, t.materialization_id
        FROM models v
        LEFT JOIN table_versions t ON t.table_name = 'models' AND t.dataset = v.model_id AND t.is_current
        {where}
        ORDER BY v.created_at DESC
        """,
        params,
    ).to_pylist()
    return [
        ModelRecord(r["model_id"], r["kind"], str(warehouse.resolve(r["checkpoint_path"])), r["materialization_id"])
        for r in rows
    ]


def model_by_id(warehouse: Warehouse, model_id: str) -> ModelRecord:
    """The registered model ``model_id`` (``models`` table), whichever is newest of its kind; a
    :class:`LookupError` names it when it is not registered or this code cannot load it."""
    found = registered_models(warehouse, model_id)
    if not found:
        raise LookupError(f"no reward model {model_id!r} in the models table")
    model = found[0]
    if stale := _unloadable_reason(model):
        raise LookupError(f"reward model {model_id} cannot be loaded by this code: {stale}")
    return model


def latest_models(warehouse: Warehouse, kinds: Sequence[str]) -> list[ModelRecord]:
    """The most recent usable model of each kind in the ``models`` table (skips kinds without one).

    A model trained on another encoder's embeddings (:func:`stale_encoder_reason`: before the
    batch-invariant encoder, or under another torch) cannot be loaded by this code; the newest
    model that can stands in, and a kind with none counts as untrained, so that the stages that
    need it train one instead of failing on load."""
    by_kind: dict[str, ModelRecord] = {}
    for model in registered_models(warehouse):
        if model.kind in by_kind or model.kind not in kinds:
            continue
        if stale := _unloadable_reason(model):
            log.warning("skipping %s: %s", model.model_id, stale)
            continue
        by_kind[model.kind] = model
    return [by_kind[k] for k in kinds if k in by_kind]


def report_keys(models: Sequence[ModelRecord]) -> list[str]:
    """One key per reported model: its kind for the first model of each kind, ``<kind>@<model id>``
    for a further model of a kind already reported (issue 41 item 7: a flywheel round's model beside
    the demonstration-trained one, a SmolLM2 model beside a MiniLM one, in one report)."""
    keys = keys_by_model((model.model_id, model.kind) for model in models)
    return [keys[model.model_id] for model in models]


def keys_by_model(models: Iterable[tuple[str, str]]) -> dict[str, str]:
    """(model id, kind) pairs in report order -> each model's report key, by :func:`report_keys`'
    rule: the one rule every table, plot and metric row of a report names its models by."""
    seen: set[str] = set()
    keys: dict[str, str] = {}
    for model_id, kind in models:
        if model_id not in keys:
            keys[model_id] = kind if kind not in seen else f"{kind}@{model_id}"
            seen.add(kind)
    return keys


def key_kind(key: str) -> str:
    """The kind of a :func:`report_keys` key."""
    return key.split("@", 1)[0]
