"""A sink moved to another target under the same name: its progress belongs to the old target, so
delivering on would leave the new one without every epoch before. Refused with the fixes, end to
end on a DuckDB target, and the check's rules alone on the embedded meta store."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from epochal.checkpoint.controller.core import ensure_schema
from epochal.checkpoint.statements.sinks import (
    SinkDeclaration,
    SinkTargetChanged,
    StaleSinkDeclaration,
    changes,
    check_sink,
)
from epochal.meta.backend import open_backend
from epochal.runtime.sink_step import sink_declaration
from tests.epochal_harness import make_harness
from tests.storage.test_compaction import run_epoch

SOURCE_AND_VIEW = """
CREATE SOURCE orders (id BIGINT, customer STRING, amount BIGINT)
WITH (connector = 'log', path = 'data/orders', format = 'json');

CREATE MATERIALIZED VIEW totals AS
SELECT customer, sum(amount) AS total, count(*) AS n FROM orders GROUP BY customer;
"""


def sink_sql(name: str, table: str) -> str:
    return (
        f"CREATE SINK {name} FROM totals WITH (connector = 'duckdb', database = 'out/sinks.duckdb', "
        f"table = '{table}', type = 'upsert', primary_key = 'customer');"
    )


def expected(produced: list[dict]) -> list[tuple]:
    """The view's rows, computed here from the records."""
    totals: dict[str, list[int]] = {}
    for r in produced:
        t = totals.setdefault(r["customer"], [0, 0])
        t[0] += r["amount"]
        t[1] += 1
    return sorted((c, t, n) for c, (t, n) in totals.items())


def target_rows(home: Path, table: str) -> list[tuple] | None:
    with duckdb.connect(str(home / "out" / "sinks.duckdb"), read_only=True) as con:
        tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        if table not in tables:
            return None
        return sorted(con.execute(f"SELECT customer, total, n FROM {table}").fetchall())


def test_a_sink_moved_to_another_table_is_refused_until_renamed_or_put_back(spark, tmp_path: Path) -> None:  # noqa: ANN001
    h = make_harness(tmp_path, {"p.sql": SOURCE_AND_VIEW + sink_sql("totals_out", "totals")})
    produced: list[dict] = []

    def epoch(runtime, i: int) -> int:  # noqa: ANN001
        batch = [{"id": 10 * i + j, "customer": f"c{(i + j) % 3}", "amount": i + j} for j in range(4)]
        produced.extend(batch)
        h.produce([json.dumps(r) for r in batch])
        return run_epoch(runtime, sinks=False)

    runtime = h.runtime(spark)
    for i in range(2):
        runtime.run_sink(epoch(runtime, i), "totals_out")
    assert target_rows(h.home, "totals") == expected(produced)
    delivered = runtime.controller.sink_coordinator.delivered_epoch("totals_out")

    # The user points the sink at another table and keeps its name.
    (h.pipeline_dir / "p.sql").write_text(SOURCE_AND_VIEW + sink_sql("totals_out", "totals_v2"))
    runtime = h.runtime(spark)
    e = epoch(runtime, 2)  # the epoch commits: a sink never holds epochs back
    with pytest.raises(SinkTargetChanged) as refused:
        runtime.run_sink(e, "totals_out")
    message = str(refused.value)
    assert "sink totals_out: its table was 'totals' and is now 'totals_v2'" in message, message
    assert "give the sink a new name" in message and "put the old declaration back" in message, message
    assert runtime.controller.epoch_log.committed_epoch() == e
    assert runtime.controller.sink_coordinator.delivered_epoch("totals_out") == delivered  # nothing delivered
    assert target_rows(h.home, "totals_v2") is None  # nor created
    assert target_rows(h.home, "totals") == expected(produced[:8])
    shown = runtime.controller.status()["sinks"]["totals_out"]  # what `epochal status` prints
    assert shown["lag_epochs"] == 1 and "its table was 'totals'" in shown["last_error"], shown

    # Put back, it catches up on the old table; renamed, the new sink starts from a snapshot.
    (h.pipeline_dir / "p.sql").write_text(SOURCE_AND_VIEW + sink_sql("totals_out", "totals"))
    runtime = h.runtime(spark)
    runtime.run_sink(e, "totals_out")
    assert target_rows(h.home, "totals") == expected(produced)
    assert runtime.controller.status()["sinks"]["totals_out"]["last_error"] is None
    (h.pipeline_dir / "p.sql").write_text(SOURCE_AND_VIEW + sink_sql("totals_v2_out", "totals_v2"))
    runtime = h.runtime(spark)
    runtime.run_sink(epoch(runtime, 3), "totals_v2_out")
    assert target_rows(h.home, "totals_v2") == expected(produced)
    assert target_rows(h.home, "totals") == expected(produced[:12])  # the removed sink's target keeps its rows

    # Its progress went with it. Once compaction dropped the change files it had started from, the
    # name added back is a new sink: one snapshot of the view, then the epochs after it.
    report = runtime.compact(every=1)
    assert report.metadata["failures"] == "none", report.metadata
    both = sink_sql("totals_v2_out", "totals_v2") + sink_sql("totals_out", "totals")
    (h.pipeline_dir / "p.sql").write_text(SOURCE_AND_VIEW + both)
    runtime = h.runtime(spark)
    e = epoch(runtime, 4)
    runtime.run_sink(e, "totals_out")
    runtime.run_sink(e, "totals_v2_out")
    assert target_rows(h.home, "totals") == expected(produced) == target_rows(h.home, "totals_v2")
    coordinator = runtime.controller.sink_coordinator
    assert coordinator.delivered_epoch("totals_out") == e
    assert [b.id.snapshot for b in coordinator.batches("totals_out")] == [True, False]  # the snapshot, then e


