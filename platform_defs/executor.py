"""A Dagster executor that runs a run's independent steps on threads of one process.

Dagster has an in-process executor (one step at a time) and a multiprocess one (a process, and for
Epochal a JVM attach and a pipeline load, per step); it has no threaded one
(dagster-io/dagster#4041). An epoch's view steps are mostly waits on Spark: a query planned on the
driver, a job on the server, a Parquet commit, a meta-store transaction. Steps whose inputs are
ready therefore overlap well on threads: one step's driver work runs while another's Spark job
does, in one process with one Spark session.

The loop is the in-process executor's (``inner_plan_execution_iterator``) with the step bodies on
worker threads: the main thread alone asks ``ActiveExecution`` for steps, yields their events and
reports them back to it, so Dagster's bookkeeping stays single-threaded. Every event a step makes
is still written to the run's event log by the step itself, as in-process. With
``max_concurrent: 1`` it runs one step at a time, like the in-process executor.

A run of several epochs maps its steps over them (``view__v[e<epoch>]``). The oldest epoch's ready
steps go first, so it commits and reaches its sinks while the next one's views run; and a mapped
step starts only after the same step of every older epoch of the run has ended (its state is the
input of the next epoch's), so no thread is spent waiting for order inside the runtime.
"""

from __future__ import annotations

import logging
import os
import queue
import re
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dagster import (
    DagsterEvent,
    DagsterEventType,
    DagsterExecutionInterruptedError,
    Executor,
    Field,
    Int,
    Selector,
    executor,
)

from platform_defs.dagster_internals import (
    EngineEventData,
    ExecuteRunWithPlanIterable,
    InstanceConcurrencyContext,
    PlanExecutionContextManager,
    RetryMode,
    _trigger_hook,
    create_compute_log_file_key,
    dagster_event_sequence_for_step,
)

# Dagster has no public API for running a plan's steps; its private names are in one module, with why.
from platform_defs.run_summary import Materialized, plain_metadata, run_summary

if TYPE_CHECKING:
    from platform_defs.dagster_internals import ExecutionPlan, PlanExecutionContext, PlanOrchestrationContext

#: How long the main thread waits for a step's event before it looks at interrupts and new steps.
POLL_S = 0.5
#: After an interrupt, how long the steps running may take to end before the run ends without them
#: (a step waiting for an earlier epoch may wait minutes; the process exits, and Epochal recovers
#: the epoch as after any crash).
INTERRUPT_GRACE_S = 10.0


def mapping_key(epoch: int) -> str:
    """The mapping key of an epoch's steps in epoch_job (Dagster's mapping keys are names, not numbers)."""
    return f"e{epoch}"


#: ``name[e<epoch>]``: a step of epoch_job's graph mapped over the run's epochs (``mapping_key``).
_MAPPED_STEP = re.compile(r"^(?P<name>.+)\[e(?P<epoch>\d+)\]$")


def _mapped(step_key: str) -> tuple[str, int] | None:
    match = _MAPPED_STEP.match(step_key)
    return (match["name"], int(match["epoch"])) if match else None


def epoch_first(step) -> int:  # noqa: ANN001 (an ExecutionStep)
    """Sort key of ready steps: the oldest epoch's first; a step that is not mapped (the barrier) before all.
    An int, not the float Dagster's hint says: epochs are above 2**53, where floats tie."""
    mapped = _mapped(step.key)
    return -1 if mapped is None else mapped[1]


