"""Tables with a PRIMARY KEY: the log connector's keyed records, upsert_changes, and the loader's checks."""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epochal.connectors.base import SplitRange
from epochal.connectors.log import LogConnectorSpec, append_records
from epochal.errors import EpochalError, PipelineError
from epochal.pipeline.loader import load_pipeline
from epochal.pipeline.model import Column, Location, SourceDef
from epochal.storage.upsert import upsert_changes
from tests.consistency import frame

RECORD_DDL = "_op STRING, _split STRING, _offset BIGINT"


def records(spark, ddl: str, rows: list[tuple]):
    """Keyed records: the columns in ``ddl``, then op, split and offset in each tuple."""
    return frame(spark, rows, f"{ddl}, {RECORD_DDL}")


def change(df) -> list[tuple]:
    return sorted((tuple(r) for r in df.collect()), key=repr)


def changes_of(
    spark, incoming: list[tuple], previous: list[tuple], ddl: str = "id BIGINT, v STRING", key=("id",)
) -> list[tuple]:
    """upsert_changes' result for plain rows, checked for its shape."""
    columns = [part.split()[0] for part in ddl.split(",")]
    result = upsert_changes(records(spark, ddl, incoming), frame(spark, previous, ddl), key, columns)
    assert result.columns == [*columns, "_weight"] and result.dtypes[-1] == ("_weight", "bigint")
    return change(result)


# --- upsert_changes -------------------------------------------------------------------------------


def test_insert_update_and_delete(spark):
    previous = [(1, "a"), (2, "b"), (3, "c")]
    incoming = [
        (4, "d", "upsert", "0", 0),  # a new key
        (1, "A", "upsert", "0", 1),  # an update
        (2, None, "delete", "0", 2),  # a delete
        (9, None, "delete", "0", 3),  # a delete of a key that is not there: nothing
    ]
    assert changes_of(spark, incoming, previous) == sorted(
        [(4, "d", 1), (1, "a", -1), (1, "A", 1), (2, "b", -1)], key=repr
    )


def test_unchanged_values_keep_the_rows_value(spark):
    """A record may leave columns unchanged and unsent (postgres-cdc's unchanged TOASTed values,
    ``_unchanged``): each keeps the key's value from its latest earlier record in the epoch that
    sent it (a NULL it sent included), else from the previous row; never a NULL in its place."""
    ddl = "id BIGINT, v STRING, w STRING"
    previous = [(1, "big1", "a"), (2, "big2", "b")]
    incoming = [
        (1, None, "A", "upsert", "0", 0, ["v"]),  # from the previous row
        (3, "big3", "c", "upsert", "0", 1, None),
        (3, None, "C", "upsert", "0", 2, ["v"]),  # from the record before it
        (3, None, "CC", "upsert", "0", 3, ["v"]),  # and through it, from the one before
        (2, None, "B", "upsert", "0", 4, None),  # sends a NULL
        (2, None, "BB", "upsert", "0", 5, ["v"]),  # which is the value it keeps
    ]
    rows = frame(spark, incoming, f"{ddl}, {RECORD_DDL}, _unchanged ARRAY<STRING>")
    result = upsert_changes(rows, frame(spark, previous, ddl), ["id"], ["id", "v", "w"])
    assert change(result) == sorted(
        [(1, "big1", "a", -1), (1, "big1", "A", 1), (3, "big3", "CC", 1), (2, "big2", "b", -1), (2, None, "BB", 1)],
        key=repr,
    )
    orphan = frame(spark, [(9, None, "x", "upsert", "0", 0, ["v"])], f"{ddl}, {RECORD_DDL}, _unchanged ARRAY<STRING>")
    with pytest.raises(Exception, match="does not hold"):
        upsert_changes(orphan, frame(spark, previous, ddl), ["id"], ["id", "v", "w"]).collect()


def test_only_the_last_record_of_a_key_counts(spark):
    previous = [(1, "a"), (2, "b"), (3, "c")]
    incoming = [
        # key 1: deleted, then inserted again: an update
        (1, None, "delete", "0", 10),
        (1, "z", "upsert", "0", 11),
        # key 2: updated, then deleted
        (2, "x", "upsert", "0", 12),
        (2, None, "delete", "0", 13),
        # key 3: changed, then changed back: nothing (offsets out of order on purpose)
        (3, "c", "upsert", "0", 15),
        (3, "y", "upsert", "0", 14),
        # key 5: inserted twice, then deleted: nothing
        (5, "p", "upsert", "0", 16),
        (5, "q", "upsert", "0", 17),
        (5, None, "delete", "0", 18),
        # key 6: ordered by split first, then by offset
        (6, "from b", "upsert", "b", 0),
        (6, "from a", "upsert", "a", 99),
    ]
    assert changes_of(spark, incoming, previous) == sorted(
        [(1, "a", -1), (1, "z", 1), (2, "b", -1), (6, "from b", 1)], key=repr
    )


