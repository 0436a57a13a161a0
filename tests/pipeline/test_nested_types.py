"""Nested column types in sources (ARRAY, STRUCT, with DATE and DECIMAL beside them): declared as in
Spark, read from JSON records, maintained by every kind of view and compared after every epoch with
the same SQL run as a Spark batch over the records decoded in plain Python."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import duckdb
import pytest
from deltalake import DeltaTable

from epochal.connectors.log import append_records
from epochal.errors import PipelineError
from epochal.pipeline.loader import load_pipeline
from tests.consistency import assert_source_exact, assert_views_match_batch, iceberg_table
from tests.epochal_harness import make_harness
from tests.sinks.test_postgres_sink import database, sql_rows  # noqa: F401 - the fixture

SOURCES = """
CREATE TABLE events (id BIGINT PRIMARY KEY, user_name STRING, day DATE, amount DECIMAL(10, 2), tags ARRAY<STRING>,
  device STRUCT<os: STRING, appVersion: INT>, attrs STRING, ok BOOLEAN, ts TIMESTAMP, payload STRING)
WITH (connector = 'log', path = 'data/events', format = 'json');
"""

VIEWS = {
    "by_os": "SELECT device.os AS os, count(*) AS n, sum(amount) AS total, max(device.appVersion) AS v "
    "FROM events GROUP BY device.os",
    "tags_exploded": "SELECT tag, count(*) AS n FROM events LATERAL VIEW explode(tags) t AS tag GROUP BY tag",
    "tag_sizes": "SELECT user_name, sum(size(tags)) AS n_tags, max(array_contains(tags, 'a')) AS has_a "
    "FROM events GROUP BY user_name",
    # a JSON object declared STRING arrives as its text (a MAP column is refused), read with from_json
    "attr_values": "SELECT user_name, sum(coalesce(from_json(attrs, 'MAP<STRING, INT>')['k'], 0)) AS k "
    "FROM events GROUP BY user_name",
    "by_day": "SELECT day, count(*) AS n, avg(amount) AS a, count_if(ok) AS oks FROM events GROUP BY day",
    "struct_pass": "SELECT id, device, named_struct('User', user_name, 'Amt', amount) AS info FROM events WHERE ok",
    "top_user_day": "SELECT day, user_name, total FROM (SELECT day, user_name, sum(amount) AS total, "
    "row_number() OVER (PARTITION BY day ORDER BY sum(amount) DESC, user_name) AS r FROM events "
    "GROUP BY day, user_name) WHERE r = 1",
    "positions": "SELECT id, pos, tag FROM events LATERAL VIEW OUTER posexplode(tags) t AS pos, tag",
    "other_tags": "SELECT id, filter(tags, x -> x <> 'a') AS others, transform(tags, x -> upper(x)) AS up FROM events",
    # nested values built from aggregates, projected from a partial aggregate's stage: its stored
    # counts may be NULL where the query says not, and Spark refused to cast array(count(*)) to that
    "nested_counts": "SELECT user_name, array(count(*)) AS a, named_struct('n', count(*), 'total', sum(amount)) AS s, "
    "map('n', count(*)) AS m FROM events GROUP BY user_name",
}


def event(i: int, user: str = "u1", day: str = "2026-01-01", amount: float = 1.5, tags=("a",), os: str = "ios",
          version: int | None = 1, attrs: dict | None = None, ok: bool | None = True, op: str | None = None) -> str:
    body: dict = {"id": i}
    if op != "delete":
        body.update(user_name=user, day=day, amount=amount, tags=list(tags), device={"os": os, "appVersion": version},
                    attrs=attrs or {"k": 1}, ok=ok, ts="2026-01-01T10:00:00", payload=json.dumps({"n": i}))
    if op:
        body["_op"] = op
    return json.dumps(body)


EPOCHS = [
    [event(1), event(2, "u2", tags=("a", "b"), os="android", version=2, amount=3.25),
     event(3, "u1", day="2026-01-02", tags=(), attrs={"k": 2, "j": 5}), event(4, "u3", amount=10, ok=False)],
    # a delete, an update that moves a row's struct, array and day, an array with a repeated element
    [event(2, op="delete"), event(3, "u2", day="2026-01-02", tags=("c",), version=3), event(5, "u3", tags=("a", "a"))],
    # a struct field and a boolean NULL; the largest amount goes
    [event(1, "u1", amount=2, tags=("b",), attrs={"j": 1}), event(6, "u4", os="web", version=None, ok=None),
     event(4, op="delete")],
]


def _rows(rows: list[dict]) -> list[tuple]:
    """Rows of id, device, tags, info as plain tuples, in id order."""
    return sorted(
        (r["id"], tuple(r["device"].values()), tuple(r["tags"]), tuple(r["info"].values())) for r in rows
    )


SINKS = """
CREATE MATERIALIZED VIEW nested_out AS
SELECT id, device, tags, named_struct('User', user_name, 'Amt', amount) AS info FROM events WHERE ok;
CREATE SINK to_duckdb FROM nested_out
WITH (connector = 'duckdb', database = 'out/sink.duckdb', table = 'nested', type = 'upsert', primary_key = 'id');
CREATE SINK to_delta FROM nested_out
WITH (connector = 'deltalake', location = 'lake/nested', type = 'upsert', primary_key = 'id');
CREATE SINK to_iceberg FROM nested_out
WITH (connector = 'iceberg', namespace = 'app', table = 'nested', type = 'upsert', primary_key = 'id');
CREATE SINK to_postgres FROM nested_out
WITH (connector = 'postgres', host = '127.0.0.1', user = 'postgres', database = '{db}', table = 'nested',
      type = 'upsert', primary_key = 'id');
