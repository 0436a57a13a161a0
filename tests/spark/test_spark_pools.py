"""Backfills run in a FAIR pool of their own that gets only the Spark slots live work leaves
(epochal/spark/fairscheduler.xml, epochal.spark.session.scheduler_pool): a live epoch submitted while a
backfill keeps every slot busy waits for the backfill tasks then running, not for all its tasks.
"""

from __future__ import annotations

import threading
import time

from epochal.spark.session import BACKFILL_POOL, scheduler_pool

#: seconds each backfill task sleeps; 8 of them on the test session's 2 slots take 4 of these
TASK_S = 1.5


def _pool_of_tasks(spark, partitions: int, sleep_s: float) -> list[str | None]:  # noqa: ANN001
    """Runs one job of ``partitions`` tasks, each sleeping ``sleep_s``; each task's pool."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    def pool(_: int) -> str | None:
        from pyspark import TaskContext

        time.sleep(sleep_s)
        return TaskContext.get().getLocalProperty("spark.scheduler.pool")

    udf = F.udf(lambda value: pool(value), StringType())  # (no type hints for Spark to read)
    rows = spark.range(0, partitions, 1, partitions).select(udf("id").alias("pool")).collect()
    return [r.pool for r in rows]


def assert_live_waits_only_for_running_backfill_tasks(backfill_spark, live_spark) -> None:  # noqa: ANN001
    """A backfill job of 8 tasks keeps the 2 slots busy; a live job submitted meanwhile runs as soon
    as the 2 tasks then running finish, and each job's tasks ran in its own pool. The sessions may be
    one (threads of one process) or two (runs attached to one Spark Connect server)."""
    _pool_of_tasks(backfill_spark, 2, 0.0)  # Python workers started before anything is timed
    _pool_of_tasks(live_spark, 2, 0.0)
    finished: dict[str, float] = {}
    pools: dict[str, list[str | None]] = {}

    def backfill() -> None:
        with scheduler_pool(backfill_spark, BACKFILL_POOL):
            pools["backfill"] = _pool_of_tasks(backfill_spark, 8, TASK_S)
        finished["backfill"] = time.monotonic()

    started = time.monotonic()
    worker = threading.Thread(target=backfill)
    worker.start()
    time.sleep(TASK_S / 3)  # the backfill holds both slots and has six tasks waiting
    pools["live"] = _pool_of_tasks(live_spark, 2, 0.0)
    finished["live"] = time.monotonic()
    worker.join()

    assert set(pools["backfill"]) == {BACKFILL_POOL}, pools
    assert set(pools["live"]) == {None}, pools
    # FIFO would have run the live job after all eight backfill tasks (4 x TASK_S); it waited only
    # for the two running when it came.
    live_s, backfill_s = finished["live"] - started, finished["backfill"] - started
    assert backfill_s >= 4 * TASK_S, finished
    assert live_s < 2.5 * TASK_S, f"the live job took {live_s:.1f} s, the backfill {backfill_s:.1f} s"
    # Out of the block, the backfill's session (or thread) is back in the default pool.
    assert set(_pool_of_tasks(backfill_spark, 2, 0.0)) == {None}


def test_live_jobs_take_free_slots_before_a_backfills_waiting_tasks(spark) -> None:  # noqa: ANN001
    # Threads of one process sharing one session, as a backfill and live epochs in one Python: the
    # pool is the thread's.
    assert_live_waits_only_for_running_backfill_tasks(spark, spark)
