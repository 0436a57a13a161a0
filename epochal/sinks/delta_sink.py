"""The Delta Lake sink: each batch is one Delta commit, delivered exactly once.

Batches are written by Spark's own Parquet writer (:meth:`DeltaTarget.spark_write`): into a staging
directory, then moved into the table directory under the batch's names. No reader sees them until
the driver commits their add actions; the commit carries the sink's *application transaction*
(``txn`` action: app id = the sink's name, version = the batch's last epoch), which Delta records
atomically with the files. Before committing, the driver reads that version and skips a batch the
table already holds, so a commit replayed after a crash changes nothing: the same mechanism Spark's
``foreachBatch`` writers use (``txnAppId``/``txnVersion``).

Upsert is copy-on-write on the executors, in the same one commit: a semi join finds the table's
files holding a key the batch touches (deleted, or written again), Spark writes their other rows
together with the batch's new rows, and the commit is ``remove`` (those files) + ``add`` (the new
ones) with the application transaction. :meth:`DeltaTarget.write` (Python writer tasks, keys staged
under ``_epochal_staging/`` and the rewrite on the driver) remains for callers without Spark.
"""

from __future__ import annotations

import json
import re
import time
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from epochal.redaction import redact_url
from epochal.sinks import delta_rules
from epochal.sinks.base import (
    WEIGHT,
    BatchId,
    SinkError,
    SinkSchemaError,
    SinkTarget,
    WriterResult,
    WriterTask,
    deletes_refused,
)
from epochal.sinks.lake_files import (
    STAGING_DIR,
    RollingParquetWriter,
    WrittenFile,
    batch_of,
    batch_prefix,
    check_precommit,
    data_file_name,
    delta_stats,
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
from epochal.storage.vnode import VNODE_COUNT

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.fs as pafs
    from deltalake import DeltaTable

_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def table_location(location: str, home: Path) -> str:
    """A Delta table's URI or absolute path; a relative path is under ``EPOCHAL_HOME``."""
    location = location.strip()
    if _URI.match(location):
        return location.rstrip("/")
    path = Path(location).expanduser()
    return str(path if path.is_absolute() else (home / path).resolve())


class DeltaTarget(SinkTarget):
    def __init__(
        self, name: str, options: Mapping[str, str], columns: Sequence[str], home: Path, meta_url: str | None = None
    ):
        self.name = name
        self.columns = list(columns)
        self.type = options.get("type", "append-only")
        self.primary_key = primary_key_columns(options, self.columns)
        self.location = table_location(options["location"], home)

    def describe(self) -> str:
        return f"delta:{redact_url(self.location)}"

    def local_paths(self) -> list[tuple[str, Path]]:
        return [] if _URI.match(self.location) else [("location", Path(self.location))]

    # ------------------------------------------------------------------ helpers

    def _filesystem(self) -> tuple[pafs.FileSystem, str]:
        import pyarrow.fs as pafs

        filesystem, root = pafs.FileSystem.from_uri(self.location)
        return filesystem, root.rstrip("/")

    def _table(self) -> DeltaTable | None:
        from deltalake import DeltaTable

        if not DeltaTable.is_deltatable(self.location):
            return None
        return DeltaTable(self.location)

    def _open(self, batch: BatchId) -> DeltaTable:
        table = self._table()
        if table is None:
            raise SinkError(
                f"{batch.describe()}: there is no Delta table at {self.describe()} any more (it was created before "
                "the batch was written): restore it, or point the sink at a new location, whose table the next "
                "delivery creates"
            )
        return table

    def _files_of(self, batch: BatchId, metadata: Sequence[Mapping[str, Any]]) -> list[WrittenFile]:
        """The batch's data files from its writers' metadata, checked to be the batch's own."""
        files = []
        for writer in metadata:
            for f in writer.get("files", []):
                if not Path(f["path"]).name.startswith(batch_prefix(batch)):
                    raise SinkError(
                        f"{batch.describe()}: a writer reported file {f['path']}, which is not one of this batch's "
                        "files: this is a bug in Epochal, please report it"
                    )
                files.append(WrittenFile(f["path"], int(f["size"]), int(f["rows"]), dict(f.get("stats") or {})))
        return files

    def _listing(self, directory: str) -> list[str]:
        """File names directly in ``directory`` (none when it does not exist)."""
        import pyarrow.fs as pafs

        filesystem, _ = self._filesystem()
        selector = pafs.FileSelector(directory, allow_not_found=True, recursive=False)
        return [i.base_name for i in filesystem.get_file_info(selector) if i.type == pafs.FileType.File]

    def _referenced(self, table: DeltaTable | None) -> set[str]:
        """This sink's files any table version lists: the current files and every file an add action
        in the log still names (a file a later upsert removed serves time travel until vacuum)."""
        import pyarrow as pa

        if table is None:
            return set()
        paths = {urllib.parse.unquote(p) for p in pa.table(table.get_add_actions()).column("path").to_pylist()}
        filesystem, root = self._filesystem()
        marker = f'"path":"{sink_prefix(self.name)}'
        for name in self._listing(f"{root}/_delta_log"):
            if not name.endswith(".json"):
                continue
            with filesystem.open_input_stream(f"{root}/_delta_log/{name}") as f:
                for line in f.read().decode().splitlines():
                    if marker in line and line.startswith('{"add"'):
                        paths.add(urllib.parse.unquote(json.loads(line)["add"]["path"]))
        return paths

    def _delete(self, paths: list[str]) -> int:
        filesystem, _ = self._filesystem()
        for path in paths:
            filesystem.delete_file(path)
        return len(paths)

    def _drop_staging(self, batch: BatchId) -> None:
        filesystem, root = self._filesystem()
        staging = f"{root}/{STAGING_DIR}"
        self._delete([f"{staging}/{n}" for n in self._listing(staging) if n.startswith(batch_prefix(batch))])
        for name in self._directories(staging):
            if name.startswith(batch_prefix(batch)):
                filesystem.delete_dir(f"{staging}/{name}")

    def _directories(self, directory: str) -> list[str]:
        import pyarrow.fs as pafs

        filesystem, _ = self._filesystem()
        selector = pafs.FileSelector(directory, allow_not_found=True, recursive=False)
        return [i.base_name for i in filesystem.get_file_info(selector) if i.type == pafs.FileType.Directory]

    # ------------------------------------------------------------------ schema

    def prepare_target(self, schema: pa.Schema) -> None:
        from deltalake import DeltaTable
        from deltalake.schema import Schema as DeltaSchema

        want = sink_schema(schema, self.columns)
        try:
            want_delta = DeltaSchema.from_arrow(want)
        except Exception as exc:
            raise SinkSchemaError(
                f"sink {self.name}: the upstream table's columns cannot be stored in Delta Lake ({exc}): "
                "cast them to types Delta has in the view the sink reads"
            ) from exc
        table = self._table()
        if table is None:
            try:
                DeltaTable.create(self.location, want_delta, mode="ignore", description=f"Epochal sink {self.name}")
            except Exception as exc:
                raise SinkError(
                    f"sink {self.name}: could not create the Delta table at {self.describe()} ({exc}): check that "
                    "the location is writable"
                ) from exc
            table = self._open(BatchId(self.name, 0, 0))
        problems = schema_differences(table, want_delta, self.type == "upsert")
        if problems:
            raise SinkSchemaError(
                f"sink {self.name}: the Delta table at {self.describe()} exists with an incompatible schema "
                f"({'; '.join(problems)}). Epochal never casts silently: move that table away, or point the sink "
                "at another location with location = '...'"
            )

    # ------------------------------------------------------------------ executors

    def write(self, task: WriterTask, batches: Iterator[pa.RecordBatch]) -> Mapping[str, Any]:
        filesystem, root = self._filesystem()
        writer = RollingParquetWriter(filesystem, root, "", lambda: data_file_name(task.batch, f"w{task.writer}"))
        try:
            out = write_task_rows(task, batches, self.type, self.columns, self.primary_key, writer)
            keys_file = None
            if out.keys is not None and out.keys.num_rows:
                name = write_keys(filesystem, f"{root}/{STAGING_DIR}", task.batch, task.writer, out.keys)
                keys_file = f"{STAGING_DIR}/{name}"
        except OSError as exc:
            raise SinkError(
                f"{task.batch.describe()}: writer {task.writer} could not write its files into {self.describe()} "
                f"({exc}): check that the location is writable from the Spark executors"
            ) from exc
        return {
            "files": [f.to_json() for f in out.files],
            "rows": out.rows,
            "keys_file": keys_file,
            "keys": 0 if out.keys is None else out.keys.num_rows,
        }

    def spark_write(self, frame: Any, batch: BatchId, writers: int) -> list[WriterResult] | None:
        """Write the batch with Spark's own Parquet writer: no row passes through Python (the
        JVM-to-Python hand-over alone cost more than a third of a plain write) nor the driver.

        Append-only: the rows, each weight n as n copies. Upsert (copy-on-write, on the executors):
        the table's files holding a key the batch touches are found by a semi join, written again
        without those keys together with the batch's new rows, and listed as files to remove; the
        commit then removes and adds in one Delta commit. Either way one Spark job writes a staging
        directory, whose files move into the table under this batch's names."""
        from pyspark.sql import functions as F

        from epochal.sql import quote

        columns = [F.col(quote(c)) for c in self.columns]
        if self.type == "append-only":
            # Raised inside Spark's tasks, the error comes back as text: on a line of its own, its
            # kind is read from it by the coordinator (not retried) like a Python writer's traceback.
            error = deletes_refused(batch.describe())
            refused = f"\n{type(error).__name__}: {error}\n"
            weight = F.when(F.col(WEIGHT) < 0, F.raise_error(F.lit(refused))).otherwise(F.col(WEIGHT)).cast("int")
            copies = F.explode(F.array_repeat(F.lit(0), weight)).alias("_epochal_copy")  # weight n: n rows
            files = self._spark_files(frame.select(*columns, copies).drop("_epochal_copy"), batch, "s")
            total = sum(f.rows for f in files)
            metadata = {"files": [f.to_json() for f in files], "rows": total, "keys_file": None, "keys": 0}
            return [WriterResult(0, (0, VNODE_COUNT - 1), total, metadata)]
        return [self._spark_upsert(frame, batch, columns)]

    def _spark_upsert(self, frame: Any, batch: BatchId, columns: list[Any]) -> WriterResult:
        from pyspark.sql import functions as F

        from epochal.sql import quote

        keys = [quote(k) for k in self.primary_key]
        inserts = frame.where(F.col(WEIGHT) > 0)
        # The loader proved the key unique in the view: more than one row to write for a key is a bug.
        clashes = (
            inserts.groupBy(*keys)
            .agg(F.count(F.lit(1)).alias("n"), F.sum(WEIGHT).alias("w"))
            .where((F.col("n") > 1) | (F.col("w") > 1))
            .limit(1)
            .count()
        )
        if clashes:
            raise SinkError(
                f"{batch.describe()}: key(s) of ({', '.join(self.primary_key)}) have more than one row to write "
                "although the key was proven unique at load: this is a bug in Epochal, please report it"
            )
        touched = frame.select(*keys).distinct()
        table = self._open(batch)
        # the table's files by their path as the log writes it, and the path on disk
        infos = {i["path"]: i for i in _add_infos(table)}
        current = {urllib.parse.unquote(raw): raw for raw in infos}
        removes: list[dict[str, Any]] = []
        kept = None
        if current:
            spark = frame.sparkSession
            existing = spark.read.schema(_spark_schema(frame, self.columns)).parquet(
                *[f"{self.location.rstrip('/')}/{p}" for p in sorted(current)]
            ).withColumn("_epochal_file", F.input_file_name())
            # NULL keys match NULL keys, as a key's row is found again when the key holds a NULL
            match = [existing[quote(k)].eqNullSafe(touched[quote(k)]) for k in self.primary_key]
            hit_names = {
                Path(urllib.parse.urlparse(r[0]).path).name
                for r in existing.join(touched, match, "left_semi").select("_epochal_file").distinct().collect()
            }
            hit = sorted(p for p in current if Path(p).name in hit_names)
            if hit:
                removes = [{"path": current[p], "size": int(infos[current[p]]["size_bytes"])} for p in hit]
                old = spark.read.schema(_spark_schema(frame, self.columns)).parquet(
                    *[f"{self.location.rstrip('/')}/{p}" for p in hit]
                )
                kept = old.join(touched, [old[quote(k)].eqNullSafe(touched[quote(k)]) for k in self.primary_key],
                                "left_anti")  # fmt: skip
        rows = inserts.select(*columns)
        if kept is not None:
            rows = kept.select(*columns).unionByName(rows)
        files = self._spark_files(rows, batch, "u")
        total = sum(f.rows for f in files)
        metadata = {
            "files": [f.to_json() for f in files],
            "removes": removes,
            "rows": total,
            "keys_file": None,
            "keys": 0,
        }
        return WriterResult(0, (0, VNODE_COUNT - 1), total, metadata)

    def _spark_files(self, rows: Any, batch: BatchId, tag: str) -> list[WrittenFile]:
        """Spark writes ``rows`` into a staging directory of this batch; its files move into the table
        under the batch's names (not visible until the commit lists them)."""
        import pyarrow.parquet as pq

        filesystem, root = self._filesystem()
        name = f"{batch_prefix(batch)}spark"
        staging = f"{root}/{STAGING_DIR}/{name}"
        spark = rows.sparkSession
        # Delta's timestamps are microseconds; Spark's default INT96 is not one of its types.
        previous = spark.conf.get("spark.sql.parquet.outputTimestampType")
        spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        try:
            rows.write.mode("overwrite").option("compression", "zstd").parquet(
                f"{self.location.rstrip('/')}/{STAGING_DIR}/{name}"
            )
        finally:
            spark.conf.set("spark.sql.parquet.outputTimestampType", previous)
        files: list[WrittenFile] = []
        for index, part in enumerate(sorted(n for n in self._listing(staging) if n.endswith(".parquet"))):
            final = data_file_name(batch, f"{tag}{index}")
            filesystem.move(f"{staging}/{part}", f"{root}/{final}")
            metadata = pq.read_metadata(f"{root}/{final}", filesystem=filesystem)
            size = filesystem.get_file_info(f"{root}/{final}").size
            stats = delta_stats(metadata, metadata.schema.to_arrow_schema())
            files.append(WrittenFile(final, size, metadata.num_rows, stats))
        filesystem.delete_dir(staging)
        return files

    # ------------------------------------------------------------------ driver

    def check_rows(self, batch: BatchId, metadata: Sequence[Mapping[str, Any]]) -> None:
        """The table's CHECK constraints, invariants and generated columns over the batch's new
        files (delta_rules.py): delta-rs's transaction API, which commits them, checks none."""
        files = self._files_of(batch, metadata)
        if not files:
            return
        rules = delta_rules.row_rules(self._open(batch))
        filesystem, root = self._filesystem()
        where = f"{batch.describe()}: the Delta table at {self.describe()}"
        delta_rules.check_rows(rules, [f"{root}/{f.path}" for f in files], filesystem, where)

    def commit(self, batch: BatchId, metadata: Sequence[Mapping[str, Any]]) -> None:
        from deltalake.transaction import AddAction, CommitProperties, RemoveAction, Transaction

        table = self._open(batch)
        done = table.transaction_version(self.name)
        if done is not None and done >= batch.last_epoch:
            # Committed before (the coordinator replays a PENDING batch after a crash): keep the table.
            self._drop_staging(batch)
            return
        files = self._files_of(batch, metadata)
        now = int(time.time() * 1000)
        actions: list[Any] = []
        filesystem, root = self._filesystem()
        key_names = [m["keys_file"] for m in metadata if m.get("keys_file")]
        check_precommit(batch, [f"{self.location}/{p}" for p in [f.path for f in files] + key_names], self.describe())
        keys_files = [f"{root}/{k}" for k in key_names]
        removes = [r for m in metadata for r in m.get("removes", [])]
        if removes:
            # Files the executors' copy-on-write replaces: still the table's, or the table changed
            # under the sink (another writer), and removing them would lose that writer's rows.
            current = set(_add_paths(table))
            gone = [r["path"] for r in removes if r["path"] not in current]
            if gone:
                raise SinkError(
                    f"{batch.describe()}: {len(gone)} file(s) the batch rewrote left the Delta table at "
                    f"{self.describe()} before its commit (first: {gone[0]}): another writer changed the table; "
                    "a sink must be the only writer of its table"
                )
            actions += [RemoveAction(r["path"], True, now, int(r["size"]), {}) for r in removes]
        if self.type == "upsert":
            keys = read_keys(filesystem, keys_files, self.primary_key)
            if keys is not None and keys.num_rows:
                actions += self._rewrite(table, batch, keys, now)
        actions += [AddAction(f.path, f.size, {}, now, True, json.dumps(f.stats)) for f in files]
        properties = CommitProperties(
            custom_metadata={
                "epochal.sink": self.name,
                "epochal.first_epoch": batch.first_epoch,
                "epochal.last_epoch": batch.last_epoch,
            },
            app_transactions=[Transaction(self.name, batch.last_epoch)],
        )
        try:
            table.create_write_transaction(actions, mode="append", schema=table.schema(), commit_properties=properties)
        except Exception as exc:
            raise SinkError(
                f"{batch.describe()}: the Delta commit to {self.describe()} failed ({exc}); nothing of the batch is "
                "visible, and the coordinator retries it"
            ) from exc
        self._drop_staging(batch)

    def _rewrite(self, table: DeltaTable, batch: BatchId, keys: pa.Table, now: int) -> list[Any]:
        """Remove actions for the table's files holding any of ``keys``, and add actions for those
        files written again without them (copy-on-write, on the driver)."""
        import pyarrow as pa
        import pyarrow.compute as pc
        from deltalake.transaction import AddAction, RemoveAction

        filesystem, root = self._filesystem()
        dataset = table.to_pyarrow_dataset()
        fragments = {urllib.parse.unquote(f.path): f for f in dataset.get_fragments()}
        ranges = {
            k: r for k, r in key_ranges(keys, self.primary_key).items()
            if pa.types.is_integer(keys.schema.field(k).type) or pa.types.is_date32(keys.schema.field(k).type)
        }
        actions: list[Any] = []
        for info in pa.table(table.get_add_actions(flatten=True)).to_pylist():
            if not _may_hold(info, ranges):
                continue
            path = urllib.parse.unquote(info["path"])
            fragment = fragments.get(path)
            if fragment is None:
                raise SinkError(
                    f"{batch.describe()}: the Delta table at {self.describe()} lists {path}, which its dataset does "
                    "not read: this is a bug in Epochal, please report it"
                )
            hits = rows_matching(fragment.to_table(schema=dataset.schema, columns=list(self.primary_key)), keys,
                                 self.primary_key)
            if not pc.any(hits).as_py():
                continue
            rows = fragment.to_table(schema=dataset.schema)
            kept = rows.filter(pc.invert(rows_matching(rows, keys, self.primary_key)))
            actions.append(RemoveAction(info["path"], True, now, int(info["size_bytes"]), {}))
            if kept.num_rows:
                writer = RollingParquetWriter(filesystem, root, "", lambda: data_file_name(batch, "rw"),
                                              dataset.schema)
                for chunk in kept.to_batches():
                    writer.write(chunk)
                actions += [AddAction(f.path, f.size, {}, now, True, json.dumps(f.stats)) for f in writer.close()]
        return actions

    def abort(self, batch: BatchId, metadata: Sequence[Mapping[str, Any]]) -> None:
        _, root = self._filesystem()
        referenced = self._referenced(self._table())
        prefix = batch_prefix(batch)
        self._delete([f"{root}/{n}" for n in self._listing(root) if n.startswith(prefix) and n not in referenced])
        self._drop_staging(batch)

    def abort_orphans(self, keep: Sequence[BatchId]) -> int:
        _, root = self._filesystem()
        kept = {b.token for b in keep}
        referenced = self._referenced(self._table())
        doomed = []
        for name in self._listing(root):
            token = batch_of(name, self.name)
            if token is not None and token not in kept and name not in referenced:
                doomed.append(f"{root}/{name}")
        for name in self._listing(f"{root}/{STAGING_DIR}"):
            token = batch_of(name, self.name)
            if token is not None and token not in kept:
                doomed.append(f"{root}/{STAGING_DIR}/{name}")
        filesystem, _ = self._filesystem()
        dropped = 0
        for name in self._directories(f"{root}/{STAGING_DIR}"):  # Spark's output of a killed run
            token = batch_of(name, self.name)
            if token is not None and token not in kept:
                filesystem.delete_dir(f"{root}/{STAGING_DIR}/{name}")
                dropped += 1
        return self._delete(doomed) + dropped

    def delivered_epoch(self) -> int | None:
        table = self._table()
        return None if table is None else table.transaction_version(self.name)

    def row_count(self) -> int | None:
        import pyarrow as pa

        table = self._table()
        if table is None:
            return 0
        counts = pa.table(table.get_add_actions()).column("num_records")
        if counts.null_count == 0:
            return sum(counts.to_pylist())
        return table.to_pyarrow_dataset().count_rows()


def _add_infos(table: DeltaTable) -> list[dict[str, Any]]:
    import pyarrow as pa

    return pa.table(table.get_add_actions(flatten=True)).to_pylist()


def _add_paths(table: DeltaTable) -> list[str]:
    return [i["path"] for i in _add_infos(table)]


def _spark_schema(frame: Any, columns: Sequence[str]) -> Any:
    """The sink's columns as typed in ``frame``, to read the table's files with."""
    from pyspark.sql.types import StructType

    fields = {f.name: f for f in frame.schema.fields}
    return StructType([fields[c] for c in columns])


def _may_hold(info: Mapping[str, Any], ranges: Mapping[str, tuple[Any, Any, bool]]) -> bool:
    """Whether a file (an add action with flattened stats) may hold one of the keys, by its min/max
    and null counts; a file without stats may hold anything."""
    for k, (low, high, has_null) in ranges.items():
        nulls, rows = info.get(f"null_count.{k}"), info.get("num_records")
        fmin, fmax = info.get(f"min.{k}"), info.get(f"max.{k}")
        null_hit = has_null and (nulls is None or nulls > 0)
        if fmin is None or fmax is None:
            if nulls is not None and rows is not None and nulls == rows:
                value_hit = False  # only NULLs in this column
            else:
                value_hit = True
        else:
            value_hit = low is not None and not (fmax < low or fmin > high)
        if not (null_hit or value_hit):
            return False
    return True


def schema_differences(table: DeltaTable, want: Any, upsert: bool) -> list[str]:
    """Why an existing Delta table cannot take the sink's rows as they are (empty when it can).
    Columns match by name (Delta reads by name), spelled the same; types and NOT NULL must match
    exactly."""
    have_fields = json.loads(table.schema().to_json())["fields"]
    want_fields = json.loads(want.to_json())["fields"]
    have = {f["name"].lower(): f for f in have_fields}
    wanted = {f["name"].lower(): f for f in want_fields}
    problems = []
    for name, f in wanted.items():
        if name not in have:
            problems.append(f"missing column {f['name']} {_type_name(f['type'])}")
        elif have[name]["name"] != f["name"]:
            problems.append(spelled_otherwise(f["name"], have[name]["name"]))
        elif have[name]["type"] != f["type"]:
            problems.append(
                f"column {f['name']} is {_type_name(have[name]['type'])}, the sink writes {_type_name(f['type'])}"
            )
        elif not have[name]["nullable"] and f["nullable"]:
            problems.append(f"column {f['name']} is NOT NULL in the table, the sink's column may hold NULL")
    problems += [f"extra column {f['name']} {_type_name(f['type'])}" for n, f in have.items() if n not in wanted]
    partitions = table.metadata().partition_columns
    if partitions:
        problems.append(f"the table is partitioned by {', '.join(partitions)}; the sink writes unpartitioned tables")
    configuration = table.metadata().configuration
    if upsert and str(configuration.get("delta.appendOnly", "false")).lower() == "true":
        problems.append(
            "the table is append-only (delta.appendOnly = true), and an upsert sink rewrites files; "
            "use type = 'append-only' or unset the property"
        )
    problems += delta_rules.unsupported_columns(table)
    mapping = configuration.get("delta.columnMapping.mode", "none")
    if mapping not in ("none", None):
        problems.append(f"the table uses column mapping ({mapping}), which the sink does not write")
    features = set(table.protocol().reader_features or [])
    if upsert and "deletionVectors" in features:
        problems.append("the table has deletion vectors enabled, which the upsert's copy-on-write does not read")
    return problems


def _type_name(delta_type: Any) -> str:
    return delta_type if isinstance(delta_type, str) else json.dumps(delta_type, separators=(",", ":"))