"""


def test_structs_and_arrays_reach_duckdb_delta_iceberg_and_postgres_sinks_as_they_are(
    spark, tmp_path: Path, database: str  # noqa: F811 - the fixture
) -> None:
    """(The Iceberg sink refused its own table at the second epoch: a nested type's field ids
    differ between the table and the schema it is compared with. PostgreSQL refused them; they are
    jsonb there, decimals exact.)"""
    h = make_harness(tmp_path, {"sources.sql": SOURCES, "views.sql": SINKS.replace("{db}", database)})
    instance = dg.DagsterInstance.ephemeral()
    for events in EPOCHS:
        append_records(h.home / "data" / "events", events)
        result = h.run_in_process(instance)
        assert result.success, [e.message for e in result.all_events if e.is_failure]
    view = _rows([r.asDict(recursive=True) for r in h.runtime(spark).state("nested_out").collect()])
    assert [r[0] for r in view] == [1, 3, 5]
    con = duckdb.connect(str(h.home / "out" / "sink.duckdb"), read_only=True)
    try:
        columns = ["id", "device", "tags", "info"]
        in_duckdb = [dict(zip(columns, r, strict=True)) for r in con.execute("SELECT * FROM nested").fetchall()]
    finally:
        con.close()
    assert _rows(in_duckdb) == view
    assert _rows(DeltaTable(str(h.home / "lake" / "nested")).to_pyarrow_table().to_pylist()) == view
    assert _rows(iceberg_table(h.home, "app.nested").scan().to_arrow().to_pylist()) == view
    assert sql_rows(database, "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = "
                    "'public.nested'::regclass AND attname = 'device'") == [("jsonb",)]
    in_postgres = sql_rows(database, "SELECT id, device::text, tags::text, info::text FROM nested ORDER BY id")
    assert in_postgres == [
        (1, '{"os": "ios", "appVersion": 1}', '["b"]', '{"Amt": 2.00, "User": "u1"}'),
        (3, '{"os": "ios", "appVersion": 3}', '["c"]', '{"Amt": 1.50, "User": "u2"}'),
        (5, '{"os": "ios", "appVersion": 1}', '["a", "a"]', '{"Amt": 1.50, "User": "u3"}'),
    ]


def test_nested_source_columns_are_maintained_by_every_kind_of_view(spark, tmp_path: Path) -> None:
    h = make_harness(tmp_path, {
        "sources.sql": SOURCES,
        "views.sql": "\n".join(f"CREATE MATERIALIZED VIEW {n} AS {q};" for n, q in VIEWS.items()),
    })
    pipeline = load_pipeline(h.pipeline_dir)
    assert pipeline.sources["events"].columns[5].type == "STRUCT<`os`: STRING, `appVersion`: INT>"
    instance = dg.DagsterInstance.ephemeral()
    for events in EPOCHS:
        append_records(h.home / "data" / "events", events)
        result = h.run_in_process(instance)
        assert result.success, [e.message for e in result.all_events if e.is_failure]
        runtime = h.runtime(spark)
        assert_source_exact(runtime, "events")
        assert_views_match_batch(runtime, VIEWS)
    # a struct field keeps its spelling in the stored type (the record's key), as Spark gives it
    assert runtime.state("events").schema["device"].dataType.simpleString() == "struct<os:string,appVersion:int>"


@pytest.mark.parametrize(
    ("column", "message"),
    [
        ("attrs MAP<STRING, INT>", "MAP column attrs is not supported: Spark cannot compare or group maps"),
        ("tags ARRAY<STRING", "'>' after the element type of ARRAY in column tags"),
        ("device STRUCT<os STRING version INT>", "',' or '>' after field os in the STRUCT of column device"),
        ("tags ARRAY<TEXTS>", "type 'TEXTS' of column tags[] is not supported"),
        # (issue 60 item 16: refused as any unknown type, the reason did not hold: Spark has them)
        ("at TIME", "TIME column at is not supported: Spark's TIME type is a preview, off by default"),
        ("payload VARIANT", "VARIANT column payload is not supported: a table's changes are netted by comparing"),
    ],
)
def test_a_nested_type_written_wrong_is_refused_naming_the_column(tmp_path: Path, column: str, message: str) -> None:
    (tmp_path / "s.sql").write_text(
        f"CREATE TABLE t (id BIGINT PRIMARY KEY, {column}) WITH (connector = 'log', path = 'd', format = 'json');"
    )
    with pytest.raises(PipelineError) as error:
        load_pipeline(tmp_path)
    assert message in str(error.value)


def test_a_primary_key_is_a_scalar_column(tmp_path: Path) -> None:
    (tmp_path / "s.sql").write_text(
        "CREATE TABLE t (tags ARRAY<STRING>, PRIMARY KEY (tags)) WITH (connector = 'log', path = 'd', format = 'json');"
    )
    with pytest.raises(PipelineError, match="PRIMARY KEY column 'tags' is ARRAY: a key is a scalar column"):
        load_pipeline(tmp_path)


def test_a_nested_value_that_does_not_fit_its_type_is_a_dead_letter(spark, tmp_path: Path) -> None:
    """A string for an array, a number or an array for a struct, a field of the wrong type inside a
    struct: the record is a dead letter, as any misfit is. A number in an array of strings is its
    text, and a missing struct field is NULL, as Spark reads JSON."""
    views = {"by_os": "SELECT device.os AS os, count(*) AS n, sum(size(tags)) AS t FROM events GROUP BY device.os"}
    h = make_harness(tmp_path, {
        "sources.sql": SOURCES,
        "views.sql": "\n".join(f"CREATE MATERIALIZED VIEW {n} AS {q};" for n, q in views.items()),
    })
    good = json.loads(event(1))
    misfits = [("tags", "notalist"), ("device", 5), ("device", {"os": "ios", "appVersion": "x"}), ("tags", {"a": 1}),
               ("device", [1, 2]), ("amount", 123456789012.5), ("day", "2026-13-01")]
    fits = [("tags", [1, "a", None]), ("device", {"os": "ios"})]
    records = [event(1)] + [json.dumps({**good, "id": i, k: v}) for i, (k, v) in enumerate(misfits + fits, start=10)]
    append_records(h.home / "data" / "events", records)
    result = h.run_in_process(dg.DagsterInstance.ephemeral())
    assert result.success, [e.message for e in result.all_events if e.is_failure]
    runtime = h.runtime(spark)
    assert sorted(r.id for r in runtime.state("events").collect()) == [1, 17, 18]
    assert_source_exact(runtime, "events")
    assert_views_match_batch(runtime, views)
