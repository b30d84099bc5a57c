"""A table's key, declared in its Arrow schema's metadata: the columns no two rows share."""

from __future__ import annotations

import pyarrow as pa

#: Schema metadata naming a table's key: the columns whose values no two rows share.
KEY_METADATA = b"stepwise.key"


def with_key(schema: pa.Schema, *columns: str) -> pa.Schema:
    """``schema`` declaring ``columns`` as the table's key (no two rows share their values)."""
    missing = [c for c in columns if c not in schema.names]
    if not columns or missing:
        raise ValueError(f"key columns {missing or '(none)'} are not in the schema {schema.names}")
    return schema.with_metadata({**(schema.metadata or {}), KEY_METADATA: ",".join(columns).encode()})


def table_key(schema: pa.Schema) -> tuple[str, ...]:
    """The key a schema declares (empty when it declares none)."""
    raw = (schema.metadata or {}).get(KEY_METADATA)
    return tuple(raw.decode().split(",")) if raw else ()
