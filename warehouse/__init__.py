"""The warehouse: Arrow schemas with their keys, atomic Parquet, the DuckDB catalog with lineage,
checks, plotting and the object store."""