class EpochOrder:
    """Which taken steps may start: a mapped step waits while the same step of an older epoch of
    the run is held or running. Ready steps are taken oldest epoch first, so the older one is
    always taken before (or with) the newer."""

    def __init__(self) -> None:
        self._open: dict[str, set[int]] = {}  # step name -> epochs taken and not ended
        self._held: list = []  # taken steps waiting for an older epoch's, in the order taken

    def take(self, steps: list) -> None:
        for step in steps:
            mapped = _mapped(step.key)
            if mapped is not None:
                self._open.setdefault(mapped[0], set()).add(mapped[1])
            self._held.append(step)

    def ended(self, step_key: str) -> None:
        mapped = _mapped(step_key)
        if mapped is not None:
            self._open.get(mapped[0], set()).discard(mapped[1])

    def startable(self, limit: int) -> list:
        """Up to ``limit`` held steps whose older epochs' same step has ended, oldest epoch first."""
        chosen = []
        for step in sorted(self._held, key=epoch_first):
            if len(chosen) >= limit:
                break
            mapped = _mapped(step.key)
            if mapped is None or min(self._open.get(mapped[0], ())) >= mapped[1]:
                chosen.append(step)
        for step in chosen:
            self._held.remove(step)
        return chosen

    @property
    def held(self) -> list[str]:
        return [step.key for step in self._held]


@dataclass(frozen=True)
class _Done:
    """A step thread's last message: its body ended, with the exception that escaped it, if any."""

    step_key: str
    exc_info: tuple | None = None


def _run_step(step_context, events: queue.Queue) -> None:  # noqa: ANN001
    try:
        for event in dagster_event_sequence_for_step(step_context):
            events.put(event)
        events.put(_Done(step_context.step.key))
    except BaseException:  # handed to the main thread, which raises it there
        events.put(_Done(step_context.step.key, sys.exc_info()))


def threaded_plan_iterator(
    job_context: PlanExecutionContext, execution_plan: ExecutionPlan, max_concurrent: int
) -> Iterator[DagsterEvent]:
    compute_log_manager = job_context.instance.compute_log_manager
    step_keys = [step.key for step in execution_plan.get_steps_to_execute_in_topo_order()]
    with ExitStack() as stack:
        concurrency = stack.enter_context(InstanceConcurrencyContext(job_context.instance, job_context.dagster_run))
        active_execution = stack.enter_context(
            execution_plan.start(
                retry_mode=job_context.retry_mode,
                sort_key_fn=epoch_first,
                instance_concurrency_context=concurrency,
                step_dependency_config=job_context.step_dependency_config,
            )
        )
        # the process's output is captured once for the whole run, as in-process
        log_key = compute_log_manager.build_log_key_for_run(job_context.run_id, create_compute_log_file_key())
        log_context = stack.enter_context(compute_log_manager.capture_logs(log_key))
        yield DagsterEvent.capture_logs(job_context, step_keys, log_key, log_context)

        events: queue.Queue = queue.Queue()
        running: dict[str, tuple[object, list[DagsterEvent]]] = {}
        order = EpochOrder()
        interrupted_at: float | None = None
        while running or (interrupted_at is None and not active_execution.is_complete):
            if interrupted_at is None and active_execution.check_for_interrupts():
                # Threads cannot be stopped: no new step starts, and the ones running get a grace
                # period (the process exits after the run; Epochal recovers what they left).
                interrupted_at = time.monotonic()
                active_execution.mark_interrupted()
                yield DagsterEvent.engine_event(
                    job_context,
                    f"interrupted: no new step starts; waiting up to {INTERRUPT_GRACE_S:.0f}s for {sorted(running)}",
                    EngineEventData.interrupted(sorted(running)),
                )
            if interrupted_at is not None and running and time.monotonic() - interrupted_at > INTERRUPT_GRACE_S:
                raise DagsterExecutionInterruptedError(
                    f"interrupted while steps {sorted(running)} were running; they did not end within "
                    f"{INTERRUPT_GRACE_S:.0f}s"
                )
            interrupted = interrupted_at is not None
            if not interrupted:
                order.take(active_execution.get_steps_to_execute())
                yield from active_execution.concurrency_event_iterator(job_context)
                for step in order.startable(max_concurrent - len(running)):
                    step_context = job_context.for_step(step, active_execution.get_known_state())
                    running[step.key] = (step_context, [])
                    threading.Thread(
                        target=_run_step, args=(step_context, events), name=f"step:{step.key}", daemon=True
                    ).start()
            if not running:
                if not active_execution.is_complete and not interrupted:
                    active_execution.sleep_til_ready()
                continue
            try:
                message = events.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if isinstance(message, DagsterEvent):
                if message.step_key in running:
                    running[message.step_key][1].append(message)
                yield message
                active_execution.handle_event(message)
                continue
            step_context, step_events = running.pop(message.step_key)
            order.ended(message.step_key)
            if message.exc_info is not None:
                raise message.exc_info[1].with_traceback(message.exc_info[2])
            active_execution.verify_complete(job_context, message.step_key)
            for event in active_execution.plan_events_iterator(job_context):  # skips after a failure
                step_events.append(event)
                if event.step_key is not None:
                    order.ended(event.step_key)  # a skipped step of an older epoch
                yield event
            yield from _trigger_hook(step_context, step_events)


