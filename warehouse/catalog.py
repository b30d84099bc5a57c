"""The DuckDB catalog: versioned Parquet tables behind SQL views, and lineage.

Data lives in Parquet under ``<home>/data/<table>/<dataset>/<materialization>.parquet``. The
DuckDB file ``<home>/warehouse.duckdb`` records which version of each (table, dataset) is current
and exposes one view per table over the current files, so SQL users see one ``episodes`` and one
``steps`` whatever produced them (human demonstrations, rollouts, synthetic data).

Publishing is two-phase: Parquet files are first written under new names (atomically), then one
DuckDB transaction switches the current versions, records lineage and rebuilds the views. If
anything fails before the commit, the previous versions stay current and nothing is half-written.

Paths inside the home are stored relative to it (``data/<table>/<dataset>/<id>.parquet``), so a
home can be copied, moved or shared as a whole; the views (which DuckDB needs as absolute paths)
are rebuilt for the home's current location the first time a :class:`Warehouse` opens it there.
Raw input files outside the home keep their absolute paths.

Lineage: every materialization gets a row in ``lineage_materializations`` (asset, partition,
Dagster run id, code version, parameters, row counts, outputs) and one row per input it read in
``lineage_inputs``: either another materialization (kind ``asset``) or a raw file with its hash
(kind ``file``). A recursive query walks from any output back to raw files; see ``walk_back``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from warehouse.purposes import LEGACY_PURPOSE_SQL
from warehouse.schema import TABLE_SCHEMAS
from warehouse.storage import slug, stepwise_home, write_parquet_atomic
from warehouse.tables_training import LABELLED_BY_REPLAY

#: Bumped when the views change shape (a column added to a schema, a derived column): a catalog
#: whose views were built by another version rebuilds them on opening.
# 2: every schema column present (old files read as nulls); episodes.purpose inferred.
# 3: alternatives at one state (step_alternatives, rm_alternative_top1; new columns of rm_examples, flywheel_rounds).
# 4: label_rationales and the joined view human_labels_with_rationales.
# 5: flywheel_rounds' within-task AUC (auc_within_task and its interval).
# 6: rm_examples.exploit (the RL runs' misranked episodes, issue 41 item 2).
# 7: the joined view rl_episode_rewards (what each RL training episode was paid, summed).
# 8: agent_eval.policy_label, which older files stored as reward_source (issue 40 item 5).
# 9: step_alternatives.labelled_by (replay, or from the recording: issue 42 item 2) and field_match.
# 10: episodes.final_screen and episodes.spec_digest (the spec version behind recorded milestones).
# 11: label_ledger.spec_digest (the spec version an episode's env labels were made with).
# 12: rl_episode_rewards.iteration (how soon a run takes off on a task: training.rl.take_off).
VIEWS_VERSION = "12"
#: Columns a view derives for rows written before the column existed (``coalesce(stored, derived)``).
_DERIVED_COLUMNS: dict[str, dict[str, str]] = {
    "episodes": {"purpose": LEGACY_PURPOSE_SQL},
    "step_alternatives": {"labelled_by": f"'{LABELLED_BY_REPLAY}'"},  # every row before 9 was replayed
}
#: Columns renamed since a home may have been written (table -> old name -> new name): files written
#: before the rename keep the old name, and the view reads it under the new one (the old name is gone
#: from the view, so a query can use one name only).
_RENAMED_COLUMNS: dict[str, dict[str, str]] = {"agent_eval": {"reward_source": "policy_label"}}
#: Views over the tables' views, rebuilt with them: each human label with the LLM rationale of its
#: current revision (GUI-Shepherd §3; ``rationale`` stays the annotator's own, optional one).
_JOINED_VIEWS: dict[str, str] = {
    "human_labels_with_rationales": (
        "SELECT h.*, r.rationale AS llm_rationale, r.ok AS llm_rationale_ok, r.failure AS llm_rationale_failure, "
        "r.model AS llm_rationale_model, r.prompt_version AS llm_rationale_prompt_version "
        "FROM human_labels h LEFT JOIN label_rationales r USING (ls_server, annotation_id, revision)"
    ),
    # One row per RL training episode: what its run's reward source paid it over its steps, beside
    # how it ended (the RL report's tables and the exploits handed to reward-model training read this).
    "rl_episode_rewards": (
        "SELECT r.episode_id, r.run_key, any_value(r.iteration) AS iteration, "
        "any_value(r.reward_source) AS reward_source, any_value(e.task_id) AS task_id, "
        "sum(r.reward) AS reward, count(*) AS steps, bool_or(e.success) AS success, "
        "any_value(e.outcome_reward) AS env_outcome "
        "FROM rl_step_rewards r JOIN episodes e USING (episode_id) GROUP BY r.episode_id, r.run_key"
    ),
}

_CATALOG_DDL = """
CREATE TABLE IF NOT EXISTS table_versions (
    table_name VARCHAR NOT NULL,
    dataset VARCHAR NOT NULL,
    path VARCHAR NOT NULL,
    materialization_id VARCHAR NOT NULL,
    n_rows BIGINT,
    created_at TIMESTAMPTZ,
    is_current BOOLEAN NOT NULL
);
CREATE TABLE IF NOT EXISTS lineage_materializations (
    materialization_id VARCHAR PRIMARY KEY,
    asset VARCHAR NOT NULL,
    partition_key VARCHAR,
    run_id VARCHAR,
    code_version VARCHAR,
    parameters JSON,
    row_counts JSON,
    output_paths VARCHAR[],
    created_at TIMESTAMPTZ
);
CREATE TABLE IF NOT EXISTS catalog_meta (
    key VARCHAR PRIMARY KEY,
    value VARCHAR
);
CREATE TABLE IF NOT EXISTS lineage_inputs (
    materialization_id VARCHAR NOT NULL,
    kind VARCHAR NOT NULL,               -- 'asset' or 'file'
    input_asset VARCHAR,                 -- for kind = 'asset'
    input_materialization_id VARCHAR,    -- for kind = 'asset'
    path VARCHAR,                        -- the file read (a Parquet output or a raw file)
    version VARCHAR                      -- content hash of a raw file, or the input's materialization id
);
"""

_LINEAGE_VIEW = """
CREATE OR REPLACE VIEW lineage AS
SELECT m.materialization_id, m.asset, m.partition_key, m.run_id, m.code_version, m.parameters,
       m.row_counts, m.output_paths, m.created_at,
       i.kind AS input_kind, i.input_asset, i.input_materialization_id,
       i.path AS input_path, i.version AS input_version
