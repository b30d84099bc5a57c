"""Dagster declarations only: assets, checks, sensors, jobs, their configs and resources."""
