"""The warehouse on an object store: Parquet in an S3-compatible bucket (or a shared folder) that
several machines push to, pull from and query in place.

A Stepwise home is a DuckDB catalog over immutable Parquet files (one per materialization and
dataset). The store holds the same files under the same relative paths, plus the catalog as
data, so no DuckDB file has to be shared:

    <store>/data/<table>/<dataset>/<materialization>.parquet   immutable, written once
    <store>/catalog/<generation>/versions.parquet              the current version of each (table, dataset)
    <store>/catalog/<generation>/lineage_materializations.parquet, lineage_inputs.parquet
    <store>/catalog/<generation>/views.sql                     CREATE VIEW ... over s3:// URLs (DuckDB + httpfs)
    <store>/catalog/manifest.json                              names the current generation; written last

A reader reads the manifest, then that generation's files: a consistent snapshot, since a
generation is never rewritten and an object PUT is atomic (the manifest is the only object
replaced). ``push`` merges per (table, dataset) against what the store held at this home's last
sync (kept in its ``catalog_meta``): a dataset changed only here is pushed, one changed only in
the store is kept (never rolled back), one changed on both sides is a conflict that names it and
changes nothing. ``pull`` is the mirror image. Lineage rows travel with the versions, so
``walk_back`` works on a pulled home.

Locations: ``s3://bucket/prefix`` (AWS or any S3-compatible server: endpoint from
``AWS_ENDPOINT_URL``; credentials and region from the usual ``AWS_*`` variables, read by pyarrow
and never stored), or a folder path / ``file://`` URL (a shared file system).

What this does not fully close: two pushes that start at the same moment both read one manifest.
Each checks the manifest again just before writing its own and reads it back after: the one whose
manifest was replaced raises (its home records no sync, so pushing again merges properly), but a
replacement landing in the instant between another push's read-back and its write goes unseen.
Closing that window needs a conditional PUT (``If-Match``), which pyarrow's S3 client does not
expose. See docs/scale.md.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlparse

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from tqdm import tqdm

from warehouse.catalog import ConcurrentPublishError, Warehouse
from warehouse.schema import TABLE_SCHEMAS
from warehouse.storage import git_revision

MANIFEST = "catalog/manifest.json"
FORMAT = 1
Log = Callable[[str], None]
Key = tuple[str, str]  # (table_name, dataset)


@dataclass(frozen=True)
class Store:
    """An object-store location: a pyarrow file system and the root inside it."""

    url: str
    filesystem: pafs.FileSystem
    root: str

    def path(self, key: str) -> str:
        return f"{self.root}/{key}" if self.root else key

    def uri(self, key: str) -> str:
        """What DuckDB (or any client) calls the object: ``s3://bucket/prefix/key`` or a file path."""
        return f"s3://{self.path(key)}" if isinstance(self.filesystem, pafs.S3FileSystem) else self.path(key)

    def exists(self, key: str) -> bool:
        return self.filesystem.get_file_info(self.path(key)).type == pafs.FileType.File

    def read_bytes(self, key: str) -> bytes | None:
        if not self.exists(key):
            return None
        with self.filesystem.open_input_stream(self.path(key)) as stream:
            return stream.read()

    def write_bytes(self, key: str, data: bytes) -> None:
        """One object, whole: an S3 PUT is atomic; on a file system, a temporary name and a rename."""
        target = self.path(key)
        if isinstance(self.filesystem, pafs.LocalFileSystem):
            self.filesystem.create_dir(target.rsplit("/", 1)[0], recursive=True)
            tmp = f"{target}.{uuid.uuid4().hex[:8]}.tmp"
            with self.filesystem.open_output_stream(tmp) as out:
                out.write(data)
            self.filesystem.move(tmp, target)
            return
        with self.filesystem.open_output_stream(target) as out:
            out.write(data)

    def write_table(self, key: str, table: pa.Table) -> None:
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression="zstd")
        self.write_bytes(key, sink.getvalue().to_pybytes())

    def read_table(self, key: str) -> pa.Table:
        return pq.read_table(self.path(key), filesystem=self.filesystem)

    def ensure_root(self) -> None:
        """The bucket (where the credentials may create it) or the folder."""
        try:
            if isinstance(self.filesystem, pafs.LocalFileSystem):
                self.filesystem.create_dir(self.root, recursive=True)
            elif self.filesystem.get_file_info(self.root.split("/", 1)[0]).type == pafs.FileType.NotFound:
                self.filesystem.create_dir(self.root.split("/", 1)[0], recursive=False)
        except OSError as exc:
            raise OSError(f"{self.url}: cannot create or reach the bucket or folder: {exc}") from exc

    def upload(self, local: Path, key: str) -> None:
        self.write_bytes(key, local.read_bytes())

    def download(self, key: str, local: Path) -> None:
        data = self.read_bytes(key)
        if data is None:
            raise FileNotFoundError(f"{self.uri(key)}: named by the store's catalog but not in the store")
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(f".{local.name}.{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_bytes(data)
        tmp.replace(local)


def open_store(url: str) -> Store:
    """A :class:`Store` for ``s3://bucket[/prefix]``, ``file:///folder`` or a folder path."""
    parsed = urlparse(url)
    if parsed.username or parsed.password:
        # A URL is logged, shown in errors and kept in the catalog: credentials never go in one.
        raise ValueError("an object-store URL must not hold credentials: set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY")
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"{url!r}: an S3 location names a bucket: s3://bucket/prefix")
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        options: dict = {
            "region": os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
            "allow_bucket_creation": True,
        }
        if endpoint:
            endpoint_url = urlparse(endpoint)
            options |= {"endpoint_override": endpoint_url.netloc or endpoint, "scheme": endpoint_url.scheme or "https"}
        return Store(url, pafs.S3FileSystem(**options), f"{parsed.netloc}{parsed.path}".rstrip("/"))
    if parsed.scheme in ("", "file"):
        folder = Path(parsed.path if parsed.scheme else url).expanduser().resolve()
        return Store(url, pafs.LocalFileSystem(), str(folder))
    raise ValueError(f"{url!r}: not an object-store location (s3://bucket/prefix, file:///folder or a folder)")