def test_an_identical_re_upsert_emits_nothing_nulls_included(spark):
    previous = [(1, None), (2, "b")]
    incoming = [(1, None, "upsert", "0", 0), (2, "b", "upsert", "0", 1), (2, None, "upsert", "0", 2)]
    assert changes_of(spark, incoming, previous) == sorted([(2, "b", -1), (2, None, 1)], key=repr)
    assert changes_of(spark, [], previous) == []


def test_composite_keys_compare_null_safely(spark):
    ddl = "region STRING, id INT, amount DOUBLE"
    previous = [("eu", 1, 1.0), ("us", 1, 2.0), (None, 1, 3.0), ("eu", 2, None)]
    incoming = [
        ("eu", 1, 10.0, "upsert", "0", 0),  # same id as us/1 and None/1: only eu/1 changes
        (None, 1, None, "delete", "0", 1),  # a NULL key part matches the NULL in previous
        ("us", 2, 5.0, "upsert", "0", 2),  # new
        ("eu", 2, None, "upsert", "0", 3),  # unchanged, NULL amount included
    ]
    assert changes_of(spark, incoming, previous, ddl, ("region", "id")) == sorted(
        [("eu", 1, 1.0, -1), ("eu", 1, 10.0, 1), (None, 1, 3.0, -1), ("us", 2, 5.0, 1)], key=repr
    )


def test_a_duplicated_previous_row_is_retracted_copy_by_copy(spark):
    # previous breaks its contract (one row per key): the change still has one row per unit
    assert changes_of(spark, [(1, None, "delete", "0", 0)], [(1, "a"), (1, "a")]) == [(1, "a", -1), (1, "a", -1)]


def test_shapes_are_checked_before_spark_runs(spark):
    incoming = records(spark, "id BIGINT, v STRING", [])
    previous = frame(spark, [], "id BIGINT, v STRING")
    with pytest.raises(EpochalError, match="not among the columns"):
        upsert_changes(incoming, previous, ["k"], ["id", "v"])
    with pytest.raises(EpochalError, match="previous lacks column"):
        upsert_changes(incoming, previous.select("id"), ["id"], ["id", "v"])
    with pytest.raises(EpochalError, match="incoming lacks column.*_offset"):
        upsert_changes(incoming.drop("_offset"), previous, ["id"], ["id", "v"])


# --- the property: epoch by epoch, upsert_changes keeps the state a dict would ----------------------

KEYS = st.integers(0, 4)
RECORDS = st.lists(
    st.tuples(KEYS, st.one_of(st.none(), st.integers(0, 2)), st.sampled_from(["upsert", "delete"])),
    min_size=1,
    max_size=25,
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=RECORDS, cuts=st.lists(st.integers(0, 25), min_size=2, max_size=4))
def test_epochs_of_upserts_end_in_the_state_of_a_dict(spark, data, cuts):
    bounds = [0, *sorted(min(c, len(data)) for c in cuts), len(data)]
    epochs = [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]  # 3 to 5 epochs, some empty
    model: dict[int, int | None] = {}
    state: Counter[tuple] = Counter()
    offset = 0
    for epoch in epochs:
        rows = []
        for key, value, op in epoch:
            # records of one key go to one split, as producers are told to do
            rows.append((key, value if op == "upsert" else None, op, f"s{key % 2}", offset))
            offset += 1
            if op == "upsert":
                model[key] = value
            else:
                model.pop(key, None)
        previous = frame(spark, sorted(state.elements(), key=repr), "k INT, v INT")
        incoming = records(spark, "k INT, v INT", rows)
        for k, v, weight in upsert_changes(incoming, previous, ["k"], ["k", "v"]).collect():
            assert weight in (1, -1)
            state[(k, v)] += weight
        assert all(n in (0, 1) for n in state.values()), state  # never a negative or double row
        state = +state
        assert len({k for k, _ in state}) == len(state)  # at most one row per key
        assert dict(state) == {item: 1 for item in model.items()}


# --- the log connector's keyed records --------------------------------------------------------------

