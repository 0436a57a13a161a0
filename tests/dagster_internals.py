"""Every private Dagster name the tests import, gathered here, each with why no public API does it
(as ``platform_defs/dagster_internals.py`` does for the executor). The rest of the tests and the
benchmarks use ``dagster``'s public names only; if an upgrade moves one of these, the import fails
here, naming it."""

from __future__ import annotations

import dagster as dg

# ``JobDefinition.execute_in_process`` always swaps the job's executor for the in-process one; the
# tests run Epochal's own threaded executor, as real runs do, through the function that
# ``execute_in_process`` itself calls. No public API runs a job in process with its own executor.
from dagster._core.definitions.job_base import InMemoryJob
from dagster._core.execution.build_resources import wrap_resources_for_execution
from dagster._core.execution.execute_in_process import core_execute_in_process

# What the UI is sent of a code location (the repository snapshot): the secrets test checks that
# no secret is in it. Dagster builds it only with this private type.
from dagster._core.remote_representation.external_data import RepositorySnap

__all__ = ["RepositorySnap", "execute_with_own_executor"]


def execute_with_own_executor(
    job: dg.JobDefinition, resources: dict, instance: dg.DagsterInstance, tags: dict[str, str]
) -> dg.ExecuteInProcessResult:
    """``job.execute_in_process``, but with the job's own executor (Epochal's threads)."""
    own = job.graph.to_job(
        name=job.name,
        executor_def=job.executor_def,
        resource_defs=wrap_resources_for_execution(resources),
        tags=job.tags,
    )
    return core_execute_in_process(
        run_config={},
        job=InMemoryJob(own),
        instance=instance,
        output_capturing_enabled=True,
        raise_on_error=False,
        run_tags=tags,
    )
