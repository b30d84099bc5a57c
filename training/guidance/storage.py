"""Where guidance evaluations are stored, and how a rerun replaces what it measures again.

One dataset per (policy, method, the sweep's verifier models) holds a sweep's six tables (episodes,
steps, attempts, ``guidance_eval``, ``guidance_episodes``, ``guidance_steps``). A (setting,
verifier model) pair keeps exactly one current result, the newest, and nothing else is lost:

* a sweep's own dataset keeps what an earlier sweep with the same models stored besides
  (:func:`rows_not_measured`, :func:`with_earlier_rows`): a sweep of N = 16 alone adds to the
  N = 3 and 8 stored before instead of replacing them;
* two sweeps can share a pair without sharing their set of models (``prm`` with the ensemble,
  then ``prm`` with ``progrm_env``; its episodes have the same ids in both):
  :func:`superseded_outputs` restages the other datasets of the policy and method without the
  pairs a sweep measures again, in the same publish.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from envs.rollouts import ATTEMPTS_TABLE
from warehouse.catalog import Materialization, TableOutput, Warehouse
from warehouse.schema import TABLE_SCHEMAS

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
    so a sweep with another reward model adds a dataset, and one with the same models adds to it
    (:func:`sweep_outputs`)."""
    models = sorted({m for m in model_ids if m})
    if not models:
        return f"guidance/{policy_id}/{method}"
    digest = hashlib.sha256("|".join(models).encode()).hexdigest()[:12]
    return f"guidance/{policy_id}/{method}/verifiers-{digest}"


def sweep_outputs(
    warehouse: Warehouse,
    m: Materialization,
    policy_id: str,
    method: str,
    tables: dict[str, pa.Table],
    measured: Collection[tuple[str, str]],
    model_ids: Sequence[str],
) -> list[TableOutput]:
    """A sweep's staged outputs: its own dataset (:func:`evaluation_dataset`) holding ``tables``
    (the six of :data:`EVALUATION_TABLES`) after what an earlier sweep with the same models stored
    besides, and the other datasets of the policy and method without what it measured again."""
    dataset = evaluation_dataset(policy_id, method, model_ids)
    # the ids this sweep writes: earlier rows under them go, whether or not their episode completed
    # then (a lost episode has attempts but no guidance_episodes row)
    written = {
        e for name in ("episodes", ATTEMPTS_TABLE) if name in tables for e in tables[name]["episode_id"].to_pylist()
    }
    earlier, _ = rows_not_measured(warehouse, dataset, measured, written)
    outputs = [
        warehouse.stage_table(name, dataset, with_earlier_rows(name, table, earlier), m)
        for name, table in tables.items()
    ]
    return outputs + superseded_outputs(warehouse, m, policy_id, method, dataset, measured, written)


def superseded_outputs(
    warehouse: Warehouse,
    m: Materialization,
    policy_id: str,
    method: str,
    dataset: str,
    measured: Collection[tuple[str, str]],
    written: Collection[str] = (),
) -> list[TableOutput]:
    """The other current datasets of ``policy_id`` and ``method`` that hold a (setting, verifier
    model) in ``measured``, restaged under ``m`` without those rows (and without their episodes'
    rows, or rows under an episode id in ``written``, in the tables keyed by episode id); datasets
    that hold none are left as they are."""
    prefix = evaluation_dataset(policy_id, method, [])
    outputs: list[TableOutput] = []
    for other, _, _ in warehouse.current_versions("guidance_eval"):
        if other == dataset or not (other == prefix or other.startswith(prefix + "/")):
            continue
        kept, removed = rows_not_measured(warehouse, other, measured, written)
        if removed:
            outputs += [warehouse.stage_table(name, other, table, m) for name, table in kept.items()]
    return outputs


def rows_not_measured(
    warehouse: Warehouse, dataset: str, measured: Collection[tuple[str, str]], written: Collection[str] = ()
) -> tuple[dict[str, pa.Table], bool]:
    """The current tables of ``dataset`` (none if it does not exist), in today's schemas, without
    the (setting, verifier model) pairs in ``measured``, their episodes and any row under an episode
    id in ``written``; and whether any row was left out."""
    pairs = set(measured)
    episodes = _read(warehouse, "guidance_episodes", dataset)
    dropped: set[str] = set(written)
    if episodes is not None:
        repeated = _rows_of(episodes, pairs)
        dropped |= {e for e, r in zip(episodes["episode_id"].to_pylist(), repeated, strict=True) if r}
    kept: dict[str, pa.Table] = {}
    removed = False
    for table_name in EVALUATION_TABLES:
        table = _read(warehouse, table_name, dataset)
        if table is None:
            continue
        if table_name in _KEYED_BY_SETTING:
            keep = [not r for r in _rows_of(table, pairs)]
        else:
            keep = [e not in dropped for e in table["episode_id"].to_pylist()]
        removed = removed or not all(keep)
        kept[table_name] = table.filter(pa.array(keep, pa.bool_()))
    return kept, removed


def with_earlier_rows(table_name: str, new: pa.Table, earlier: dict[str, pa.Table]) -> pa.Table:
    """``new`` after the rows ``earlier`` kept of the same table (:func:`rows_not_measured`), in
    ``new``'s schema (columns an older version did not write read as null)."""
    old = earlier.get(table_name)
    if old is None or old.num_rows == 0:
        return new
    return pa.concat_tables([_in_schema(old, new.schema), new])


def _read(warehouse: Warehouse, table_name: str, dataset: str) -> pa.Table | None:
    """A dataset's current version of a table in today's schema (a file written before a column
    existed gets it: null, or '' for ``verifier_model_id``, which sweeps before it lacked)."""
    version = warehouse.current_version(table_name, dataset)
    if not version:
        return None
    table = pq.read_table(version[1])
    schema = TABLE_SCHEMAS.get(table_name)
    return _in_schema(table, schema) if schema is not None else table


def _in_schema(table: pa.Table, schema: pa.Schema) -> pa.Table:
    columns = []
    for f in schema:
        if f.name in table.column_names:
            columns.append(table.column(f.name).cast(f.type))
        elif f.name == "verifier_model_id":
            columns.append(pa.array([""] * table.num_rows, f.type))
        else:
            columns.append(pa.nulls(table.num_rows, f.type))
    return pa.Table.from_arrays(columns, schema=schema)


def _rows_of(table: pa.Table, pairs: Collection[tuple[str, str]]) -> list[bool]:
    """Which rows of ``table`` belong to one of the (setting, verifier model) ``pairs``."""
    settings, models = table["setting"].to_pylist(), table["verifier_model_id"].to_pylist()
    return [(s, m or "") in pairs for s, m in zip(settings, models, strict=True)]