FROM lineage_materializations m
LEFT JOIN lineage_inputs i USING (materialization_id)
"""


@dataclass
class LineageInput:
    kind: str  # 'asset' | 'file'
    path: str | None = None
    version: str | None = None
    input_asset: str | None = None
    input_materialization_id: str | None = None


@dataclass
class Materialization:
    """What one materialization produced and read; filled in by an asset, published by the catalog."""

    asset: str
    run_id: str | None = None
    partition_key: str | None = None
    code_version: str | None = None
    parameters: dict = field(default_factory=dict)
    inputs: list[LineageInput] = field(default_factory=list)
    materialization_id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])


class ConcurrentPublishError(RuntimeError):
    """Another materialization published one of the datasets a run started from while it ran."""


@dataclass(frozen=True)
class PublishGuard:
    """The current versions of a set of datasets as a run found them when it started: publishing
    with it fails (and publishes nothing) if any of them changed meanwhile. Datasets are named by
    prefix: ``labels/miniwob-forms`` covers that dataset and ``labels/miniwob-forms/+0``, ...."""

    tables: tuple[str, ...]
    dataset_prefixes: tuple[str, ...]
    seen: dict[tuple[str, str], str]


def _dataset_under(dataset: str, prefixes: Iterable[str]) -> bool:
    return any(dataset == p or dataset.startswith(p + "/") for p in prefixes)


def _current_ids(con: duckdb.DuckDBPyConnection, tables: Iterable[str]) -> dict[tuple[str, str], str]:
    """(table, dataset) -> materialization id of the current versions of these tables."""
    rows = con.execute(
        "SELECT table_name, dataset, materialization_id FROM table_versions "
        "WHERE is_current AND list_contains(?, table_name)",
        [sorted(set(tables))],
    ).fetchall()
    return {(t, d): mid for t, d, mid in rows}


@dataclass(frozen=True)
class TableOutput:
    table_name: str
    dataset: str
    path: Path
    n_rows: int


class Warehouse:
    """The project's warehouse under one home folder (``STEPWISE_HOME`` by default)."""

    def __init__(self, home: Path | str | None = None) -> None:
        self.home = Path(home).resolve() if home is not None else stepwise_home()
        self.home.mkdir(parents=True, exist_ok=True)
        self.db_path = self.home / "warehouse.duckdb"
        self.data_dir = self.home / "data"
        self._views_checked = False

    # -- paths -------------------------------------------------------------------------------
    def relative(self, path: Path | str) -> str:
        """How a path is stored: relative to the home when inside it, else absolute."""
        resolved = Path(path).resolve()
        try:
            return resolved.relative_to(self.home).as_posix()
        except ValueError:
            return str(resolved)

    def resolve(self, stored: str | Path) -> Path:
        """A stored path (relative to the home, or absolute) as an absolute path."""
        path = Path(stored)
        return path if path.is_absolute() else self.home / path

    # -- connections -------------------------------------------------------------------------
    @contextmanager
    def connect(self, *, read_only: bool = False, attempts: int = 40) -> Iterator[duckdb.DuckDBPyConnection]:
        """A short-lived connection. DuckDB allows one writing process: wait for a busy file, don't fail."""
        if read_only and not self.db_path.exists():
            self.ensure_catalog()
        con = self._open(read_only, attempts)
        try:
            if not self._views_checked:
                con = self._views_for_this_home(con, read_only)
            yield con
        finally:
            con.close()

    def _open(self, read_only: bool, attempts: int = 40) -> duckdb.DuckDBPyConnection:
        """Open the file, waiting (with back-off) while another process holds its write lock."""
        delay = 0.05
        for attempt in range(attempts):
            try:
                return duckdb.connect(str(self.db_path), read_only=read_only)
            except duckdb.IOException as exc:
                if "lock" not in str(exc).lower() or attempt == attempts - 1:
                    raise
                time.sleep(delay)
                delay = min(delay * 1.5, 1.0)
        raise AssertionError("unreachable: the last attempt raises")

    def _views_for_this_home(self, con: duckdb.DuckDBPyConnection, read_only: bool) -> duckdb.DuckDBPyConnection:
        """The views name absolute paths: when the catalog was last viewed from another location (a
        copied or moved home) or by an older version (no view yet for a table it now knows), rebuild
        them here once. Returns a connection of the asked mode."""
        try:
            rows = con.execute("SELECT value FROM catalog_meta WHERE key = 'views_home'").fetchall()
        except duckdb.CatalogException:
            rows = []
        views = {r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
        if rows and rows[0][0] == self._views_stamp() and set(TABLE_SCHEMAS) | set(_JOINED_VIEWS) <= views:
            self._views_checked = True
            return con
        if read_only:
            con.close()
            with self.connect(read_only=False) as writer:
                del writer  # the read-write connection rebuilds the views on opening
            # (another process may take the write lock in between: wait for it as connect does)
            return self._open(read_only=True)
        self._views_checked = True  # before the rebuild: it runs statements on this connection
        con.execute(_CATALOG_DDL)
        self._migrate_absolute_paths(con)
        self._rebuild_views(con)
        return con

    def _migrate_absolute_paths(self, con: duckdb.DuckDBPyConnection) -> None:
        """Catalogs written before paths were stored relative hold absolute paths into their home
        at that time: store those that exist under this home relative to it."""
        rows = con.execute("SELECT DISTINCT path FROM table_versions WHERE path LIKE '/%'").fetchall()
        for (old,) in rows:
            marker = old.find("/data/")
            if marker < 0:
                continue
            relative = old[marker + 1 :]
            if (self.home / relative).exists():
                con.execute("UPDATE table_versions SET path = ? WHERE path = ?", [relative, old])
                con.execute("UPDATE lineage_inputs SET path = ? WHERE path = ?", [relative, old])
                con.execute(
                    "UPDATE lineage_materializations SET output_paths = list_transform(output_paths, "
                    "lambda p: CASE WHEN p = ? THEN ? ELSE p END) WHERE list_contains(output_paths, ?)",
                    [old, relative, old],
                )

    def ensure_catalog(self) -> None:
        with self.connect() as con:
            con.execute(_CATALOG_DDL)
            self._rebuild_views(con)

    # -- writing -----------------------------------------------------------------------------
    def stage_table(
        self, table_name: str, dataset: str, table: pa.Table, materialization: Materialization
    ) -> TableOutput:
        """Write one table version to Parquet (atomically); it becomes current only on ``publish``."""
        expected = TABLE_SCHEMAS.get(table_name)
        if expected is not None and not table.schema.equals(expected, check_metadata=False):
            table = table.cast(expected)
        path = self.data_dir / table_name / slug(dataset) / f"{materialization.materialization_id}.parquet"
        write_parquet_atomic(table, path)
        return TableOutput(table_name, dataset, path, table.num_rows)

    def guard(self, tables: Iterable[str], dataset_prefixes: Iterable[str]) -> PublishGuard:
        """What :meth:`publish` checks is unchanged when it commits (see :class:`PublishGuard`):
        take it before reading the datasets a run will replace."""
        tables, prefixes = tuple(tables), tuple(dataset_prefixes)
        with self.connect(read_only=True) as con:
            current = _current_ids(con, tables)
        seen = {key: mid for key, mid in current.items() if _dataset_under(key[1], prefixes)}
        return PublishGuard(tables, prefixes, seen)

    @staticmethod
    def _check_guard(con: duckdb.DuckDBPyConnection, guard: PublishGuard) -> None:
        now = {
            k: mid for k, mid in _current_ids(con, guard.tables).items() if _dataset_under(k[1], guard.dataset_prefixes)
        }
        changed = sorted(k for k in set(now) | set(guard.seen) if now.get(k) != guard.seen.get(k))
        if changed:
            table, dataset = changed[0]
            raise ConcurrentPublishError(
                f"{table} / {dataset} was published by materialization {now.get((table, dataset)) or '(removed)'} "
                f"while this run (started from {guard.seen.get((table, dataset)) or 'no version'}) was running; "
                f"{len(changed)} dataset(s) changed. Nothing was published: run it again."
            )

    def publish(
        self, materialization: Materialization, outputs: Iterable[TableOutput], *, guard: PublishGuard | None = None
    ) -> None:
        """Make the staged outputs current and record lineage, in one transaction. With a ``guard``,
        only if the datasets it covers are still as the run found them (else
        :class:`ConcurrentPublishError`, the staged files removed): two runs of the same
        partition never silently overwrite each other's rows."""
        outputs = list(outputs)
        now = datetime.now(UTC)
        with self.connect() as con:
            con.execute(_CATALOG_DDL)
            con.execute("BEGIN TRANSACTION")
            try:
                if guard is not None:
                    self._check_guard(con, guard)
                for out in outputs:
                    con.execute(
                        "UPDATE table_versions SET is_current = false WHERE table_name = ? AND dataset = ?",
                        [out.table_name, out.dataset],
                    )
                    con.execute(
                        "INSERT INTO table_versions VALUES (?, ?, ?, ?, ?, ?, true)",
                        [
                            out.table_name,
                            out.dataset,
                            self.relative(out.path),
                            materialization.materialization_id,
                            out.n_rows,
                            now,
                        ],
                    )
                con.execute(
                    "INSERT INTO lineage_materializations VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [
                        materialization.materialization_id,
                        materialization.asset,
                        materialization.partition_key,
                        materialization.run_id,
                        materialization.code_version,
                        json.dumps(materialization.parameters, sort_keys=True, default=str),
                        json.dumps({o.table_name: o.n_rows for o in outputs}, sort_keys=True),
                        [self.relative(o.path) for o in outputs],
                        now,
                    ],
                )
                if materialization.inputs:
                    con.executemany(
                        "INSERT INTO lineage_inputs VALUES (?, ?, ?, ?, ?, ?)",
                        [
                            [
                                materialization.materialization_id,
                                i.kind,
                                i.input_asset,
                                i.input_materialization_id,
                                self.relative(i.path) if i.path else None,
                                i.version,
                            ]
                            for i in materialization.inputs
                        ],
                    )
                self._rebuild_views(con)
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                for out in outputs:  # the staged files were never current: remove them
                    out.path.unlink(missing_ok=True)
                raise

    # -- the catalog as data (for an object store, warehouse.object_store) ---------------------
    def catalog_tables(self) -> dict[str, pa.Table]:
        """The current table versions and every lineage row, as Arrow tables."""
        with self.connect(read_only=True) as con:
            return {
                "versions": con.sql(
                    "SELECT table_name, dataset, path, materialization_id, n_rows, created_at FROM table_versions "
                    "WHERE is_current ORDER BY table_name, dataset"
                ).to_arrow_table(),
                "lineage_materializations": con.sql("SELECT * FROM lineage_materializations").to_arrow_table(),
                "lineage_inputs": con.sql("SELECT * FROM lineage_inputs").to_arrow_table(),
            }

    def adopt_versions(
        self,
        versions: pa.Table,
        materializations: pa.Table,
        inputs: pa.Table,
        *,
        meta: dict[str, str] | None = None,
        expected: dict[tuple[str, str], str | None] | None = None,
    ) -> None:
        """Make these (table_name, dataset, path, materialization_id, n_rows, created_at) versions
        current, with the lineage rows of materializations this catalog does not hold yet, and set
        ``meta`` keys, in one transaction. The files must already be in the home. ``expected``: the
        current version of each (table, dataset) the caller read (None: none); if one changed
        meanwhile (a run published), :class:`ConcurrentPublishError` and nothing changes."""
        with self.connect() as con:
            con.execute(_CATALOG_DDL)
            con.register("adopted", versions)
            con.register("new_materializations", materializations)
            con.register("new_inputs", inputs)
            con.execute("BEGIN TRANSACTION")
            try:
                if expected:
                    now = _current_ids(con, (t for t, _ in expected))
                    changed = sorted(k for k, mid in expected.items() if now.get(k) != mid)
                    if changed:
                        table, dataset = changed[0]
                        raise ConcurrentPublishError(
                            f"{table} / {dataset} was published here while the versions to adopt were fetched; "
                            "nothing was adopted. Run it again."
                        )
                con.execute(
                    "UPDATE table_versions SET is_current = false WHERE (table_name, dataset) IN "
                    "(SELECT (table_name, dataset) FROM adopted)"
                )
                con.execute(
                    "INSERT INTO table_versions SELECT table_name, dataset, path, materialization_id, n_rows, "
                    "created_at, true FROM adopted"
                )
                known = "SELECT materialization_id FROM lineage_materializations"
                con.execute(
                    "INSERT INTO lineage_inputs SELECT * FROM new_inputs WHERE materialization_id NOT IN "
                    f"({known}) AND materialization_id IN (SELECT materialization_id FROM new_materializations)"
                )
                con.execute(
                    f"INSERT INTO lineage_materializations SELECT * FROM new_materializations "
                    f"WHERE materialization_id NOT IN ({known})"
                )
                for key, value in (meta or {}).items():
                    con.execute("INSERT OR REPLACE INTO catalog_meta VALUES (?, ?)", [key, value])
                self._rebuild_views(con)
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise

    def meta(self, key: str) -> str | None:
        """A value of the catalog's ``catalog_meta`` table."""
        if not self.db_path.exists():
            return None
        with self.connect(read_only=True) as con:
            try:
                row = con.execute("SELECT value FROM catalog_meta WHERE key = ?", [key]).fetchone()
            except duckdb.CatalogException:
                return None
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        with self.connect() as con:
            con.execute(_CATALOG_DDL)
            con.execute("INSERT OR REPLACE INTO catalog_meta VALUES (?, ?)", [key, value])

    def _rebuild_views(self, con: duckdb.DuckDBPyConnection) -> None:
        current = con.execute(
            "SELECT table_name, list(path ORDER BY dataset) FROM table_versions WHERE is_current GROUP BY table_name"
        ).fetchall()
        paths_by_table = {name: [str(self.resolve(p)) for p in paths] for name, paths in current}
        for table_name, schema in TABLE_SCHEMAS.items():
            # The schema's empty file comes first: every column exists (files older than a column
            # read it as null) and the columns keep the schema's order.
            paths = [str(self._empty_file(table_name, schema)), *paths_by_table.pop(table_name, [])]
            con.execute(f"CREATE OR REPLACE VIEW {table_name} AS {_table_view_sql(table_name, paths)}")
        for table_name, paths in paths_by_table.items():  # tables registered by later stages
            con.execute(
                f"CREATE OR REPLACE VIEW {table_name} AS "
                f"SELECT * FROM read_parquet({_sql_list(paths)}, union_by_name = true)"
            )
        for view_name, sql in _JOINED_VIEWS.items():
            con.execute(f"CREATE OR REPLACE VIEW {view_name} AS {sql}")
        con.execute(_LINEAGE_VIEW)
        con.execute("INSERT OR REPLACE INTO catalog_meta VALUES ('views_home', ?)", [self._views_stamp()])

    def _views_stamp(self) -> str:
        """Who built the views: this home's location and the views' version, in one value that every
        version of Stepwise rewrites when it rebuilds them (so an older process sharing the home, one
        that builds views without a newer column, makes the next newer process rebuild them again)."""
        return f"{self.home}#views-{VIEWS_VERSION}"

    def _empty_file(self, table_name: str, schema: pa.Schema) -> Path:
        """A zero-row file of the table's schema (rewritten when the schema has changed since), with
        the table's renamed columns under their old names too, so the view's SQL can name them
        whether or not an older file still has them."""
        for old_name, new_name in _RENAMED_COLUMNS.get(table_name, {}).items():
            schema = schema.append(pa.field(old_name, schema.field(new_name).type))
        path = self.data_dir / "_empty" / f"{table_name}.parquet"
        if not path.exists() or not pq.read_schema(path).equals(schema, check_metadata=False):
            write_parquet_atomic(schema.empty_table(), path)
        return path

    # -- reading -----------------------------------------------------------------------------
    def query(self, sql: str, params: list | None = None) -> pa.Table:
        with self.connect(read_only=True) as con:
            return con.sql(sql, params=params or None).to_arrow_table()

    def has_table(self, name: str) -> bool:
        """Whether a table or view ``name`` is defined in the catalog (e.g. ``human_labels`` before it lands)."""
        if not self.db_path.exists():
            return False
        rows = self.query(
            "SELECT count(*) AS n FROM information_schema.tables WHERE table_name = ?", [name]
        ).to_pylist()
        return bool(rows and rows[0]["n"])

    def current_version(self, table_name: str, dataset: str) -> tuple[str, str] | None:
        """(materialization_id, path) of the current version of a table, if any."""
        if not self.db_path.exists():
            return None
        with self.connect(read_only=True) as con:
            try:
                row = con.execute(
                    "SELECT materialization_id, path FROM table_versions "
                    "WHERE is_current AND table_name = ? AND dataset = ?",
                    [table_name, dataset],
                ).fetchone()
            except duckdb.CatalogException:
                return None
        return (row[0], str(self.resolve(row[1]))) if row else None

    def current_versions(self, table_name: str) -> list[tuple[str, str, Path]]:
        """(dataset, materialization_id, absolute path) of every current version of a table."""
        if not self.db_path.exists():
            return []
        with self.connect(read_only=True) as con:
            try:
                rows = con.execute(
                    "SELECT dataset, materialization_id, path FROM table_versions "
                    "WHERE is_current AND table_name = ? ORDER BY dataset",
                    [table_name],
                ).fetchall()
            except duckdb.CatalogException:
                return []
        return [(dataset, mid, self.resolve(path)) for dataset, mid, path in rows]

    def current_inputs(self, table_names: Iterable[str], exclude_dataset: str | None = None) -> list[LineageInput]:
        """Lineage inputs for a materialization that reads the current versions of these tables."""
        names = list(table_names)
        if not self.db_path.exists():
            return []
        rows = self.query(
            "SELECT v.table_name, v.dataset, v.path, v.materialization_id, m.asset FROM table_versions v "
            "JOIN lineage_materializations m USING (materialization_id) "
            "WHERE v.is_current AND list_contains(?, v.table_name) "
            "ORDER BY v.table_name, v.dataset",
            [names],
        ).to_pylist()
        return [
            LineageInput(
                kind="asset",
                path=str(self.resolve(r["path"])),
                version=r["materialization_id"],
                input_asset=r["asset"],
                input_materialization_id=r["materialization_id"],
            )
            for r in rows
            if r["dataset"] != exclude_dataset
        ]

    def views(self) -> list[str]:
        """The SQL views users query (one per table, plus ``lineage``), sorted."""
        with self.connect(read_only=True) as con:
            rows = con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal ORDER BY 1").fetchall()
        return [r[0] for r in rows]

    def columns(self, view: str) -> list[tuple[str, str]]:
        """(name, type) of a view's columns; KeyError naming the views that exist when it is not one."""
        known = self.views()
        if view not in known:
            raise KeyError(f"no view {view!r}; the views are: {', '.join(known)}")
        with self.connect(read_only=True) as con:
            rows = con.execute(
                "SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = ? ORDER BY column_index",
                [view],
            ).fetchall()
        return [(str(name), str(kind)) for name, kind in rows]

    def lineage_of(self, episode_id: str) -> pa.Table:
        """Where an episode came from: the current table version holding it and, transitively,
        everything that version was made from, down to raw files (rows as :meth:`walk_back`).
        Empty when no current version holds the episode."""
        versions = self.current_versions("episodes")
        if not versions:
            return pa.table({})
        paths = _sql_list([str(path) for _, _, path in versions])
        found = self.query(
            f"SELECT DISTINCT filename FROM read_parquet({paths}, filename = true, union_by_name = true) "
            "WHERE episode_id = ?",
            [episode_id],
        ).to_pylist()
        if not found:
            return pa.table({})
        return self.walk_back(found[0]["filename"])

    def walk_back(self, output_path: str) -> pa.Table:
        """Every input, transitively, behind the materialization that wrote ``output_path``.

        Returns rows (depth, asset, materialization_id, kind, path, version); raw files have kind 'file'.
        ``output_path`` may be absolute or relative to the home, as stored.
        """
        sql = """
        WITH RECURSIVE chain(depth, materialization_id) AS (
            SELECT 0, materialization_id FROM lineage_materializations WHERE list_contains(output_paths, ?)
            UNION
            SELECT c.depth + 1, i.input_materialization_id
            FROM chain c JOIN lineage_inputs i ON i.materialization_id = c.materialization_id
            WHERE i.kind = 'asset' AND i.input_materialization_id IS NOT NULL
        )
        SELECT c.depth, m.asset, c.materialization_id, i.kind, i.path, i.version
        FROM chain c
        JOIN lineage_materializations m USING (materialization_id)
        JOIN lineage_inputs i USING (materialization_id)
        ORDER BY c.depth, i.kind, i.path
        """
        return self.query(sql, [self.relative(self.resolve(output_path))])


def _sql_list(paths: list[str]) -> str:
    return "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in paths) + "]"


def _table_view_sql(table_name: str, paths: list[str]) -> str:
    """The ``SELECT`` behind a table's view over its current files (the empty schema file first):
    derived columns filled in for rows written before they existed, renamed columns read under their
    new names from files written before the rename."""
    derived = {c: f"coalesce({c}, {sql})" for c, sql in _DERIVED_COLUMNS.get(table_name, {}).items()}
    renamed = _RENAMED_COLUMNS.get(table_name, {})
    derived |= {new: f"coalesce({new}, {old})" for old, new in renamed.items()}
    exclude = f" EXCLUDE ({', '.join(renamed)})" if renamed else ""
    replace = f" REPLACE ({', '.join(f'{sql} AS {c}' for c, sql in derived.items())})" if derived else ""
    return f"SELECT *{exclude}{replace} FROM read_parquet({_sql_list(paths)}, union_by_name = true)"
