"""A source's declaration edited in a running pipeline.

Columns added or removed are taken: rows stored before hold NULL in a new column (a keyed TABLE's
upserts meet stored rows without it), a view added over the new column backfills, and a TABLE added
mid-stream joins at once. A changed type, key or TABLE/SOURCE is refused at injection by name, with
nothing recorded, and a process that read the files before the change neither injects nor runs a
source step with its old declaration. Views are checked against the batch oracle over the records
re-read from the logs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from epochal.backfill.runner import BackfillRunner
from epochal.checkpoint.controller.core import ensure_schema
from epochal.checkpoint.records import EpochState
from epochal.checkpoint.statements import sources as sd
from epochal.connectors.log import append_records
from epochal.meta.backend import open_backend
from tests.consistency import assert_source_exact, assert_views_match_batch
from tests.epochal_harness import make_harness, run_epoch

SOURCES = """
CREATE TABLE customers (id BIGINT, name STRING, PRIMARY KEY (id))
WITH (connector = 'log', path = 'data/customers', format = 'json');
CREATE SOURCE orders (id BIGINT, customer BIGINT, amount DOUBLE)
WITH (connector = 'log', path = 'data/orders', format = 'json');
"""
VIEWS = {
    "totals": "SELECT customer, count(*) AS n, sum(amount) AS total FROM orders GROUP BY customer",
    "named": "SELECT o.id, c.name, o.amount FROM orders o JOIN customers c ON o.customer = c.id",
}
# After the edit: a column added to each source, views over them, and a keyed TABLE that joins.
SOURCES_EDITED = """
CREATE TABLE customers (id BIGINT, name STRING, tier STRING, PRIMARY KEY (id))
WITH (connector = 'log', path = 'data/customers', format = 'json');
CREATE SOURCE orders (id BIGINT, customer BIGINT, amount DOUBLE, channel STRING)
WITH (connector = 'log', path = 'data/orders', format = 'json');
CREATE TABLE regions (customer BIGINT, region STRING, PRIMARY KEY (customer))
WITH (connector = 'log', path = 'data/regions', format = 'json');
"""
VIEWS_EDITED = {
    **VIEWS,
    "by_tier": "SELECT c.tier, count(*) AS n, sum(o.amount) AS total FROM orders o "
    "JOIN customers c ON o.customer = c.id GROUP BY c.tier",
    "by_channel": "SELECT channel, count(*) AS n FROM orders GROUP BY channel",
    "by_region": "SELECT r.region, count(*) AS n FROM orders o JOIN regions r ON o.customer = r.customer "
    "GROUP BY r.region",
}


def _views_sql(views: dict[str, str]) -> str:
    return "".join(f"CREATE MATERIALIZED VIEW {name} AS {query};\n" for name, query in views.items())


def _declaration(
    columns: list[tuple[str, str]], kind: str = "table", key: tuple[str, ...] = ("id",), path: str = "data/t"
) -> str:
    origin = (("connector", "log"), ("path", path), ("format", "json"))
    return sd.Declaration(kind, key if kind == "table" else (), tuple(columns), origin).to_json()


def test_what_a_declaration_may_change_is_decided_by_kind_key_and_types(tmp_path: Path) -> None:
    backend = open_backend(f"duckdb:///{tmp_path / 'meta.duckdb'}")
    backend.transaction(ensure_schema)
    base = [("id", "BIGINT"), ("amount", "DECIMAL(10,2)")]
    t0 = time.time()
    assert backend.transaction(lambda cur: sd.check_declarations(cur, {"t": _declaration(base)}, t0)) == []
    # (a committed epoch: before one, nothing is stored and any change is taken)
    backend.transaction(
        lambda cur: cur.execute(
            "INSERT INTO epochs (epoch, prev_epoch, kind, state, injected_at) "
            "VALUES (1, NULL, 'checkpoint', 'COMMITTED', 0)"
        )
    )
    # Spacing is not a change; a column added or removed is recorded, and said.
    assert sd.normal_type(" DECIMAL( 10, 2 )") == "DECIMAL(10,2)"
    assert (
        sd.normal_type("STRUCT<`userId`: BIGINT, tags: ARRAY<STRING>>") == "STRUCT<`userId`:BIGINT,tags:ARRAY<STRING>>"
    )
    later = time.time() + 1
    grown = _declaration([*base, ("tier", "STRING")])
    said = backend.transaction(lambda cur: sd.check_declarations(cur, {"t": grown}, later))
    assert said == ["source t: column(s) tier added (NULL in the rows stored before)"]
    # A type, the key or the kind: refused, each named, and nothing recorded.
    for declaration, named in (
        (_declaration([("id", "BIGINT"), ("amount", "DOUBLE"), ("tier", "STRING")]), "column amount was DECIMAL(10,2)"),
        (_declaration([*base, ("tier", "STRING")], key=("id", "tier")), "PRIMARY KEY (id, tier)"),
        (_declaration([*base, ("tier", "STRING")], kind="source"), "declared TABLE and is now SOURCE"),
        (_declaration([*base, ("tier", "STRING")], path="data/t2"), "its path was 'data/t' and is now 'data/t2'"),
    ):
        with pytest.raises(sd.DeclarationChanged) as refused:
            backend.transaction(lambda cur, d=declaration: sd.check_declarations(cur, {"t": d}, later + 1))
        assert str(refused.value).startswith("source t: ") and named in str(refused.value)
        assert backend.transaction(lambda cur: sd.stored(cur, "t"))[0] == grown
    # A process that read its files before the column was added holds the old declaration: it is
    # stale, at injection and at its source steps; one with the recorded declaration goes on.
    with pytest.raises(sd.StaleDeclarations, match="source\\(s\\) t changed after this process read"):
        backend.transaction(lambda cur: sd.check_declarations(cur, {"t": _declaration(base)}, t0))
    recorded = backend.transaction(lambda cur: sd.stored(cur, "t"))
    with pytest.raises(sd.StaleDeclarations):
        sd.check_step(recorded, "t", _declaration(base), t0)
    sd.check_step(recorded, "t", grown, later)
    # One not yet checked by an injection (this process is newer than the record): refused, not stale.
    with pytest.raises(sd.DeclarationChanged, match="no injection has checked the change yet"):
        sd.check_step(recorded, "t", _declaration(base), time.time() + 10)


def test_an_identity_option_written_another_way_is_the_same_stream(tmp_path: Path) -> None:
    """A default written out ('1' for a split count left out), a path spelled another way or a
    format in capitals reads the same records: taken without a word. Another value is refused."""
    backend = open_backend(f"duckdb:///{tmp_path / 'meta.duckdb'}")
    backend.transaction(ensure_schema)
    columns = (("auction", "BIGINT"), ("price", "BIGINT"))

    def nexmark(**options: str) -> str:
        given = {"nexmark.table.type": "Bid", **options}
        origin = (("connector", "nexmark"), *((k, given.get(k)) for k in (
            "nexmark.table.type", "nexmark.split.num", "nexmark.min.event.gap.in.ns", "nexmark.base.time")))
        return sd.Declaration("source", (), columns, origin).to_json()

    def log(path: str, fmt: str | None) -> str:
        return sd.Declaration("source", (), columns, (("connector", "log"), ("path", path), ("format", fmt))).to_json()

    from epochal.connectors.nexmark import DEFAULT_BASE_TIME_MS

    t0 = time.time()
    backend.transaction(lambda cur: sd.check_declarations(cur, {"bid": nexmark(), "raw": log("data/raw", None)}, t0))
    backend.transaction(
        lambda cur: cur.execute(
            "INSERT INTO epochs (epoch, prev_epoch, kind, state, injected_at) "
            "VALUES (1, NULL, 'checkpoint', 'COMMITTED', 0)"
        )
    )
    later = time.time() + 1
    spelled = {
        "bid": nexmark(**{
            "nexmark.table.type": "BID", "nexmark.split.num": "01", "nexmark.base.time": str(DEFAULT_BASE_TIME_MS)
        }),
        "raw": log("./data//raw/", "JSON"),
    }
    assert backend.transaction(lambda cur: sd.check_declarations(cur, spelled, later)) == []
    with pytest.raises(sd.DeclarationChanged, match="its nexmark.split.num was '01' and is now '2'"):
        backend.transaction(
            lambda cur: sd.check_declarations(cur, {"bid": nexmark(**{"nexmark.split.num": "2"})}, later + 1)
        )
    with pytest.raises(sd.DeclarationChanged, match="its path was './data//raw/' and is now 'data/raw2'"):
        backend.transaction(lambda cur: sd.check_declarations(cur, {"raw": log("data/raw2", None)}, later + 1))
    # The relative path written out absolute, as the connector resolves it against the home: the
    # same directory. Another home's directory of that name is not.
    home = tmp_path / "home"
    absolute = {"raw": log(str(home / "data" / "raw"), None)}
    assert backend.transaction(lambda cur: sd.check_declarations(cur, absolute, later + 2, home)) == []
    elsewhere = {"raw": log(str(tmp_path / "other" / "data" / "raw"), None)}
    with pytest.raises(sd.DeclarationChanged, match="its path was"):
        backend.transaction(lambda cur: sd.check_declarations(cur, elsewhere, later + 3, home))


def test_columns_added_mid_stream_are_null_before_and_a_changed_type_is_refused(spark, tmp_path: Path) -> None:
    h = make_harness(tmp_path, {"sources.sql": SOURCES, "views.sql": _views_sql(VIEWS)})
    data = h.home / "data"
    append_records(data / "customers", [f'{{"id": {i}, "name": "n{i}"}}' for i in range(1, 6)])
    append_records(data / "orders", [f'{{"id": {i}, "customer": {i % 6}, "amount": {i}.5}}' for i in range(20)])
    before = h.runtime(spark)
    run_epoch(before)
    assert_views_match_batch(before, VIEWS)

    (h.pipeline_dir / "sources.sql").write_text(SOURCES_EDITED)
    (h.pipeline_dir / "views.sql").write_text(_views_sql(VIEWS_EDITED))
    # Upserts of stored customers (their stored rows have no tier), new ones, and orders with a channel.
    append_records(
        data / "customers", ['{"id": 2, "name": "n2", "tier": "gold"}', '{"id": 7, "name": "n7", "tier": "tin"}']
    )
    append_records(data / "customers", ['{"id": 3, "name": "n3b"}'], split="1")
    append_records(
        data / "orders",
        [f'{{"id": {i}, "customer": {i % 8}, "amount": {i}.25, "channel": "c{i % 3}"}}' for i in range(20, 40)],
    )
    append_records(data / "regions", [f'{{"customer": {i}, "region": "r{i % 2}"}}' for i in range(0, 8, 2)])
    after = h.runtime(spark)
    run_epoch(after)
    assert BackfillRunner(after).advance(budget_s=300)
    append_records(data / "customers", ['{"id": 4, "name": "n4", "tier": "gold"}', '{"id": 1, "_op": "delete"}'])
    append_records(
        data / "orders",
        ['{"id": 40, "customer": 4, "amount": 1.0, "channel": "c1"}', '{"id": 41, "customer": 2, "amount": 2.0}'],
    )
    append_records(data / "regions", ['{"customer": 2, "region": "r9"}'])
    run_epoch(after)
    status = after.controller.status()["backfills"]
    assert {v: status[v]["phase"] for v in ("by_tier", "by_channel", "by_region")} == dict.fromkeys(
        ("by_tier", "by_channel", "by_region"), "done"
    )
    counts = assert_views_match_batch(after, VIEWS_EDITED)
    assert counts["by_tier"] >= 3 and counts["by_region"] == 2
    assert assert_source_exact(after, "customers") == 5
    tiers = {r["id"]: r["tier"] for r in after.state("customers").collect()}
    assert tiers == {2: "gold", 3: None, 4: "gold", 5: None, 7: "tin"}

    # A changed type: refused at injection, naming the column and the fix; nothing is recorded,
    # and the pipeline goes on once the declaration is put back.
    (h.pipeline_dir / "sources.sql").write_text(SOURCES_EDITED.replace("amount DOUBLE", "amount DECIMAL(10,2)"))
    changed = h.runtime(spark)
    with pytest.raises(sd.DeclarationChanged) as refused:
        changed.start_epoch(None, None)
    assert "source orders: column amount was DOUBLE and is now DECIMAL(10,2)" in str(refused.value)
    assert "CAST(amount AS DECIMAL(10,2))" in str(refused.value)
    # So is another log under the same name: its offsets would point into other records.
    (h.pipeline_dir / "sources.sql").write_text(SOURCES_EDITED.replace("data/regions", "data/regions_eu"))
    with pytest.raises(sd.DeclarationChanged, match="source regions: its path was 'data/regions' and is now"):
        h.runtime(spark).start_epoch(None, None)
    # The same directory written out absolute is the same log: an epoch runs, and so does the next
    # with the path relative again.
    (h.pipeline_dir / "sources.sql").write_text(SOURCES_EDITED.replace("'data/regions'", f"'{data / 'regions'}'"))
    run_epoch(h.runtime(spark))
    (h.pipeline_dir / "sources.sql").write_text(SOURCES_EDITED)
    back = h.runtime(spark)
    run_epoch(back)

    # The process that read the files before the columns were added: it injects nothing, and its
    # source step of an epoch injected since is refused (its records would lose the new columns).
    with pytest.raises(sd.StaleDeclarations):
        before.start_epoch(None, None)
    append_records(data / "orders", ['{"id": 42, "customer": 3, "amount": 3.0, "channel": "c2"}'])
    epoch = back.start_epoch(None, None)[0].epoch
    with pytest.raises(sd.StaleDeclarations):
        before.run_source(epoch, "orders")
    # The refused step gave the epoch back, unfailed (the process is out of date, not the epoch):
    # the next run takes it (take_waiting) and reads its records with the new declaration.
    fresh = h.runtime(spark)
    assert fresh.controller.epoch_log.recovery_reason() is None
    assert fresh.controller.epoch_log.take_waiting("next-run") == [epoch]
    run_epoch(fresh, epoch)
    later = run_epoch(fresh)
    assert back.controller.epoch_log.epoch(epoch).state is EpochState.COMMITTED
    assert back.controller.epoch_log.epoch(later).state is EpochState.COMMITTED
    assert_views_match_batch(back, VIEWS_EDITED)


def test_a_column_respelled_mid_stream_is_refused_since_it_would_read_another_field(spark, tmp_path: Path) -> None:
    """``customerId`` and ``CustomerId`` are one column to SQL but two JSON keys: respelling the column
    made every later record read NULL for it, silently. Refused at injection with the spelling that
    reads the stored rows' field; taken again once spelled back. Nexmark reads no field by spelling."""
    sources = """
    CREATE TABLE accounts (id BIGINT, customerId BIGINT, PRIMARY KEY (id))
    WITH (connector = 'log', path = 'data/accounts', format = 'json');
    """
    views = {"per_customer": "SELECT customerid, count(*) AS n FROM accounts GROUP BY customerid"}
    h = make_harness(tmp_path, {"sources.sql": sources, "views.sql": _views_sql(views)})
    data = h.home / "data"
    append_records(data / "accounts", [f'{{"id": {i}, "customerId": {i % 3}}}' for i in range(6)])
    run_epoch(h.runtime(spark))

    (h.pipeline_dir / "sources.sql").write_text(sources.replace("customerId BIGINT", "CustomerId BIGINT"))
    respelled = h.runtime(spark)
    committed = respelled.controller.epoch_log.committed_epoch()
    with pytest.raises(sd.DeclarationChanged) as refused:
        respelled.start_epoch(None, None)
    message = str(refused.value)
    respelling = "column customerid was read from the records' field 'customerId' and would now be read from "
    respelling += "'CustomerId'"
    assert respelling in message, message
    assert "spell the column(s) as before (`customerId`" in message, message
    assert respelled.controller.epoch_log.committed_epoch() == committed
    assert not respelled.controller.status()["in_flight"]

    (h.pipeline_dir / "sources.sql").write_text(sources)
    append_records(data / "accounts", ['{"id": 7, "customerId": 1}', '{"id": 2, "_op": "delete"}'])
    runtime = h.runtime(spark)
    run_epoch(runtime)
    assert assert_views_match_batch(runtime, views) == {"per_customer": 3}
    assert {r["customerid"]: r["n"] for r in runtime.state("per_customer").collect()} == {0: 2, 1: 3, 2: 1}


