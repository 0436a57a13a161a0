"""A record whose values make a view's SQL fail (a division by zero, a malformed cast, an overflow).

Spark raises such errors for every epoch that reads the record, so before this the pipeline stood
for good, and editing the view to tolerate the record did not help: a changed view's old statement
kept being maintained while the new one backfilled, and failed on the same record. Now the failure
names the view, the expression and the fix, the edit unsticks the pipeline (the old rows freeze
until the switch), a backfill that fails on data leaves live epochs alone, and a sink whose target
refuses a value fails at once with the fix instead of retrying the same rows."""

from __future__ import annotations

import json
import time
from pathlib import Path

import dagster as dg
import pytest

from epochal.backfill.runner import BackfillRunner
from epochal.runtime.data_errors import DataFailure, ViewDataError, data_failure
from tests.consistency import Oracle, assert_sink_exactly_once, assert_source_exact
from tests.epochal_harness import make_harness, run_epoch
from tests.sinks.test_postgres_sink import database, sql_rows  # noqa: F401 - the fixture

SOURCES = """
CREATE TABLE orders (id BIGINT PRIMARY KEY, a BIGINT, b BIGINT, s STRING)
WITH (connector = 'log', path = 'data/orders', format = 'json');
"""


def order(i: int, a: int, b: int, s: str = "x", op: str | None = None) -> str:
    return json.dumps({"id": i, "_op": op} if op == "delete" else {"id": i, "a": a, "b": b, "s": s})


def views_sql(views: dict[str, str]) -> str:
    return "\n".join(f"CREATE MATERIALIZED VIEW {name} AS {query};" for name, query in views.items())


def failures(result: dg.ExecuteInProcessResult) -> list[str]:
    found = []
    for event in result.all_events:
        if event.is_step_failure:
            error = event.event_specific_data.error  # type: ignore[union-attr]
            found.append(error.cause.message if error.cause else error.message)
    return found


def test_spark_data_exceptions_are_told_from_other_failures(spark) -> None:
    def raised(query: str) -> BaseException:
        try:
            spark.sql(query).collect()
        except Exception as error:  # noqa: BLE001 - what Spark raises is the subject
            return error
        raise AssertionError(f"{query} did not fail")

    cases = {
        "SELECT a / b FROM VALUES (1, 0) AS t(a, b)": "DIVIDE_BY_ZERO",
        "SELECT CAST(s AS INT) FROM VALUES ('abc') AS t(s)": "CAST_INVALID_INPUT",
        "SELECT a * 10 FROM VALUES (9223372036854775807L) AS t(a)": "ARITHMETIC_OVERFLOW",
        "SELECT raise_error('bad row') FROM VALUES (1) AS t(a)": "USER_RAISED_EXCEPTION",
    }
    assert data_failure(RuntimeError("plain")) is None
    for query, condition in cases.items():
        error = raised(query)
        failure = data_failure(error)
        assert failure is not None and failure.condition == condition, (query, error)
        # ...also when another error wraps it, as a step's does
        try:
            raise RuntimeError("step failed") from error
        except RuntimeError as outer:
            assert data_failure(outer) == failure
    assert data_failure(raised("SELECT * FROM no_such_table")) is None  # the query's, not a record's

    # The fragment shown is the user's text; an internal stage's SQL (the planner's) is not shown,
    # and an overflow names the aggregate's tolerant forms too.
    mine = ViewDataError("v", 7, DataFailure("DIVIDE_BY_ZERO", "[DIVIDE_BY_ZERO] Division by zero.", "a / b"),
                         "SELECT id, a/b AS r FROM orders")
    assert "fail in `a / b`" in str(mine) and "edit v" in str(mine) and "epoch 7" in str(mine)
    planner = ViewDataError("w", 7, DataFailure("ARITHMETIC_OVERFLOW", "[ARITHMETIC_OVERFLOW] overflow.", "cast"),
                            "SELECT s, sum(a) AS t FROM orders GROUP BY s")
    assert "`cast`" not in str(planner) and "try_sum(x)" in str(planner)
    backfill = ViewDataError("x", None, DataFailure("DIVIDE_BY_ZERO", "[DIVIDE_BY_ZERO] Division by zero.", None))
    assert "cannot be backfilled" in str(backfill) and "Live epochs go on" in str(backfill)