def declared(options: dict[str, str], from_table: str = "totals", connector: str = "postgres") -> SinkDeclaration:
    return SinkDeclaration.from_json(sink_declaration(from_table, connector, options))


PG = {"connector": "postgres", "host": "db", "table": "t", "type": "upsert", "primary_key": "customer"}


def test_what_counts_as_another_target() -> None:
    same = declared(PG)
    # defaults written out, other spacing and case of the key: the same target
    assert changes(same, declared({**PG, "port": "5432", "schema": "public", "primary_key": " Customer "})) == []
    # options that only tune delivery are not part of it
    assert changes(same, declared({**PG, "writers": "4", "password": "x", "snapshot": "false"})) == []
    assert changes(same, declared({**PG, "schema": "raw"})) == ["its schema was 'public' and is now 'raw'"]
    assert changes(same, declared(PG, from_table="orders")) == ["it read totals and now reads orders"]
    assert changes(same, declared({**PG, "type": "append-only"})) == [
        "its type was 'upsert' and is now 'append-only'"
    ]
    assert changes(same, declared({**PG, "primary_key": "customer, day"})) == [
        "its primary_key was 'customer' and is now 'customer, day'"
    ]
    lake = {"connector": "deltalake", "location": "out/delta/t", "type": "upsert", "primary_key": "customer"}
    delta = declared(lake, connector="deltalake")
    assert changes(delta, declared({**lake, "location": "./out/delta//t"}, connector="deltalake")) == []
    assert changes(same, delta) == ["its connector was 'postgres' and is now 'deltalake'"]


def test_a_declaration_is_recorded_until_the_sink_delivers_then_kept(tmp_path: Path) -> None:
    backend = open_backend(f"duckdb:///{tmp_path / 'meta.duckdb'}")
    backend.transaction(ensure_schema)
    old, new = sink_declaration("totals", "postgres", PG), sink_declaration("totals", "postgres", {**PG, "table": "u"})
    backend.transaction(lambda cur: check_sink(cur, "s", old, None, started=False))
    # not delivered yet: the new target is taken
    backend.transaction(lambda cur: check_sink(cur, "s", new, None, started=False))
    backend.transaction(lambda cur: check_sink(cur, "s", new, None, started=True))
    with pytest.raises(SinkTargetChanged, match="its table was 'u' and is now 't'"):
        backend.transaction(lambda cur: check_sink(cur, "s", old, None, started=True))
    # a process that read its files before the newer declaration was recorded delivers nothing
    with pytest.raises(StaleSinkDeclaration, match="changed after this process read its SQL files"):
        backend.transaction(lambda cur: check_sink(cur, "s", old, 0.0, started=False))
    recorded = backend.transaction(
        lambda cur: cur.execute("SELECT declaration FROM sink_declarations WHERE sink = 's'").fetchone()[0]
    )
    assert recorded == new


def test_the_recipe_of_a_sink_keeps_references_and_never_a_literal_secret() -> None:
    """What the meta store keeps to finish a removed sink's batches: its options as written, a
    ``${NAME}`` reference included, but a literal password left out (and named)."""
    from epochal.checkpoint.statements.sinks import SinkRecipe

    literal = SinkRecipe.of("postgres", {**PG, "password": "hunter2"}, ["customer", "total"])
    assert "hunter2" not in literal.to_json() and literal.withheld == ("password",)
    referenced = SinkRecipe.of("postgres", {**PG, "password": " ${PG_PASSWORD} "}, ["customer", "total"])
    assert dict(referenced.options)["password"] == " ${PG_PASSWORD} " and referenced.withheld == ()
    assert SinkRecipe.from_json(referenced.to_json()) == referenced