def test_fields_are_recorded_for_a_declaration_stored_without_them_and_nexmark_has_none(tmp_path: Path) -> None:
    """A declaration stored before fields were recorded takes them at the next injection without a
    word (its spelling then is unknown, so nothing is compared); Nexmark declarations have none."""
    from epochal.pipeline.loader import load_pipeline

    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "s.sql").write_text(
        "CREATE TABLE t (id BIGINT, CustomerId BIGINT, PRIMARY KEY (id)) WITH (connector = 'log', path = 'data/t');"
    )
    source = load_pipeline(tmp_path / "p").sources["t"]
    backend = open_backend(f"duckdb:///{tmp_path / 'meta.duckdb'}")
    backend.transaction(ensure_schema)
    old = _declaration([("id", "BIGINT"), ("customerid", "BIGINT")])
    backend.transaction(lambda cur: sd.check_declarations(cur, {"t": old}, time.time()))
    backend.transaction(
        lambda cur: cur.execute(
            "INSERT INTO epochs (epoch, prev_epoch, kind, state, injected_at) "
            "VALUES (1, NULL, 'checkpoint', 'COMMITTED', 0)"
        )
    )
    new = sd.Declaration.of(source, ("path", "format"), by_spelling=True)
    assert new.fields == (("id", "id"), ("customerid", "CustomerId"))
    later = time.time() + 1
    assert backend.transaction(lambda cur: sd.check_declarations(cur, {"t": new.to_json()}, later)) == []
    assert sd.Declaration.from_json(backend.transaction(lambda cur: sd.stored(cur, "t"))[0]).fields == new.fields
    assert sd.Declaration.of(source, (), by_spelling=False).fields is None
    assert "fields" not in sd.Declaration.of(source).to_json()
