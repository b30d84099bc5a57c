"""The Dagster code location (``definitions``), the main job and the ``stepwise`` command line."""