ORDER_COLUMNS = (Column("id", "BIGINT"), Column("name", "STRING"), Column("ts", "TIMESTAMP"))


def keyed_log(home: Path, columns=ORDER_COLUMNS, key: tuple[str, ...] = ("id",)):
    source = SourceDef(
        name="orders",
        columns=columns,
        connector="log",
        options={"connector": "log", "path": "events"},
        location=Location("pipeline.sql", 1),
        kind="table",
        primary_key=key,
    )
    return LogConnectorSpec().create(source, home)


def test_keyed_records_carry_op_split_and_offset(spark, tmp_path):
    lines = [
        '{"id": 1, "name": "a"}',
        '{"id": 2, "name": "b", "_op": "insert"}',
        '{"id": 1, "name": "c", "_op": "UPDATE"}',
        '{"id": 3, "_op": "Upsert", "ts": "2024-01-02 03:04:05"}',
        '{"id": 2, "_op": "delete", "name": 5, "ts": "not a time"}',  # a delete reads only its key
        '{"id": 4, "_op": "DELETE"}',
        '{"id": 5, "name": "n", "_op": null}',
    ]
    append_records(tmp_path / "events", lines, "eu")
    src = keyed_log(tmp_path)
    batch = src.read(spark, src.plan({}))
    assert batch.rows.dtypes == [
        ("id", "bigint"),
        ("name", "string"),
        ("ts", "timestamp"),
        ("_op", "string"),
        ("_split", "string"),
        ("_offset", "bigint"),
    ]
    assert [tuple(r) for r in batch.rows.drop("ts").orderBy("_offset").collect()] == [
        (1, "a", "upsert", "eu", 0),
        (2, "b", "upsert", "eu", 1),
        (1, "c", "upsert", "eu", 2),
        (3, None, "upsert", "eu", 3),
        (2, None, "delete", "eu", 4),
        (4, None, "delete", "eu", 5),
        (5, "n", "upsert", "eu", 6),
    ]
    assert batch.dead_letters is not None and batch.dead_letters.count() == 0
    assert batch.rejected is not None and batch.rejected.isEmpty()


def test_keyed_records_that_cannot_apply_become_dead_letters(spark, tmp_path):
    lines = [
        '{"id": 1, "_op": "merge"}',
        '{"id": 2, "_op": 5}',
        '{"name": "no key"}',
        '{"id": null, "_op": "delete"}',
        '{"id": "x", "_op": "delete", "ts": "bad"}',  # a delete's reason names only its key
        '{"id": 3, "ts": "bad"}',  # an upsert needs every field to fit
        '{"id": 4',
        '"just a string"',
        '{"id": 5, "name": "ok"}',
    ]
    append_records(tmp_path / "events", lines)
    src = keyed_log(tmp_path)
    batch = src.read(spark, src.plan({}))
    assert [tuple(r) for r in batch.rows.drop("ts").collect()] == [(5, "ok", "upsert", "0", 8)]
    assert batch.dead_letters is not None
    assert change(batch.dead_letters) == sorted(
        [
            ("0", 0, lines[0], 'unknown _op "merge": use insert, update or delete'),
            ("0", 1, lines[1], 'unknown _op "5": use insert, update or delete'),
            ("0", 2, lines[2], "primary key column 'id' is missing or null"),
            ("0", 3, lines[3], "primary key column 'id' is missing or null"),
            ("0", 4, lines[4], """field 'id': expected BIGINT, got "x\""""),
            ("0", 5, lines[5], """field 'ts': expected TIMESTAMP, got "bad\""""),
            ("0", 6, lines[6], "malformed JSON"),
            ("0", 7, lines[7], "not a JSON object: got a string"),
        ],
        key=repr,
    )


def test_keyed_records_with_a_composite_key_need_every_part(spark, tmp_path):
    columns = (Column("region", "STRING"), Column("id", "INT"), Column("qty", "INT"))
    lines = [json.dumps(r) for r in ({"region": "eu", "id": 1, "qty": 2}, {"id": 2, "_op": "delete"}, {})]
    append_records(tmp_path / "events", lines)
    src = keyed_log(tmp_path, columns, ("region", "id"))
    batch = src.read(spark, src.plan({}))
    assert [tuple(r) for r in batch.rows.collect()] == [("eu", 1, 2, "upsert", "0", 0)]
    assert batch.dead_letters is not None
    assert change(batch.dead_letters.select("offset", "reason")) == [
        (1, "primary key column 'region' is missing or null"),
        (
            2,
            "primary key column 'region' is missing or null; primary key column 'id' is missing or null",
        ),
    ]