class ThreadedExecutor(Executor):
    def __init__(self, retries: RetryMode, max_concurrent: int):
        self._retries = retries
        self.max_concurrent = max(1, max_concurrent)

    @property
    def retries(self) -> RetryMode:
        return self._retries

    def execute(self, plan_context: PlanOrchestrationContext, execution_plan: ExecutionPlan) -> Iterator[DagsterEvent]:
        step_keys = execution_plan.step_keys_to_execute
        yield DagsterEvent.engine_event(
            plan_context,
            f"Executing steps in process (pid: {os.getpid()}) on up to {self.max_concurrent} thread(s)",
            event_specific_data=EngineEventData.in_process(os.getpid(), step_keys),
        )

        def iterator(job_context: PlanExecutionContext, execution_plan: ExecutionPlan) -> Iterator[DagsterEvent]:
            return threaded_plan_iterator(job_context, execution_plan, self.max_concurrent)

        started = time.monotonic()
        materialized: list[Materialized] = []  # for the summary line the run ends with
        for event in iter(
            ExecuteRunWithPlanIterable(
                execution_plan=plan_context.execution_plan,
                iterator=iterator,
                execution_context_manager=PlanExecutionContextManager(
                    job=plan_context.job,
                    retry_mode=plan_context.retry_mode,
                    execution_plan=plan_context.execution_plan,
                    run_config=plan_context.run_config,
                    dagster_run=plan_context.dagster_run,
                    instance=plan_context.instance,
                    raise_on_error=plan_context.raise_on_error,
                    output_capture=plan_context.output_capture,
                ),
            )
        ):
            if event.is_step_materialization:
                done = event.step_materialization_data.materialization
                materialized.append((done.asset_key.to_user_string(), done.partition, plain_metadata(done.metadata)))
            yield event
        yield summary_event(plan_context, run_summary(materialized, time.monotonic() - started), step_keys)


def summary_event(plan_context: PlanOrchestrationContext, summary: str, step_keys: list[str]) -> DagsterEvent:
    """The run's closing line as an engine event logged at INFO: Dagster logs its own engine events at
    DEBUG, which the console's default threshold (EPOCHAL_LOG_LEVEL) hides."""
    event = DagsterEvent(
        event_type_value=DagsterEventType.ENGINE_EVENT.value,
        job_name=plan_context.job_name,
        message=summary,
        event_specific_data=EngineEventData.in_process(os.getpid(), step_keys),
        pid=os.getpid(),
    )
    plan_context.log.log_dagster_event(level=logging.INFO, msg=summary, dagster_event=event)
    return event


def retries_config() -> Field:
    """The ``retries`` config of Dagster's own executors (its private ``get_retries_config()``), in public terms."""
    return Field(
        Selector({"enabled": {}, "disabled": {}}),
        default_value={"enabled": {}},
        description="Whether retries are enabled or not. By default, retries are enabled.",
    )


def threaded_executor_def(default_threads: int):  # noqa: ANN201
    @executor(
        name="epochal_threads",
        config_schema={
            "retries": retries_config(),
            "max_concurrent": Field(
                Int,
                default_value=default_threads,
                is_required=False,
                description="Most steps running at once on threads of the run's process (EPOCHAL_STEP_THREADS).",
            ),
        },
    )
    def epochal_threads(init_context):  # noqa: ANN001, ANN202
        config = init_context.executor_config
        return ThreadedExecutor(RetryMode.from_config(config["retries"]), int(config["max_concurrent"]))

    return epochal_threads
