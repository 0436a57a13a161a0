"""Every private Dagster name Epochal's code (not its tests) imports, gathered here, with why no public API does it.

Dagster's public API covers declaring an executor (``dagster.executor``, ``dagster.Executor``) and
the events it yields (``dagster.DagsterEvent``), but not running a plan's steps: its own executors
do that with private code such as the names below (its "Internals" docs: names imported from
Dagster submodules are not stable), and it ships no threaded one (dagster-io/dagster#4041).
``platform_defs/executor.py``, Epochal's threaded executor, imports them from here and nowhere
else; the rest of ``epochal/`` and ``platform_defs/`` uses only public ones.

Objects reached through these names are just as private, and are used only in the executor: the
``ActiveExecution`` that ``ExecutionPlan.start`` returns, ``PlanExecutionContext.for_step``, the
instance's compute log manager (``build_log_key_for_run``, ``capture_logs``), and the
``DagsterEvent.engine_event`` / ``DagsterEvent.capture_logs`` constructors (the class is public,
those class methods are not).

Checked against Dagster 1.13.0 to 1.13.27 (pyproject pins ``dagster>=1.13,<1.14``); the names and
the signatures the executor calls are the same across that range. If an upgrade removes or moves
one, importing this module fails with the Dagster version and the missing name, not with an
ImportError deep in the executor.
"""

from __future__ import annotations

import dagster

#: The Dagster releases the names below were checked against.
CHECKED_DAGSTER = "1.13.0 to 1.13.27"

try:
    # The event data of the executor's engine events (pid and step keys, interrupted steps): the
    # public DagsterEvent has no public constructor for engine events nor public event data type.
    from dagster._core.events import EngineEventData

    # Runs the plan's steps inside a run's execution context (resources, logging, run failure
    # handling) around an executor's own step loop; Dagster does this only in private helpers.
    from dagster._core.execution.api import ExecuteRunWithPlanIterable

    # The run-wide compute log key, as the in-process executor builds it; no public API makes one.
    from dagster._core.execution.compute_logs import create_compute_log_file_key

    # Types of the public Executor.execute's arguments and of the step loop's context; Dagster
    # documents them in Executor.execute's signature but does not export them.
    from dagster._core.execution.context.system import PlanExecutionContext, PlanOrchestrationContext

    # Builds the PlanExecutionContext (resources, IO managers, loggers) from the orchestration
    # context, as the in-process executor does; there is no public constructor.
    from dagster._core.execution.context_creation_job import PlanExecutionContextManager

    # The body of one step (inputs, compute, outputs, the step's events) and the running of its
    # hooks after it ends: the in-process loop's own functions; no public API runs a single step.
    from dagster._core.execution.plan.execute_plan import _trigger_hook, dagster_event_sequence_for_step

    # Op/pool concurrency slots for the steps the executor starts, which ExecutionPlan.start needs;
    # no public equivalent.
    from dagster._core.execution.plan.instance_concurrency_context import InstanceConcurrencyContext

    # Type of the public Executor.execute's plan argument (its .start() is the step bookkeeping);
    # documented in that signature but not exported.
    from dagster._core.execution.plan.plan import ExecutionPlan

    # What the public Executor.retries property must return; Dagster does not export it.
    from dagster._core.execution.retries import RetryMode
except ImportError as error:  # a Dagster upgrade removed or moved one of them
    raise ImportError(
        f"Epochal's threaded executor (platform_defs/executor.py) uses private Dagster APIs that "
        f"Dagster {dagster.__version__} does not have ({error}); they were checked against Dagster "
        f"{CHECKED_DAGSTER}. Install a Dagster in that range (pyproject.toml) or port "
        f"platform_defs/dagster_internals.py to this one."
    ) from error

__all__ = [
    "CHECKED_DAGSTER",
    "EngineEventData",
    "ExecuteRunWithPlanIterable",
    "ExecutionPlan",
    "InstanceConcurrencyContext",
    "PlanExecutionContext",
    "PlanExecutionContextManager",
    "PlanOrchestrationContext",
    "RetryMode",
    "_trigger_hook",
    "create_compute_log_file_key",
    "dagster_event_sequence_for_step",
]
