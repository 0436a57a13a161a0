"""Shared fixtures. One SparkSession for the whole test session: starting a JVM costs seconds."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    from epochal.spark_session import build_spark_session

    session = build_spark_session(master="local[2]", app_name="epochal-tests")
    yield session
    session.stop()
