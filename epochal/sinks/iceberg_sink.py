"""The Iceberg sink: each batch with rows is one Iceberg snapshot, delivered exactly once.

The table lives in a SQL catalog (pyiceberg's ``SqlCatalog``): by default in Epochal's own
PostgreSQL meta database when the meta store is PostgreSQL, otherwise in a SQLite file beside the
project, so any engine that speaks the Iceberg JDBC/SQL catalog (pyiceberg, Spark, Trino, DuckDB
through pyiceberg) opens the same table with the same URI and warehouse.

Writers (Spark tasks) write Parquet files under the table's data location; no snapshot lists them,
so no reader sees them. The driver commits them in one snapshot whose summary records
``epochal.sink``, ``epochal.first_epoch`` and ``epochal.epoch`` (the batch's last epoch), and in the
same catalog commit sets the table property ``epochal.sink.<sink>.epoch``. Before committing it
walks the current snapshot's ancestors (as RisingWave's Iceberg sink does) and reads that property:
a batch whose last epoch is already there is skipped, so a commit replayed after a crash changes
nothing. The property also records batches without rows (no snapshot is made for them) and
survives snapshot expiry.

Upsert is copy-on-write in the one snapshot: the writers store the keys their rows touch in a
Parquet file under ``<table>/_epochal_staging/``; the driver scans the files that may hold them
(Iceberg's column stats prune), writes each again without those rows with pyarrow, and commits an
OVERWRITE snapshot that deletes the old files and adds the rewritten and the new ones.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from epochal.redaction import redact_url
from epochal.sinks.base import (
    BatchId,
    PrecommitLost,
    SinkConfigError,
    SinkError,
    SinkSchemaError,
    SinkTarget,
    WriterTask,
)
from epochal.sinks.lake_files import (
    STAGING_DIR,
    RollingParquetWriter,
    WrittenFile,
    batch_of,
    batch_prefix,
    check_precommit,
    data_file_name,
    key_ranges,
    read_keys,
    rows_matching,
    sink_prefix,
    sink_schema,
    spelled_otherwise,
    write_keys,
    write_task_rows,
)
from epochal.sinks.spec import primary_key_columns

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.fs as pafs
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.table import Table

_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_POSTGRES = re.compile(r"^postgres(?:ql)?://")
#: the table property that records a sink's last delivered epoch (``epochal.sink.<sink>.epoch``)
PROGRESS_PROPERTY = "epochal.sink.{}.epoch"
NAME_MAPPING = "schema.name-mapping.default"
#: pyiceberg retries a conflicting commit on the new head without asking whether the batch is there
COMMIT_RETRIES_PROPERTY = "commit.retry.num-retries"
#: commits of one batch tried before the coordinator gets the failure (each reloads and checks)
COMMIT_ATTEMPTS = 8


def catalog_uri(uri: str | None, home: Path, meta_url: str | None) -> str:
    """The SQLAlchemy URL of the catalog: ``catalog.uri`` when given, else Epochal's PostgreSQL meta
    database, else a SQLite file under ``EPOCHAL_HOME``. ``postgresql://`` URLs get SQLAlchemy's
    psycopg 3 driver (``postgresql+psycopg://``), the one Epochal installs."""
    if uri:
        return _POSTGRES.sub("postgresql+psycopg://", uri.strip())
    if meta_url and _POSTGRES.match(meta_url):
        return _POSTGRES.sub("postgresql+psycopg://", meta_url)
    return f"sqlite:///{(home / 'iceberg-catalog.db').resolve()}"


def warehouse_location(warehouse: str | None, home: Path) -> str:
    if not warehouse:
        return str((home / "iceberg-warehouse").resolve())
    if _URI.match(warehouse.strip()):
        return warehouse.strip().rstrip("/")
    path = Path(warehouse.strip()).expanduser()
    return str(path if path.is_absolute() else (home / path).resolve())


class IcebergTarget(SinkTarget):
    def __init__(
        self, name: str, options: Mapping[str, str], columns: Sequence[str], home: Path, meta_url: str | None = None
    ):
        self.name = name
        self.columns = list(columns)
        self.type = options.get("type", "append-only")
        self.primary_key = primary_key_columns(options, self.columns)
        self.catalog_name = options.get("catalog.name") or "epochal"
        self.catalog_uri = catalog_uri(options.get("catalog.uri"), home, meta_url)
        self.warehouse = warehouse_location(options.get("warehouse"), home)
        self.namespace = tuple((options.get("namespace") or "default").split("."))
        self.table = options["table"]
        #: (data directory, table location), learnt by prepare_target on the driver so that the
        #: executors need not open the catalog; None until then
        self._locations: tuple[str, str] | None = None
        self._catalog: SqlCatalog | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Pickled to the executors: names only, never the catalog's connection pool.
        state = dict(self.__dict__)
        state["_catalog"] = None
        return state

    def describe(self) -> str:
        return f"iceberg:{'.'.join(self.identifier)} in catalog {self.catalog_name} at {redact_url(self.catalog_uri)}"

    @property
    def identifier(self) -> tuple[str, ...]:
        return (*self.namespace, self.table)

    def close(self) -> None:
        """Release the catalog's connections (the target opens them again when needed)."""
        if self._catalog is not None:
            self._catalog.engine.dispose()
            self._catalog = None

    # ------------------------------------------------------------------ catalog

    def catalog(self) -> SqlCatalog:
        from pyiceberg.catalog.sql import SqlCatalog

        if self._catalog is None:
            try:
                self._catalog = SqlCatalog(self.catalog_name, uri=self.catalog_uri, warehouse=self.warehouse)
            except Exception as exc:
                raise SinkConfigError(
                    f"sink {self.name}: cannot open the Iceberg catalog at {redact_url(self.catalog_uri)} "
                    f"({redact_url(str(exc)).splitlines()[0]}): check catalog.uri (a SQLAlchemy URL such as "
                    "postgresql+psycopg://user:password@host/db or sqlite:///path, best given as '${ENV_VAR}') and "
                    "that the database is up"
                ) from exc
        return self._catalog

    def _load(self) -> Table | None:
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        try:
            return self.catalog().load_table(self.identifier)
        except (NoSuchTableError, NoSuchNamespaceError):
            return None

    def _open(self, batch: BatchId) -> Table:
        table = self._load()
        if table is None:
            raise SinkError(
                f"{batch.describe()}: there is no Iceberg table {self.describe()} any more (it was created before the "
                "batch was written): restore it, or point the sink at a new table, which the next delivery creates"
            )
        return table

    @staticmethod
    def _locations_of(table: Table) -> tuple[str, str]:
        data = table.location_provider().new_data_location("x.parquet").rsplit("/", 1)[0]
        return data, table.location().rstrip("/")

    def _where(self) -> tuple[str, str]:
        """(data directory, table location); an executor built before prepare_target asks the catalog."""
        if self._locations is None:
            table = self._load()
            if table is None:
                raise SinkError(f"sink {self.name}: the Iceberg table {self.describe()} does not exist")
            self._locations = self._locations_of(table)
        return self._locations

    @staticmethod
    def _filesystem(location: str) -> tuple[pafs.FileSystem, str]:
        import pyarrow.fs as pafs

        filesystem, path = pafs.FileSystem.from_uri(location)
        return filesystem, path.rstrip("/")

    def _listing(self, location: str) -> list[str]:
        import pyarrow.fs as pafs

        filesystem, path = self._filesystem(location)
        selector = pafs.FileSelector(path, allow_not_found=True, recursive=False)
        return [i.base_name for i in filesystem.get_file_info(selector) if i.type == pafs.FileType.File]

    def _delete(self, location: str, names: list[str]) -> int:
        filesystem, path = self._filesystem(location)
        for name in names:
            filesystem.delete_file(f"{path}/{name}")
        return len(names)

    def _drop_staging(self, batch: BatchId) -> None:
        staging = f"{self._where()[1]}/{STAGING_DIR}"
        self._delete(staging, [n for n in self._listing(staging) if n.startswith(batch_prefix(batch))])

    # ------------------------------------------------------------------ schema

    def prepare_target(self, schema: pa.Schema) -> None:
        from pyiceberg.exceptions import NamespaceAlreadyExistsError, TableAlreadyExistsError

        want = sink_schema(schema, self.columns)
        catalog = self.catalog()
        table = self._load()
        if table is None:
            try:
                catalog.create_namespace(self.namespace)
            except NamespaceAlreadyExistsError:
                pass
            try:
                table = catalog.create_table(self.identifier, schema=want)
            except TableAlreadyExistsError:
                table = catalog.load_table(self.identifier)
            except (ValueError, TypeError) as exc:
                raise SinkSchemaError(
                    f"sink {self.name}: the upstream table's columns cannot be stored in Iceberg ({exc}): cast them "
                    "to types Iceberg has in the view the sink reads"
                ) from exc
        problems = iceberg_schema_differences(table, want)
        if problems:
            raise SinkSchemaError(
                f"sink {self.name}: the Iceberg table {self.describe()} exists with an incompatible schema "
                f"({'; '.join(problems)}). Epochal never casts silently: drop or rename that table, or point the "
                "sink at another table with table = '...'"
            )
        self._locations = self._locations_of(table)

    # ------------------------------------------------------------------ executors

    def write(self, task: WriterTask, batches: Iterator[pa.RecordBatch]) -> Mapping[str, Any]:
        opened = self._catalog is None and self._locations is None
        data, location = self._where()
        if opened:
            self.close()  # an executor asked the catalog once; keep no pool open in the Python worker
        filesystem, root = self._filesystem(data)
        name = lambda: data_file_name(task.batch, f"w{task.writer}")  # noqa: E731
        writer = RollingParquetWriter(filesystem, root, f"{data}/", name)
        try:
            out = write_task_rows(task, batches, self.type, self.columns, self.primary_key, writer)
            keys_file = None
            if out.keys is not None and out.keys.num_rows:
                staging_fs, staging = self._filesystem(f"{location}/{STAGING_DIR}")
                keys_file = f"{location}/{STAGING_DIR}/" + write_keys(
                    staging_fs, staging, task.batch, task.writer, out.keys
                )
        except OSError as exc:
            raise SinkError(
                f"{task.batch.describe()}: writer {task.writer} could not write its files under {data} ({exc}): "
                "check that the warehouse is writable from the Spark executors"
            ) from exc
        return {
            "files": [{"path": f.path, "size": f.size, "rows": f.rows} for f in out.files],
            "rows": out.rows,
            "keys_file": keys_file,
            "keys": 0 if out.keys is None else out.keys.num_rows,
        }

    # ------------------------------------------------------------------ driver

    def _delivered(self, table: Table) -> int | None:
        from pyiceberg.table.snapshots import ancestors_of

        recorded = table.properties.get(PROGRESS_PROPERTY.format(self.name))
        best = int(recorded) if recorded is not None else None
        for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
            summary = snapshot.summary
            if summary is not None and summary.get("epochal.sink") == self.name and summary.get("epochal.epoch"):
                epoch = int(summary["epochal.epoch"])
                best = epoch if best is None else max(best, epoch)
                break  # ancestors come newest first: the first of this sink is its latest
        return best

    def delivered_epoch(self) -> int | None:
        table = self._load()
        return None if table is None else self._delivered(table)

    def _files_of(self, batch: BatchId, metadata: Sequence[Mapping[str, Any]]) -> list[WrittenFile]:
        files = []
        for writer in metadata:
            for f in writer.get("files", []):
                if not f["path"].rsplit("/", 1)[-1].startswith(batch_prefix(batch)):
                    raise SinkError(
                        f"{batch.describe()}: a writer reported file {f['path']}, which is not one of this batch's "
                        "files: this is a bug in Epochal, please report it"
                    )
                files.append(WrittenFile(f["path"], int(f["size"]), int(f["rows"])))
        return files

    def commit(self, batch: BatchId, metadata: Sequence[Mapping[str, Any]]) -> None:
        """Commit the batch in one catalog commit, conditional on the table's head: another committer
        of the same batch (a claim taken over) may land first, and a commit retried on the new head
        would land the batch twice. pyiceberg's own retry does exactly that (it rebuilds the snapshot
        on the new head without asking whether the batch is there), so it is turned off on the table;
        on a conflict the table is loaded again and the delivered check asked again before a retry."""
        from pyiceberg.exceptions import CommitFailedException

        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            table = self._open(batch)
            self._locations = self._locations_of(table)
            if self._holds(table, batch):
                self._drop_staging(batch)
                return
            paths = [f.path for f in self._files_of(batch, metadata)]
            try:
                check_precommit(
                    batch, paths + [m["keys_file"] for m in metadata if m.get("keys_file")], self.describe()
                )
            except PrecommitLost:
                # the files go when a commit of the batch lands: by another committer since the load?
                fresh = self._load()
                if fresh is not None and self._holds(fresh, batch):
                    return
                raise
            if table.properties.get(COMMIT_RETRIES_PROPERTY) != "0":
                table = self._without_blind_retries(table)
                if table is None:
                    continue  # the table moved under the property change: look again
            try:
                self._commit_on(table, batch, paths, metadata)
            except CommitFailedException:
                # the head moved since the table was loaded: maybe the same batch, by another committer
                time.sleep(min(0.05 * 2**attempt, 1.0))
                continue
            self._drop_staging(batch)
            return
        raise SinkError(
            f"{batch.describe()}: the Iceberg table {self.describe()} changed under each of {COMMIT_ATTEMPTS} commits "
            "(another writer commits to it all the time); nothing of the batch is visible, and the coordinator "
            "retries it. Give the sink a table no other writer commits to"
        )

    def _holds(self, table: Table, batch: BatchId) -> bool:
        done = self._delivered(table)
        return done is not None and done >= batch.last_epoch

    def _without_blind_retries(self, table: Table) -> Table | None:
        """Set ``commit.retry.num-retries`` to 0 on the table (a commit of its own, with no snapshot: a
        conflict just fails it). Returns the table after it, or None when another commit won the race."""
        from pyiceberg.exceptions import CommitFailedException

        try:
            return table.transaction().set_properties(**{COMMIT_RETRIES_PROPERTY: "0"}).commit_transaction()
        except CommitFailedException:
            return None

    def _commit_on(self, table: Table, batch: BatchId, paths: list[str], metadata: Sequence[Mapping[str, Any]]) -> None:
        """One conditional commit of the batch on ``table`` (as loaded): raises CommitFailedException
        when the table's head is no longer the one it was built on, and changes nothing then."""
        from pyiceberg.exceptions import CommitFailedException
        from pyiceberg.io.pyarrow import parquet_file_to_data_file

        summary = {
            "epochal.sink": self.name,
            "epochal.first_epoch": str(batch.first_epoch),
            "epochal.epoch": str(batch.last_epoch),
        }
        tx = table.transaction()
        if tx.table_metadata.properties.get(NAME_MAPPING) is None:
            # the writers' files carry no Iceberg field ids: readers resolve their columns by name
            tx.set_properties(**{NAME_MAPPING: tx.table_metadata.schema().name_mapping.model_dump_json()})
        tx.set_properties(**{PROGRESS_PROPERTY.format(self.name): str(batch.last_epoch)})
        removed: list[Any] = []
        rewritten: list[str] = []
        try:
            if self.type == "upsert":
                keys_files = [m["keys_file"] for m in metadata if m.get("keys_file")]
                removed, rewritten = self._rewrite(table, batch, keys_files)
            if removed:
                from pyiceberg.expressions import AlwaysTrue

                with tx.update_snapshot(snapshot_properties=summary).overwrite() as overwrite:
                    # every manifest is checked for the removed files; the files were chosen above
                    overwrite.delete_by_predicate(AlwaysTrue())
                    for data_file in removed:
                        overwrite.delete_data_file(data_file)
                    for path in rewritten + paths:
                        overwrite.append_data_file(parquet_file_to_data_file(table.io, tx.table_metadata, path))
            elif paths:
                # replays never reach here (checked above), so the duplicate scan of every manifest is skipped
                tx.add_files(paths, snapshot_properties=summary, check_duplicate_files=False)
            tx.commit_transaction()
        except CommitFailedException:
            # the files rewritten for this attempt are nobody's: the next one rewrites what it finds
            for path in rewritten:
                directory, name = path.rsplit("/", 1)
                self._delete(directory, [name])
            raise
        except SinkError:
            raise
        except Exception as exc:
            raise SinkError(
                f"{batch.describe()}: the Iceberg commit to {self.describe()} failed "
                f"({redact_url(str(exc)).splitlines()[0] if str(exc) else type(exc).__name__}); nothing of the batch "
                "is visible, and the coordinator retries it"
            ) from exc

    def _rewrite(self, table: Table, batch: BatchId, keys_files: list[str]) -> tuple[list[Any], list[str]]:
        """The table's data files holding any of the batch's keys, and the paths of those files
        written again without them (copy-on-write, on the driver)."""
        import pyarrow.compute as pc
        from pyiceberg.expressions import AlwaysTrue
        from pyiceberg.io.pyarrow import ArrowScan

        if not keys_files:
            return [], []
        filesystem, _ = self._filesystem(keys_files[0])
        keys = read_keys(filesystem, [self._filesystem(p)[1] for p in keys_files], self.primary_key)
        if keys is None or keys.num_rows == 0:
            return [], []
        schema = table.schema()
        key_schema = schema.select(*self.primary_key)
        data, _ = self._where()
        data_fs, data_root = self._filesystem(data)
        removed, rewritten = [], []
        for task in table.scan(row_filter=_prune_filter(keys, self.primary_key)).plan_files():
            key_rows = ArrowScan(table.metadata, table.io, key_schema, AlwaysTrue()).to_table([task])
            if not pc.any(rows_matching(key_rows, keys, self.primary_key)).as_py():
                continue
            rows = ArrowScan(table.metadata, table.io, schema, AlwaysTrue()).to_table([task])
            kept = rows.filter(pc.invert(rows_matching(rows, keys, self.primary_key)))
            removed.append(task.file)
            if kept.num_rows:
                writer = RollingParquetWriter(data_fs, data_root, f"{data}/", lambda: data_file_name(batch, "rw"),
                                              kept.schema)
                for chunk in kept.to_batches():
                    writer.write(chunk)
                rewritten += [f.path for f in writer.close()]
        return removed, rewritten

    def _referenced(self, table: Table | None) -> set[str]:
        """Names of this sink's files any snapshot lists (an old snapshot serves time travel until
        expiry, so its files are never orphans)."""
        if table is None:
            return set()
        names: set[str] = set()
        seen: set[str] = set()
        prefix = sink_prefix(self.name)
        for snapshot in table.snapshots():
            for manifest in snapshot.manifests(table.io):
                if manifest.manifest_path in seen:
                    continue
                seen.add(manifest.manifest_path)
                for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
                    name = entry.data_file.file_path.rsplit("/", 1)[-1]
                    if name.startswith(prefix):
                        names.add(name)
        return names

    def abort(self, batch: BatchId, metadata: Sequence[Mapping[str, Any]]) -> None:
        table = self._load()
        if table is None:
            return
        self._locations = self._locations_of(table)
        data, _ = self._locations
        referenced = self._referenced(table)
        prefix = batch_prefix(batch)
        self._delete(data, [n for n in self._listing(data) if n.startswith(prefix) and n not in referenced])
        self._drop_staging(batch)

    def abort_orphans(self, keep: Sequence[BatchId]) -> int:
        table = self._load()
        if table is None:
            return 0
        self._locations = self._locations_of(table)
        data, location = self._locations
        kept = {b.token for b in keep}
        referenced = self._referenced(table)
        ours = lambda n: batch_of(n, self.name) not in (None, *kept)  # noqa: E731
        orphans = [n for n in self._listing(data) if ours(n) and n not in referenced]
        staging = f"{location}/{STAGING_DIR}"
        stale = [n for n in self._listing(staging) if ours(n)]
        return self._delete(data, orphans) + self._delete(staging, stale)

    def row_count(self) -> int | None:
        table = self._load()
        if table is None:
            return 0
        snapshot = table.current_snapshot()
        if snapshot is None:
            return 0
        summary = snapshot.summary
        deletes = sum(int(summary.get(k) or 0) for k in ("total-position-deletes", "total-equality-deletes"))
        if summary.get("total-records") is not None and deletes == 0:
            return int(summary["total-records"])
        return table.scan().count()


def _prune_filter(keys: pa.Table, primary_key: Sequence[str]):
    """A scan filter that keeps the files whose stats may hold one of ``keys``: a range per integer or
    date key column (exact in Iceberg's stats), with IS NULL when a key has NULLs."""
    import pyarrow as pa
    from pyiceberg.expressions import AlwaysTrue, And, GreaterThanOrEqual, IsNull, LessThanOrEqual, Or

    condition = AlwaysTrue()
    for k, (low, high, has_null) in key_ranges(keys, primary_key).items():
        t = keys.schema.field(k).type
        if not (pa.types.is_integer(t) or pa.types.is_date32(t)):
            continue
        column = None if low is None else And(GreaterThanOrEqual(k, low), LessThanOrEqual(k, high))
        if has_null:
            column = IsNull(k) if column is None else Or(column, IsNull(k))
        condition = column if isinstance(condition, AlwaysTrue) else And(condition, column)
    return condition


def _same_type(have: Any, want: Any) -> bool:
    """Iceberg types equal but for field ids: a table's nested fields have ids, a schema built
    from Arrow has none (-1), and pyiceberg's equality compares them."""
    from pyiceberg import types as it

    if isinstance(have, it.StructType) and isinstance(want, it.StructType):
        return len(have.fields) == len(want.fields) and all(
            h.name == w.name and h.required == w.required and _same_type(h.field_type, w.field_type)
            for h, w in zip(have.fields, want.fields, strict=True)
        )
    if isinstance(have, it.ListType) and isinstance(want, it.ListType):
        return have.element_required == want.element_required and _same_type(have.element_type, want.element_type)
    if isinstance(have, it.MapType) and isinstance(want, it.MapType):
        return (
            have.value_required == want.value_required
            and _same_type(have.key_type, want.key_type)
            and _same_type(have.value_type, want.value_type)
        )
    return have == want


def iceberg_schema_differences(table: Table, want: pa.Schema) -> list[str]:
    """Why an existing Iceberg table cannot take the sink's rows as they are (empty when it can).
    Columns match by name; types and required-ness must match exactly."""
    from pyiceberg.io.pyarrow import _pyarrow_to_schema_without_ids

    try:
        wanted_schema = _pyarrow_to_schema_without_ids(want)
    except (ValueError, TypeError) as exc:
        return [f"the sink's columns have no Iceberg type ({exc})"]
    have = {f.name.lower(): f for f in table.schema().fields}
    wanted = {f.name.lower(): f for f in wanted_schema.fields}
    problems = []
    for name, f in wanted.items():
        if name not in have:
            problems.append(f"missing column {f.name} {f.field_type}")
        elif have[name].name != f.name:
            problems.append(spelled_otherwise(f.name, have[name].name))
        elif not _same_type(have[name].field_type, f.field_type):
            problems.append(f"column {f.name} is {have[name].field_type}, the sink writes {f.field_type}")
        elif have[name].required and not f.required:
            problems.append(f"column {f.name} is required in the table, the sink's column may hold NULL")
    problems += [f"extra column {f.name} {f.field_type}" for n, f in have.items() if n not in wanted]
    if not table.spec().is_unpartitioned():
        problems.append("the table is partitioned; the sink writes unpartitioned tables")
    return problems