# -- the catalog in the store ---------------------------------------------------------------------


@dataclass
class StoreCatalog:
    """One generation of the store's catalog (empty for a store never pushed to)."""

    generation: str | None
    versions: pa.Table
    materializations: pa.Table
    inputs: pa.Table

    def by_key(self) -> dict[Key, dict]:
        return {(r["table_name"], r["dataset"]): r for r in self.versions.to_pylist()}


def current_generation(store: Store) -> str | None:
    """The generation the store's manifest names (None: nothing was pushed yet)."""
    raw = store.read_bytes(MANIFEST)
    if raw is None:
        return None
    manifest = json.loads(raw)
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{store.uri(MANIFEST)}: catalog format {manifest.get('format')!r}, this code reads {FORMAT}")
    return manifest["generation"]


def read_catalog(store: Store, local: dict[str, pa.Table]) -> StoreCatalog:
    """The store's current catalog, cast to the schemas of ``local`` (a home's
    :meth:`~warehouse.catalog.Warehouse.catalog_tables`)."""
    generation = current_generation(store)
    schemas = {name: table.schema for name, table in local.items()}
    if generation is None:
        tables = {name: schema.empty_table() for name, schema in schemas.items()}
    else:
        tables = {
            name: store.read_table(f"catalog/{generation}/{name}.parquet").cast(schema)
            for name, schema in schemas.items()
        }
    return StoreCatalog(generation, tables["versions"], tables["lineage_materializations"], tables["lineage_inputs"])


def _base_key(store: Store) -> str:
    """Where a home keeps its last sync with a store: named by the store's resolved location, so
    ``./shared``, ``/abs/shared`` and ``file:///abs/shared`` are one store."""
    return f"object_store_base:{store.uri('')}"


def _base(warehouse: Warehouse, store: Store) -> dict[Key, str]:
    """The store's (table, dataset) -> materialization at this home's last push or pull."""
    raw = warehouse.meta(_base_key(store))
    if not raw:
        return {}
    return {(k.split("\t", 1)[0], k.split("\t", 1)[1]): v for k, v in json.loads(raw).items()}


def _encode_base(versions: dict[Key, dict], keep: dict[Key, str] | None = None) -> str:
    """The base to record: ``versions``' ids, and ``keep``'s for keys not in ``versions``."""
    ids = dict(keep or {}) | {key: r["materialization_id"] for key, r in versions.items()}
    return json.dumps({f"{t}\t{d}": mid for (t, d), mid in ids.items()}, sort_keys=True)