@pytest.mark.slow
def test_a_record_a_view_cannot_compute_stops_epochs_until_the_view_is_edited(spark, tmp_path: Path) -> None:
    views = {
        "ratios": "SELECT id, a / b AS r FROM orders",
        "ratio_totals": "SELECT count(*) AS n, sum(r) AS total FROM ratios",
        "by_s": "SELECT s, sum(a) AS t, count(*) AS n FROM orders GROUP BY s",
    }
    h = make_harness(tmp_path, {
        "sources.sql": SOURCES,
        "views.sql": views_sql(views),
        "sinks.sql": "CREATE SINK ratios_out FROM ratios WITH (connector = 'duckdb', database = 'out/sink.duckdb', "
        "table = 'ratios', type = 'upsert', primary_key = 'id');",
    })
    h.produce([order(1, 4, 2), order(2, 40, 8, "y")])
    runtime = h.runtime(spark)
    good = run_epoch(runtime)
    frozen_rows = sorted(map(tuple, runtime.state("ratios").collect()))
    instance = dg.DagsterInstance.ephemeral()

    # A record dividing by zero: the epoch fails naming the view, the expression and the fix, and
    # nothing of it commits; the next epoch reads the same record and fails the same way.
    h.produce([order(3, 5, 0)])
    for _ in range(2):
        result = h.run_in_process(instance)
        assert not result.success
        (message,) = failures(result)
        assert message.startswith(
            "epochal.runtime.data_errors.ViewDataError: view ratios cannot compute epoch"
        ), message
        assert "`a / b`" in message and "DIVIDE_BY_ZERO" in message and "try_divide" in message
        assert "edit ratios" in message
        assert runtime.controller.epoch_log.committed_epoch() == good
    assert_source_exact(runtime, "orders")  # the committed source holds records 1 and 2 only

    # The barrier sensor does not start a failing run every barrier interval: it skips, saying why.
    def sensor_tick() -> dg.SkipReason | dg.SensorResult:
        defs = h.definitions()  # the files as they are now, as a reloaded code location reads them
        with dg.build_sensor_context(instance=instance, resources=defs.resources) as context:
            return defs.get_sensor_def("barrier_sensor")(context)

    skipped = sensor_tick()
    assert isinstance(skipped, dg.SkipReason), skipped
    assert "no epoch is injected: view ratios cannot compute the records of epoch" in skipped.skip_message
    assert "DIVIDE_BY_ZERO" in skipped.skip_message and "Edit ratios" in skipped.skip_message

    # The edit that tolerates the record: epochs go on at once, the old rows frozen at the last
    # committed epoch (the old statement cannot compute the next), the other views maintained.
    views["ratios"] = "SELECT id, try_divide(a, b) AS r FROM orders"
    (h.pipeline_dir / "views.sql").write_text(views_sql(views))
    injected = sensor_tick()  # the edited statement: the sensor injects again
    assert isinstance(injected, dg.SensorResult) and injected.run_requests, injected
    for _ in range(2):
        result = h.run_in_process(instance)
        assert result.success, failures(result)
    runtime = h.runtime(spark)
    rebuild = runtime.controller.status()["backfills"]["ratios"]["rebuild"]
    assert rebuild["old_rows"] == "frozen" and rebuild["frozen_epoch"] == good
    assert sorted(map(tuple, runtime.state("ratios").collect())) == frozen_rows
    oracle = Oracle(runtime)
    assert oracle.assert_view("by_s", views["by_s"]) == 2  # x (records 1, 3) and y
    assert runtime.controller.epoch_log.committed_epoch() > good

    # The new statement backfills, switches, and then every view is its SQL over the sources.
    BackfillRunner(runtime).advance(budget_s=300)
    h.produce([order(4, 9, 3, "y"), order(1, 0, 0, op="delete"), order(2, 7, 0, "y")])
    for _ in range(2):
        result = h.run_in_process(instance)
        assert result.success, failures(result)
    runtime = h.runtime(spark)
    assert "ratios" not in runtime.controller.status()["backfills"]
    oracle = Oracle(runtime)
    for name, query in views.items():
        assert oracle.assert_view(name, query) >= 1, name
    assert {row.id: row.r for row in runtime.state("ratios").collect()} == {2: None, 3: None, 4: 3.0}
    assert assert_sink_exactly_once(runtime, "ratios_out") == 3

    # A new view whose backfill fails on a record: the backfill says so, live epochs go on.
    views["s_numbers"] = "SELECT id, CAST(s AS INT) AS n FROM orders"
    (h.pipeline_dir / "views.sql").write_text(views_sql(views))
    assert h.run_in_process(instance).success
    runtime = h.runtime(spark)
    refused = r"view s_numbers cannot be backfilled: .*`CAST\(s AS INT\)`.*CAST_INVALID_INPUT"
    with pytest.raises(ViewDataError, match=refused):
        BackfillRunner(runtime).advance(budget_s=300)
    assert "s_numbers cannot be backfilled" in runtime.controller.status()["backfills"]["s_numbers"]["error"]
    result = h.run_in_process(instance)
    assert result.success, failures(result)


