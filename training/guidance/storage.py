"""Where guidance evaluations are stored, and how a rerun replaces what it measures again.

One dataset per (policy, method, the sweep's verifier models) holds a sweep's six tables (episodes,
steps, attempts, ``guidance_eval``, ``guidance_episodes``, ``guidance_steps``). Two sweeps of one
policy and method can share a (setting, verifier model) without sharing their set of models: a
sweep of ``prm`` and ``ensemble`` and a later one of ``prm`` and ``progrm_env`` both run ``prm:N=3``
with the same PRM, and its episodes have the same ids in both. :func:`superseded_outputs` restages
every other dataset of the policy and method without the (setting, model) pairs a run measures
again, in the same publish: each pair keeps exactly one current result, the newest, and what
the earlier sweep ran besides stays.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from envs.rollouts import ATTEMPTS_TABLE
from warehouse.catalog import Materialization, TableOutput, Warehouse

#: The tables a guidance evaluation writes under its dataset.
EVALUATION_TABLES: tuple[str, ...] = (
    "episodes",
    "steps",
    ATTEMPTS_TABLE,
    "guidance_eval",
    "guidance_episodes",
    "guidance_steps",
)
#: Tables whose rows name their setting and verifier model; the others are matched by episode id.
_KEYED_BY_SETTING = ("guidance_eval", "guidance_episodes")


def evaluation_dataset(policy_id: str, method: str, model_ids: Sequence[str]) -> str:
    """Where one method's evaluation is stored: one dataset per (policy, method, verifier models),
    so a sweep with another reward model adds a dataset and a rerun with the same ones replaces it."""
    models = sorted({m for m in model_ids if m})
    if not models:
        return f"guidance/{policy_id}/{method}"
    digest = hashlib.sha256("|".join(models).encode()).hexdigest()[:12]
    return f"guidance/{policy_id}/{method}/verifiers-{digest}"


def superseded_outputs(
    warehouse: Warehouse,
    m: Materialization,
    policy_id: str,
    method: str,
    dataset: str,
    measured: Collection[tuple[str, str]],
) -> list[TableOutput]:
    """The other current datasets of ``policy_id`` and ``method`` that hold a (setting, verifier
    model) in ``measured``, restaged under ``m`` without those rows (and without their episodes'
    rows in the tables keyed by episode id); datasets that hold none are left as they are."""
    prefix = evaluation_dataset(policy_id, method, [])
    measured = set(measured)
    outputs: list[TableOutput] = []
    for other, _, path in warehouse.current_versions("guidance_eval"):
        if other == dataset or not (other == prefix or other.startswith(prefix + "/")):
            continue
        episodes = _read(warehouse, "guidance_episodes", other)
        if episodes is None:
            continue
        repeated = _rows_of(episodes, measured)
        if not any(repeated) and not any(_rows_of(pq.read_table(path), measured)):
            continue
        dropped = {e for e, r in zip(episodes["episode_id"].to_pylist(), repeated, strict=True) if r}
        for table_name in EVALUATION_TABLES:
            table = _read(warehouse, table_name, other)
            if table is None:
                continue
            if table_name in _KEYED_BY_SETTING:
                keep = [not r for r in _rows_of(table, measured)]
            else:
                keep = [e not in dropped for e in table["episode_id"].to_pylist()]
            outputs.append(warehouse.stage_table(table_name, other, table.filter(pa.array(keep, pa.bool_())), m))
    return outputs


def _read(warehouse: Warehouse, table_name: str, dataset: str) -> pa.Table | None:
    version = warehouse.current_version(table_name, dataset)
    return pq.read_table(version[1]) if version else None


def _rows_of(table: pa.Table, pairs: Collection[tuple[str, str]]) -> list[bool]:
    """Which rows of ``table`` belong to one of the (setting, verifier model) ``pairs``."""
    settings, models = table["setting"].to_pylist(), table["verifier_model_id"].to_pylist()
    return [(s, m or "") in pairs for s, m in zip(settings, models, strict=True)]