def _merge(winners: dict[Key, dict], losers: dict[Key, dict], base: dict[Key, str], where: str) -> list[Key]:
    """The keys where ``winners`` should replace ``losers``: changed on the winning side only. A
    key changed on both sides since ``base`` raises :class:`ConcurrentPublishError`."""
    take, conflicts = [], []
    for key, mine in winners.items():
        theirs = losers.get(key)
        if theirs is not None and theirs["materialization_id"] == mine["materialization_id"]:
            continue
        if theirs is None or theirs["materialization_id"] == base.get(key):
            take.append(key)
        elif mine["materialization_id"] != base.get(key):
            conflicts.append(key)
    if conflicts:
        table, dataset = conflicts[0]
        raise ConcurrentPublishError(
            f"{table} / {dataset} changed both here and in {where} since this home last synced with it "
            f"({len(conflicts)} dataset(s) in conflict); nothing was changed. Rebuild it on one side "
            "(or pull into a fresh home) and try again."
        )
    return sorted(take)


@dataclass
class SyncSummary:
    url: str
    generation: str | None = None
    sent: list[Key] = field(default_factory=list)  # (table, dataset) whose version went to the other side
    kept: list[Key] = field(default_factory=list)  # newer on the far side, left as it was
    files: int = 0  # Parquet files copied
    bytes: int = 0


def push(warehouse: Warehouse, url: str, *, log: Log = print) -> SyncSummary:
    """Send this home's current versions (and their lineage) to the store, merged with what the
    store holds; a new catalog generation, then the manifest."""
    store = open_store(url)
    store.ensure_root()
    local = warehouse.catalog_tables()
    remote = read_catalog(store, local)
    mine = {(r["table_name"], r["dataset"]): r for r in local["versions"].to_pylist()}
    theirs = remote.by_key()
    base = _base(warehouse, store)
    take = _merge(mine, theirs, base, store.url)
    summary = SyncSummary(url=store.url, sent=take)
    summary.kept = _differing(theirs, mine, take)
    for key in tqdm(take, desc=f"push to {store.url}", unit="dataset", disable=None):
        path = mine[key]["path"]
        if not store.exists(path):
            local_file = warehouse.resolve(path)
            store.upload(local_file, path)
            summary.files += 1
            summary.bytes += local_file.stat().st_size
    merged = {**theirs, **{k: mine[k] for k in take}}
    versions = pa.Table.from_pylist([merged[k] for k in sorted(merged)], schema=local["versions"].schema)
    known = set(remote.materializations.column("materialization_id").to_pylist())
    materializations = _with_new_rows(remote.materializations, local["lineage_materializations"], known)
    inputs = _with_new_rows(remote.inputs, local["lineage_inputs"], known)
    generation = f"{datetime.now(UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"
    store.write_table(f"catalog/{generation}/versions.parquet", versions)
    store.write_table(f"catalog/{generation}/lineage_materializations.parquet", materializations)
    store.write_table(f"catalog/{generation}/lineage_inputs.parquet", inputs)
    store.write_bytes(f"catalog/{generation}/views.sql", views_sql(store, versions).encode())
    if current_generation(store) != remote.generation:
        raise ConcurrentPublishError(
            f"{store.url}: another push landed while this one ran; nothing was made current. Push again."
        )
    manifest = {
        "format": FORMAT,
        "generation": generation,
        "previous": remote.generation,
        "pushed_at": datetime.now(UTC).isoformat(),
        "pushed_from": socket.gethostname(),
        "code_version": git_revision(),
        "tables": sorted({t for t, _ in merged}),
    }
    store.write_bytes(MANIFEST, json.dumps(manifest, indent=1).encode())
    landed = current_generation(store)
    if landed != generation:
        raise ConcurrentPublishError(
            f"{store.url}: another push replaced this one's manifest (generation {landed} is current, not "
            f"{generation}); this home's datasets may not be current there. Push again."
        )
    # The new base: what the store and this home now agree on; a dataset kept as the store had it
    # (newer there) keeps its old base, so the next pull takes it and the next push does not undo it.
    agreed = {k: r for k, r in merged.items() if k in mine and mine[k]["materialization_id"] == r["materialization_id"]}
    warehouse.set_meta(_base_key(store), _encode_base(agreed, keep=base))
    summary.generation = generation
    log(
        f"pushed {len(take)} dataset versions ({summary.files} files, {summary.bytes / 1e6:.1f} MB) to {store.url}, "
        f"generation {generation}; {len(summary.kept)} kept as the store had them (newer there: pull)"
    )
    return summary


