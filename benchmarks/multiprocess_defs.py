"""``epoch_job`` with the multiprocess executor, for ``bench_epoch.py``'s executor comparison.

``platform_defs``' epoch_job pins ``executor_def=in_process_executor``, so the executor cannot be
switched with run config (``{"execution": {"config": {"multiprocess": {}}}}`` is rejected: the
in-process executor's config has no ``multiprocess`` key). This module builds the same op graph as
a second job with ``multiprocess_executor`` and binds the same resources:

    dagster job execute -f benchmarks/multiprocess_defs.py -j epoch_job_multiprocess

Every step then runs in its own process, which re-imports this file to find the job (so it must
stay a loadable file, not something built inside bench_epoch.py).
"""

from dagster import Definitions, multiprocess_executor

from platform_defs.definitions import build_definitions


def _build() -> Definitions:
    base = build_definitions()
    job = base.get_job_def("epoch_job")
    multiprocess = job.graph.to_job(
        name="epoch_job_multiprocess",
        executor_def=multiprocess_executor,
        tags=dict(job.tags),
        description="epoch_job with one process per step (benchmark only).",
    )
    return Definitions(jobs=[multiprocess], resources=base.resources)


# Only one Definitions object may live at module scope, so the base one stays inside _build().
defs = _build()
