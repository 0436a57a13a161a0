"""Epochal: a streaming database's consistency model (epochs, barriers, checkpoints) on Dagster,
Spark and DuckDB. This package is the Dagster-free core."""

__version__ = "0.1.0"