@pytest.mark.slow
@pytest.mark.parametrize("writer", ["driver", "spark tasks"])
def test_a_value_the_sink_target_refuses_fails_the_sink_at_once_with_the_fix(
    spark, tmp_path: Path, database, writer: str, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001, F811
) -> None:
    if writer == "spark tasks":  # the error comes back from a Python worker as text, its kind with it
        monkeypatch.setenv("EPOCHAL_SINK_DRIVER_ROWS", "0")
    h = make_harness(tmp_path, {
        "sources.sql": SOURCES,
        "views.sql": "CREATE MATERIALIZED VIEW texts AS SELECT id, s FROM orders;",
        "sinks.sql": f"CREATE SINK texts_pg FROM texts WITH (connector = 'postgres', host = '127.0.0.1', "
        f"user = 'postgres', database = '{database}', table = 'texts', type = 'upsert', primary_key = 'id');",
    })
    h.produce([order(1, 1, 1, "fine"), order(2, 1, 1, "nul\u0000inside")])
    instance = dg.DagsterInstance.ephemeral()
    started = time.monotonic()
    result = h.run_in_process(instance)
    took = time.monotonic() - started
    runtime = h.runtime(spark)
    assert not result.success
    (message,) = failures(result)
    assert "PostgreSQL text cannot hold the NUL character" in message and "replace(col, char(0), '')" in message
    assert runtime.controller.epoch_log.committed_epoch() is not None  # the epoch committed; the sink lags
    assert sql_rows(database, "SELECT id FROM texts") == []  # nothing of the batch is visible
    # Not retried for sink_retry_s (the same rows fail the same way): one attempt, then the failure.
    assert took < runtime.settings.sink_retry_s, took
    if writer == "spark tasks":
        return

    # The view strips it, and once the view has switched to the new statement, the sink under a
    # new name starts from the view's rows (the epoch committed with the value stays undeliverable
    # to this target under the old name, as the message says).
    (h.pipeline_dir / "views.sql").write_text(
        "CREATE MATERIALIZED VIEW texts AS SELECT id, replace(s, char(0), '') AS s FROM orders;"
    )
    for _ in range(5):  # (each run's sink step fails on the old epoch; the epochs commit)
        h.run_in_process(instance)
        if "texts" not in h.runtime(spark).controller.status()["backfills"]:
            break
        BackfillRunner(h.runtime(spark)).advance(budget_s=300)
    assert "texts" not in h.runtime(spark).controller.status()["backfills"]
    sinks = h.pipeline_dir / "sinks.sql"
    sinks.write_text(sinks.read_text().replace("texts_pg", "texts_clean"))
    h.produce([order(3, 1, 1, "more")])
    result = h.run_in_process(instance)
    assert result.success, failures(result)
    assert sorted(sql_rows(database, "SELECT id, s FROM texts")) == [(1, "fine"), (2, "nulinside"), (3, "more")]


@pytest.mark.slow
@pytest.mark.parametrize("writer", ["driver", "spark tasks"])
def test_an_append_only_sink_given_an_update_fails_at_once_on_every_target_with_the_fix(
    spark, tmp_path: Path, database, writer: str, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001, F811
) -> None:
    """An append-only sink cannot take a retraction: the batch fails the same way however often it
    is sent, so it is a SinkDataError, not retried for sink_retry_s (every target retried it, up
    to 11 attempts over ~30 s, before the run failed). Nothing of the batch is visible."""
    if writer == "spark tasks":  # Python writer tasks, and Delta's native Spark write (raise_error)
        monkeypatch.setenv("EPOCHAL_SINK_DRIVER_ROWS", "0")
    targets = {
        "to_duckdb": "connector = 'duckdb', database = 'out/s.duckdb', table = 'texts'",
        "to_pg": f"connector = 'postgres', host = '127.0.0.1', user = 'postgres', database = '{database}', "
        "table = 'texts'",
        "to_delta": "connector = 'deltalake', location = 'lake/texts'",
        "to_iceberg": "connector = 'iceberg', namespace = 'app', table = 'texts'",
    }
    h = make_harness(tmp_path, {
        "sources.sql": SOURCES,
        "views.sql": "CREATE MATERIALIZED VIEW texts AS SELECT id, s FROM orders;",
        "sinks.sql": "".join(
            f"CREATE SINK {name} FROM texts WITH ({to}, type = 'append-only');\n" for name, to in targets.items()
        ),
    })
    instance = dg.DagsterInstance.ephemeral()
    h.produce([order(1, 1, 1, "first"), order(2, 1, 1, "second")])
    assert h.run_in_process(instance).success
    h.produce([order(1, 1, 1, "changed")])  # an update: the view retracts its old row
    started = time.monotonic()
    result = h.run_in_process(instance)
    took = time.monotonic() - started
    runtime = h.runtime(spark)
    assert not result.success
    messages = failures(result)
    assert len(messages) == len(targets), messages
    for message in messages:
        assert "is append-only but its upstream deleted or updated" in message, message
        assert "use type = 'upsert' with a primary_key" in message, message
    assert took < runtime.settings.sink_retry_s, took
    assert sql_rows(database, "SELECT id, s FROM texts ORDER BY id") == [(1, "first"), (2, "second")]
