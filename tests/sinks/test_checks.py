"""Checks at the barrier (docs/checks.md): CREATE CHECK refused at load with the fix named; a failing
``error`` check holds its epoch back from the upsert sink downstream (status, metadata, the Dagster
asset check on the epoch partition say so) until a later epoch passes, which the sink then delivers
with the held one in ONE batch, so the target never shows the failing state; a release lets the
held epochs through; a run SIGKILLed in the held-then-released delivery leaves each row once."""

from __future__ import annotations

import argparse
import json
import signal
from collections import Counter
from pathlib import Path

import dagster as dg
import duckdb
import pytest

from epochal.checkpoint.sinks.batches import SinkBatchState
from epochal.errors import PipelineError
from epochal.pipeline.loader import load_pipeline
from tests.epochal_harness import make_harness

SOURCES = """
CREATE TABLE orders (id BIGINT PRIMARY KEY, customer STRING, amount BIGINT)
WITH (connector = 'log', path = 'data/orders', format = 'json');

CREATE MATERIALIZED VIEW spend AS
SELECT customer, sum(amount) AS total, count(*) AS n FROM orders GROUP BY customer;

CREATE SINK spend_out FROM spend
WITH (connector = 'duckdb', database = 'out/o.duckdb', table = 'spend', type = 'upsert', primary_key = 'customer');
"""
CHECKS = """
-- a customer's total is never negative: an error check holds spend_out
CREATE CHECK no_negative_total ON spend AS SELECT customer, total FROM spend WHERE total < 0;

CREATE CHECK huge_order ON orders WITH (severity = 'warn') AS SELECT * FROM orders WHERE amount > 1000;

-- find_in_set has no DuckDB counterpart: Spark runs this one
CREATE CHECK listed ON spend WITH (severity = 'warn') AS
SELECT spend.customer FROM spend WHERE find_in_set(customer, 'bob,zed') > 0;
"""


def _load(tmp_path: Path, checks: str) -> PipelineError:
    (tmp_path / "p").mkdir(exist_ok=True)
    (tmp_path / "p" / "a.sql").write_text(SOURCES)
    (tmp_path / "p" / "b.sql").write_text(checks)
    with pytest.raises(PipelineError) as error:
        load_pipeline(tmp_path / "p")
    return error.value


def test_bad_checks_are_refused_at_load_with_the_fix(tmp_path: Path) -> None:
    message = str(
        _load(
            tmp_path,
            """
CREATE CHECK a ON spnd AS SELECT * FROM spnd;
CREATE CHECK b ON spend WITH (severity = 'fatal') AS SELECT * FROM spend;
CREATE CHECK c ON spend AS SELECT * FROM spend JOIN orders ON spend.customer = orders.customer;
CREATE CHECK d ON spend AS SELECT customer FROM spend WHERE totl < 0;
CREATE CHECK e ON spend AS SELECT * FROM spend WHERE;
CREATE CHECK f spend AS SELECT 1;
CREATE CHECK g ON spend AS SELECT * FROM spend;
CREATE CHECK g ON orders AS SELECT * FROM orders;
CREATE CHECK h ON spend WITH (colour = 'red') AS SELECT * FROM spend;
""",
        )
    )
    b = "b.sql"
    assert f"{b}:2: check a: ON 'spnd' is not a table, source or materialized view: did you mean 'spend'?" in message
    assert f"{b}:3: check b: severity = 'fatal' is not a severity: use 'error'" in message
    assert f"{b}:4: check c: the query reads orders, but a check reads only its own table (spend)" in message
    assert f"{b}:5: check d:" in message and "totl" in message
    assert f"{b}:6: check e: syntax error in the query" in message
    assert f"{b}:7: syntax error in CREATE CHECK: expected ON and the table the check reads" in message
    assert f"{b}:9: check g: a check of that name is already defined at" in message
    assert f"{b}:10: check h: unknown option 'colour'" in message
    # a good one loads, with its severity, beside the pipeline (its own namespace: a check may share a name)
    (tmp_path / "p" / "b.sql").write_text(CHECKS + "CREATE CHECK spend ON spend AS SELECT * FROM spend WHERE n < 1;")
    pipeline = load_pipeline(tmp_path / "p")
    assert {c.name: (c.table, c.severity) for c in pipeline.checks.values()} == {
        "spend__row_count": ("spend", "error"),  # built in: a GROUP BY has at most its input's rows
        "no_negative_total": ("spend", "error"),
        "huge_order": ("orders", "warn"),
        "listed": ("spend", "warn"),
        "spend": ("spend", "error"),
    }
    assert [c.name for c in pipeline.checks_holding("spend_out")] == ["spend__row_count", "no_negative_total", "spend"]