def pull(warehouse: Warehouse, url: str, *, log: Log = print) -> SyncSummary:
    """Make the store's current versions current here (files copied, lineage merged), except
    datasets changed only here; a dataset changed on both sides is a conflict."""
    store = open_store(url)
    local = warehouse.catalog_tables()
    remote = read_catalog(store, local)
    if remote.generation is None:
        raise FileNotFoundError(f"{store.uri(MANIFEST)}: nothing was pushed to this store yet")
    mine = {(r["table_name"], r["dataset"]): r for r in local["versions"].to_pylist()}
    theirs = remote.by_key()
    base = _base(warehouse, store)
    take = _merge(theirs, mine, base, "this home")
    summary = SyncSummary(url=store.url, generation=remote.generation, sent=take)
    for key in tqdm(take, desc=f"pull from {store.url}", unit="dataset", disable=None):
        path = theirs[key]["path"]
        target = warehouse.resolve(path)
        if not target.exists():
            store.download(path, target)
            summary.files += 1
            summary.bytes += target.stat().st_size
    adopted = pa.Table.from_pylist([theirs[k] for k in take], schema=local["versions"].schema)
    warehouse.adopt_versions(
        adopted,
        remote.materializations,
        remote.inputs,
        meta={_base_key(store): _encode_base(theirs)},
        expected={key: mine[key]["materialization_id"] if key in mine else None for key in take},
    )
    summary.kept = _differing(mine, theirs, take)
    log(
        f"pulled {len(take)} dataset versions ({summary.files} files, {summary.bytes / 1e6:.1f} MB) from {store.url}, "
        f"generation {remote.generation}; {len(summary.kept)} kept as this home has them (newer here: push)"
    )
    return summary


def _differing(side: dict[Key, dict], other: dict[Key, dict], taken: list[Key]) -> list[Key]:
    """Keys whose version on ``side`` was not taken and is not the ``other`` side's (newer, or only there)."""
    return sorted(
        k
        for k, row in side.items()
        if k not in taken and other.get(k, {}).get("materialization_id") != row["materialization_id"]
    )


def _with_new_rows(remote: pa.Table, local: pa.Table, known: set[str]) -> pa.Table:
    """``remote``'s lineage rows plus ``local``'s rows of materializations not in ``known``."""
    mask = pa.array([m not in known for m in local.column("materialization_id").to_pylist()], pa.bool_())
    return pa.concat_tables([remote, local.filter(mask).cast(remote.schema)])


def views_sql(store: Store, versions: pa.Table) -> str:
    """``CREATE VIEW`` statements over the store's URLs, for any DuckDB client with httpfs (and S3
    credentials) to query the shared warehouse in place: ``duckdb -c ".read views.sql"``."""
    by_table: dict[str, list[str]] = {}
    for row in versions.to_pylist():
        by_table.setdefault(row["table_name"], []).append(store.uri(row["path"]))
    lines = [f"-- Stepwise warehouse at {store.url}: one view per table over its current Parquet versions."]
    for table, uris in sorted(by_table.items()):
        files = ", ".join("'" + u.replace("'", "''") + "'" for u in uris)
        lines.append(f"CREATE OR REPLACE VIEW {table} AS SELECT * FROM read_parquet([{files}], union_by_name = true);")
    return "\n".join(lines) + "\n"


def connect(url: str) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with one view per table of the store's current catalog, read in place
    through pyarrow datasets (no download, no DuckDB extension), plus ``lineage_materializations``
    and ``lineage_inputs``."""
    store = open_store(url)
    generation = current_generation(store)
    if generation is None:
        raise FileNotFoundError(f"{store.uri(MANIFEST)}: nothing was pushed to this store yet")
    versions = store.read_table(f"catalog/{generation}/versions.parquet").to_pylist()
    con = duckdb.connect()
    by_table: dict[str, list[str]] = {}
    for row in versions:
        by_table.setdefault(row["table_name"], []).append(store.path(row["path"]))
    for table, paths in sorted(by_table.items()):
        schema = TABLE_SCHEMAS.get(table) or pq.read_schema(paths[0], filesystem=store.filesystem)
        con.register(f"_{table}_files", ds.dataset(paths, schema=schema, filesystem=store.filesystem, format="parquet"))
        con.execute(f"CREATE VIEW {table} AS SELECT * FROM _{table}_files")
    for name in ("lineage_materializations", "lineage_inputs"):
        con.register(name, store.read_table(f"catalog/{generation}/{name}.parquet"))
    return con
