"""Dagster entry point: ``dagster job execute -m platform_defs -j epoch_job``, ``dagster dev -w workspace.yaml``."""

from platform_defs.definitions import build_definitions

defs = build_definitions()