@pytest.mark.parametrize(
    ("query", "relation"),
    [
        ("SELECT id, amount * 2 AS double_amount FROM orders", "equal"),
        ("SELECT id, row_number() OVER (PARTITION BY customer ORDER BY id) AS k FROM orders", "equal"),
        ("SELECT id FROM orders WHERE amount > 0", None),  # a filter proves no count
        ("SELECT DISTINCT customer FROM orders", None),
        ("SELECT explode(array(id, amount)) AS v FROM orders", None),
        ("SELECT count(*) AS n FROM orders", None),  # a global aggregate: one row of any input
        ("SELECT customer, count(*) AS n FROM orders GROUP BY customer", "at_most_some"),
        ("SELECT customer, count(*) AS n FROM orders WHERE amount > 0 GROUP BY customer", "at_most"),
        ("SELECT customer, count(*) AS n FROM orders GROUP BY customer HAVING count(*) > 1", "at_most"),
        ("SELECT customer, count(*) AS n FROM orders GROUP BY ROLLUP (customer)", None),
        ("SELECT customer, count(*) AS n FROM orders GROUP BY customer WITH CUBE", None),
        ("SELECT window.start AS s, count(*) AS n FROM orders GROUP BY window(ts, '10 seconds', '5 seconds')", None),
        ("SELECT id FROM orders LIMIT 3", None),
        ("SELECT o.id FROM orders o JOIN orders p ON o.id = p.id", None),
    ],
)
def test_a_views_row_count_is_checked_only_where_its_query_proves_it(query: str, relation: str | None) -> None:
    from epochal.pipeline.builtin_checks import row_count_check
    from epochal.pipeline.model import Location, ViewDef

    view = ViewDef("v", query, ("orders",), ("x",), {}, Location("v.sql", 1))
    check = row_count_check(view, {"orders", "v"})
    assert (check.row_count if check else None) == relation
    assert row_count_check(view, {"v"}) is None  # an input that stores nothing is not read for a count


def _order(i: int, customer: str, amount: int) -> str:
    return json.dumps({"id": i, "customer": customer, "amount": amount})


def _target(h, table: str = "spend") -> Counter:  # noqa: ANN001
    with duckdb.connect(str(h.home / "out" / "o.duckdb"), read_only=True) as con:
        if not con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = ?", [table]).fetchone()[0]:
            return Counter()
        return Counter(con.execute(f"SELECT customer, total, n FROM {table}").fetchall())


def _batches(runtime, sink: str = "spend_out") -> list[tuple[int, int]]:  # noqa: ANN001
    return [
        (b.id.first_epoch, b.id.last_epoch)
        for b in runtime.controller.sink_coordinator.batches(sink)
        if b.state is SinkBatchState.COMMITTED
    ]