def test_keyed_read_of_an_empty_epoch_has_the_record_schema(spark, tmp_path):
    batch = keyed_log(tmp_path).read(spark, [])
    assert batch.rows.columns == ["id", "name", "ts", "_op", "_split", "_offset"]
    assert batch.rows.count() == 0


def test_without_a_key_op_is_still_ignored(spark, tmp_path):
    append_records(tmp_path / "events", ['{"id": 1, "_op": "delete"}', '{"id": 2, "_op": "bogus"}'])
    src = keyed_log(tmp_path, key=())
    batch = src.read(spark, [SplitRange("0", 0, 2)])
    assert batch.rows.columns == ["id", "name", "ts"]
    assert change(batch.rows) == [(1, None, None), (2, None, None)]


def test_connector_refuses_a_key_that_is_not_a_column(tmp_path):
    with pytest.raises(EpochalError, match="PRIMARY KEY column 'nope'"):
        keyed_log(tmp_path, key=("nope",))


def test_log_records_to_changes_end_to_end(spark, tmp_path):
    """The connector's output is upsert_changes' input, as the source step will use them."""
    append_records(tmp_path / "events", ['{"id": 1, "name": "a"}', '{"id": 2, "name": "b"}'])
    src = keyed_log(tmp_path)
    first = src.plan({})
    names = ["id", "name", "ts"]
    empty = frame(spark, [], "id BIGINT, name STRING, ts TIMESTAMP")
    epoch1 = upsert_changes(src.read(spark, first).rows, empty, ["id"], names)
    assert change(epoch1.drop("ts")) == [(1, "a", 1), (2, "b", 1)]

    append_records(tmp_path / "events", ['{"id": 1, "name": "A", "_op": "update"}', '{"id": 2, "_op": "delete"}'])
    second = src.plan({r.split: r.end for r in first})
    state = epoch1.drop("_weight")
    epoch2 = upsert_changes(src.read(spark, second).rows, state, ["id"], names)
    assert change(epoch2.drop("ts")) == sorted([(1, "a", -1), (1, "A", 1), (2, "b", -1)], key=repr)


# --- loading -------------------------------------------------------------------------------------


def load_errors(tmp_path: Path, sql: str) -> list[str]:
    (tmp_path / "p.sql").write_text(textwrap.dedent(sql))
    with pytest.raises(PipelineError) as raised:
        load_pipeline(tmp_path)  # the real connector registry
    return [str(issue).replace(str(tmp_path), "") for issue in raised.value.issues]


def test_loader_refuses_a_key_column_that_is_not_declared(tmp_path):
    errors = load_errors(
        tmp_path,
        """\
        CREATE TABLE orders (id BIGINT, customer STRING,
            PRIMARY KEY (order_id))
        WITH (connector = 'log', path = 'data/orders');
        """,
    )
    assert errors == ["/p.sql:2: table orders: PRIMARY KEY column 'order_id' is not a column (columns: id, customer)"]


def test_loader_refuses_a_key_on_nexmark(tmp_path):
    errors = load_errors(
        tmp_path,
        """\
        CREATE TABLE person (id BIGINT PRIMARY KEY, name STRING)
        WITH (connector = 'nexmark', 'nexmark.table.type' = 'Person');
        """,
    )
    assert errors == [
        "/p.sql:1: table person: the nexmark connector is append-only: remove PRIMARY KEY "
        "(only log, mysql-cdc, posix_fs, postgres-cdc tables take one)"
    ]


def test_loader_refuses_a_key_on_a_source(tmp_path):
    errors = load_errors(
        tmp_path,
        """\
        CREATE SOURCE orders (id BIGINT PRIMARY KEY, name STRING)
        WITH (connector = 'log', path = 'data/orders');
        """,
    )
    assert errors == [
        "/p.sql:1: source orders: a SOURCE cannot have a PRIMARY KEY: upserts and deletes by key need the rows "
        "stored, which is what a TABLE does; declare it as CREATE TABLE orders (..., PRIMARY KEY (id)) WITH (...)"
    ]


def test_loader_keeps_the_key_of_a_log_table(tmp_path):
    (tmp_path / "p.sql").write_text(
        "CREATE TABLE orders (region STRING, id BIGINT, PRIMARY KEY (region, id))\n"
        "WITH (connector = 'log', path = 'data/orders');\n"
    )
    assert load_pipeline(tmp_path).sources["orders"].primary_key == ("region", "id")