def test_a_failing_error_check_holds_the_sink_until_an_epoch_passes_or_it_is_released(spark, tmp_path: Path) -> None:
    from epochal.cli.checks_cmd import cmd_checks
    from epochal.cli.status_view import status_lines, with_epoch_times

    h = make_harness(tmp_path, {"a.sql": SOURCES, "b.sql": CHECKS})
    instance = dg.DagsterInstance.ephemeral()

    def run() -> int:
        result = h.run_in_process(instance)
        assert result.success, [e.message for e in result.all_events if e.is_failure]
        return h.runtime(spark).controller.committed_epoch()

    h.produce([_order(1, "ann", 10), _order(2, "bob", 5)])
    e1 = run()
    assert _target(h) == Counter({("ann", 10, 1): 1, ("bob", 5, 1): 1})

    h.produce([_order(3, "ann", -50), _order(4, "bob", 2000)])  # ann's total -40: fails; 2000 only warns
    e2 = run()
    runtime = h.runtime(spark)
    assert runtime.controller.sink_coordinator.delivered_epoch("spend_out") == e1
    assert _target(h) == Counter({("ann", 10, 1): 1, ("bob", 5, 1): 1})  # still epoch 1's state
    status = with_epoch_times({**runtime.controller.status(), "sources_storing_nothing": [], "dead_letters": {}})
    assert status["sinks"]["spend_out"]["held_by_check"] == {"check": "no_negative_total", "epoch": e2}
    assert f"held by check no_negative_total (failed at epoch {e2})" in "\n".join(status_lines(status))
    sink_meta = instance.fetch_materializations(dg.AssetKey("spend_out"), limit=1).records[0]
    assert "held by check no_negative_total" in sink_meta.asset_materialization.metadata["held_by_check"].value
    # the asset checks on the epoch partitions: the error failed with its offending row, the warn failed too
    evaluations = {
        (e.check_name, e.partition): e
        for entry in instance.all_logs(_last_run(instance))
        if entry.dagster_event is not None and entry.dagster_event.event_type_value == "ASSET_CHECK_EVALUATION"
        for e in [entry.dagster_event.event_specific_data]
    }
    failed = evaluations[("no_negative_total", str(e2))]
    assert not failed.passed and failed.metadata["failed_rows"].value == 1
    assert failed.metadata["sample"].value == [{"customer": "ann", "total": -40}]
    assert not evaluations[("huge_order", str(e2))].passed
    assert evaluations[("spend__row_count", str(e2))].passed  # the built-in check: 2 customers <= 4 orders
    assert evaluations[("huge_order", str(e2))].severity == dg.AssetCheckSeverity.WARN
    listed = evaluations[("listed", str(e2))]  # DuckDB could not run it, Spark did
    assert not listed.passed and listed.metadata["sample"].value == [{"customer": "bob"}]

    h.produce([_order(3, "ann", 50)])  # ann 60: passes
    e3 = run()
    runtime = h.runtime(spark)
    assert runtime.controller.sink_coordinator.delivered_epoch("spend_out") == e3
    assert _batches(runtime) == [(e1, e1), (e2, e3)]  # 2 and 3 in one transaction: 2 was never shown
    expected = Counter({("ann", 60, 2): 1, ("bob", 2005, 2): 1})
    assert _target(h) == expected
    assert runtime.controller.status()["sinks"]["spend_out"]["held_by_check"] is None

    h.produce([_order(5, "cat", -1)])
    e4 = run()
    assert _target(h) == expected  # held again
    runtime = h.runtime(spark)
    args = argparse.Namespace(action="release", name="no_negative_total", json=True)
    assert cmd_checks(args, runtime) == 0
    assert [r.epoch for r in runtime.controller.check_results("no_negative_total") if r.released_at] == [e2, e4]
    report = runtime.run_sink(e4, "spend_out")
    assert report.metadata["delivered_epoch"] == e4 and report.metadata.get("held_by_check") is None
    assert _target(h) == expected + Counter({("cat", -1, 1): 1})
    assert _batches(runtime)[-1] == (e4, e4)
    assert runtime.run_sink(e4, "spend_out").metadata["epochs_delivered"] == 0  # exactly once
    released = _target(h)

    # A sink added while the check fails: its snapshot batch would show a failing state, so it
    # waits too, and starts at the first epoch that passes.
    h.produce([_order(6, "dan", -2)])
    e5 = run()  # fails (dan): the snapshot the new sink would start from
    (h.pipeline_dir / "c.sql").write_text(
        "CREATE SINK spend_new FROM spend WITH (connector = 'duckdb', database = 'out/o.duckdb', "
        "table = 'spend_new', type = 'upsert', primary_key = 'customer');\n"
    )
    h.produce([_order(7, "eve", 1)])
    e6 = run()  # still fails (dan)
    runtime = h.runtime(spark)
    assert runtime.controller.sink_coordinator.delivered_epoch("spend_new") is None
    assert _target(h, "spend_new") == Counter()
    assert runtime.controller.status()["sinks"]["spend_new"]["held_by_check"]["check"] == "no_negative_total"
    h.produce([_order(6, "dan", 2), _order(5, "cat", 1)])  # (cat's -1 was released, not fixed)
    e7 = run()  # passes
    runtime = h.runtime(spark)
    assert _batches(runtime, "spend_new") == [(0, e7)]  # one snapshot batch, at the epoch that passed
    fixed = released - Counter({("cat", -1, 1): 1}) + Counter({("cat", 1, 1): 1, ("dan", 2, 1): 1, ("eve", 1, 1): 1})
    assert _target(h, "spend_new") == _target(h) == fixed
    assert e5 < e6 < e7


def _last_run(instance: dg.DagsterInstance) -> str:
    return instance.get_runs(limit=1)[0].run_id


@pytest.mark.slow
def test_a_run_killed_in_the_held_delivery_delivers_it_once(spark, tmp_path: Path) -> None:
    h = make_harness(tmp_path, {"a.sql": SOURCES, "b.sql": CHECKS})
    instance = dg.DagsterInstance.ephemeral()
    h.produce([_order(1, "ann", 10)])
    assert h.run_in_process(instance).success
    h.produce([_order(2, "ann", -50)])
    assert h.run_in_process(instance).success  # held
    e2 = h.runtime(spark).controller.committed_epoch()

    h.produce([_order(2, "ann", 5), _order(3, "bob", 7)])
    crashed = h.run_subprocess(fault="sink-pending")  # the released batch recorded, not yet committed
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout[-2000:] + crashed.stderr[-2000:]
    recovered = h.run_in_process(instance)
    assert recovered.success, [e.message for e in recovered.all_events if e.is_failure]
    runtime = h.runtime(spark)
    batches = _batches(runtime)
    # the epoch after the held one passed: the killed run's batch (held epoch and it) committed once
    assert batches[1][0] == e2 and batches[1][1] > e2, batches
    assert _target(h) == Counter({("ann", 15, 2): 1, ("bob", 7, 1): 1})
    assert runtime.controller.sink_coordinator.delivered_epoch("spend_out") == runtime.controller.committed_epoch()
    batches = runtime.controller.sink_coordinator.batches("spend_out")
    assert not [b for b in batches if b.state is SinkBatchState.PENDING]
