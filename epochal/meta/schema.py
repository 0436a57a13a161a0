"""Meta-store tables. Plain SQL that DuckDB and PostgreSQL both accept, so one schema serves both."""

from __future__ import annotations

SCHEMA_VERSION = 1

DDL = (
    """CREATE TABLE IF NOT EXISTS epochs (
        epoch BIGINT PRIMARY KEY,
        prev_epoch BIGINT,
        kind VARCHAR NOT NULL,
        state VARCHAR NOT NULL,
        injected_at DOUBLE PRECISION NOT NULL,
        committed_at DOUBLE PRECISION,
        owner_host VARCHAR,
        owner_pid INTEGER,
        owner_run VARCHAR,
        heartbeat_at DOUBLE PRECISION,
        failure VARCHAR
    )""",
    # Offsets are fixed at injection and never change: re-running an epoch reads the same records.
    """CREATE TABLE IF NOT EXISTS epoch_offsets (
        epoch BIGINT NOT NULL,
        source VARCHAR NOT NULL,
        split VARCHAR NOT NULL,
        start_offset BIGINT NOT NULL,
        end_offset BIGINT NOT NULL,
        PRIMARY KEY (epoch, source, split)
    )""",
    """CREATE TABLE IF NOT EXISTS collected (
        epoch BIGINT NOT NULL,
        asset VARCHAR NOT NULL,
        location VARCHAR,
        rows_in BIGINT,
        rows_out BIGINT,
        dead_letters BIGINT,
        dead_letter_location VARCHAR,
        seconds DOUBLE PRECISION,
        run_id VARCHAR,
        collected_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (epoch, asset)
    )""",
    """CREATE TABLE IF NOT EXISTS table_epochs (
        table_name VARCHAR PRIMARY KEY,
        committed_epoch BIGINT
    )""",
    # When a table joined a pipeline that had history (NULL: from the pipeline's first epoch): a
    # process that read its SQL files before then does not name it, which is not a removal.
    "ALTER TABLE table_epochs ADD COLUMN IF NOT EXISTS registered_at DOUBLE PRECISION",
    # The committed epoch when a source joined a pipeline with history (NULL: from the first epoch):
    # its state is the changes after it, since its first epoch reads its splits from their start.
    "ALTER TABLE table_epochs ADD COLUMN IF NOT EXISTS joined_epoch BIGINT",
    """CREATE TABLE IF NOT EXISTS controller (
        key VARCHAR PRIMARY KEY,
        value VARCHAR
    )""",
    """CREATE TABLE IF NOT EXISTS recoveries (
        id BIGINT PRIMARY KEY,
        reason VARCHAR NOT NULL,
        started_at DOUBLE PRECISION NOT NULL,
        finished_at DOUBLE PRECISION,
        committed_epoch BIGINT,
        aborted_epochs VARCHAR,
        attempts INTEGER,
        error VARCHAR
    )""",
    # One row per delivery attempt of a sink (epochal/checkpoint/sinks/coordinator.py): a batch of
    # consecutive committed epochs, PENDING with its writers' pre-commit metadata before anything
    # is committed downstream, then COMMITTED; or ABORTED, with ``cleaned`` once its pre-commit is
    # thrown away. ``nonce`` tells apart racing runs' attempts of the same epochs.
    """CREATE TABLE IF NOT EXISTS sink_batches (
        sink VARCHAR NOT NULL,
        first_epoch BIGINT NOT NULL,
        last_epoch BIGINT NOT NULL,
        attempt INTEGER NOT NULL,
        nonce VARCHAR NOT NULL,
        state VARCHAR NOT NULL,
        metadata VARCHAR,
        rows_written BIGINT,
        error VARCHAR,
        cleaned BOOLEAN NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (sink, first_epoch, attempt, nonce)
    )""",
    # Who delivers a sink now: one run at a time, so that a delivery's recovery (which throws away
    # pre-commits of no PENDING batch) never throws away the pre-commit of a run still working.
    # The owner renews heartbeat_at; a claim older than the epoch timeout belongs to a dead run.
    """CREATE TABLE IF NOT EXISTS sink_claims (
        sink VARCHAR PRIMARY KEY,
        owner VARCHAR NOT NULL,
        heartbeat_at DOUBLE PRECISION NOT NULL
    )""",
    # Snapshots of a table's state at a committed epoch (epochal/storage/compaction.py). A row is
    # inserted as WRITING (owner may still be writing the files: recovery keeps them while the owner
    # lives) and turned READY in the one transaction that publishes it; readers only use READY rows,
    # and only one READY row per (table, epoch) ever exists. Added after version 1 with IF NOT
    # EXISTS, so older stores gain it without a version bump.
    """CREATE TABLE IF NOT EXISTS snapshots (
        location VARCHAR PRIMARY KEY,
        table_name VARCHAR NOT NULL,
        epoch BIGINT NOT NULL,
        state VARCHAR NOT NULL,
        distribution_key VARCHAR NOT NULL,
        spark_schema VARCHAR NOT NULL,
        rows_out BIGINT,
        files_out BIGINT,
        owner_host VARCHAR,
        owner_pid INTEGER,
        started_at DOUBLE PRECISION NOT NULL,
        finished_at DOUBLE PRECISION
    )""",
    # Per table, the newest epoch whose change files compaction deleted (their ``collected.location``
    # is set to NULL in the same transaction): state at or before it can only be read from a snapshot.
    """CREATE TABLE IF NOT EXISTS table_retention (
        table_name VARCHAR PRIMARY KEY,
        changes_dropped_upto BIGINT NOT NULL
    )""",
    # Per source split, where its next epoch starts (``reserved_end``: the end of the newest epoch that
    # is not aborted) and where its committed records end (``committed_end``). Injection reads and
    # writes one row per split instead of scanning ``epoch_offsets``; commit advances
    # ``committed_end``; recovery sets ``reserved_end`` back to it. Stores from before it get it
    # filled once from ``epoch_offsets`` (``CheckpointController`` on open).
    """CREATE TABLE IF NOT EXISTS split_frontier (
        source VARCHAR NOT NULL,
        split VARCHAR NOT NULL,
        reserved_end BIGINT NOT NULL,
        committed_end BIGINT,
        PRIMARY KEY (source, split)
    )""",
    # Where a sink starts, decided once at its first delivery (epochal/checkpoint/sinks/coordinator.py)
    # so that every later run and recovery agrees. ``history_upto``: the newest committed epoch before
    # the sink's first delivery step; the table's state at it is delivered as one snapshot batch
    # (``snapshot``) or never (not ``snapshot``). NULL: the sink was there from the first epoch.
    """CREATE TABLE IF NOT EXISTS sink_starts (
        sink VARCHAR PRIMARY KEY,
        snapshot BOOLEAN NOT NULL,
        history_upto BIGINT,
        decided_at DOUBLE PRECISION NOT NULL
    )""",
    # A compaction renews its snapshot's lease while it writes (epochal/checkpoint/catalog.py):
    # recovery reaps a WRITING snapshot whose lease is older than the epoch timeout, not one whose
    # compaction is merely long.
    "ALTER TABLE snapshots ADD COLUMN IF NOT EXISTS heartbeat_at DOUBLE PRECISION",
    # Backfills of views added to a running pipeline (epochal/checkpoint/backfills/log.py): one row
    # per view, its phase (epochal/checkpoint/backfills/state.py), the snapshot epoch its rows start from, the
    # newest epoch it has written, progress, and who works on it now (one runner at a time).
    """CREATE TABLE IF NOT EXISTS backfills (
        view_name VARCHAR PRIMARY KEY,
        upstreams VARCHAR NOT NULL,
        phase VARCHAR NOT NULL,
        snapshot_epoch BIGINT NOT NULL,
        caught_up_epoch BIGINT,
        vnodes_done INTEGER NOT NULL,
        rows_read BIGINT NOT NULL,
        rows_written BIGINT NOT NULL,
        rate_limit DOUBLE PRECISION,
        started_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        joined_epoch BIGINT,
        error VARCHAR,
        snapshot_location VARCHAR,
        owner VARCHAR,
        heartbeat_at DOUBLE PRECISION
    )""",
    # When the view joined: epochs injected before then had their live step skip it (its runner
    # writes them), which tells a killed runner's gap from a partial run's.
    "ALTER TABLE backfills ADD COLUMN IF NOT EXISTS joined_at DOUBLE PRECISION",
    # The vnode ranges of a backfill's snapshot phase that are written: a killed runner resumes at
    # the first range without a row. ``nonce`` names the range's files in the snapshot directory.
    """CREATE TABLE IF NOT EXISTS backfill_chunks (
        view_name VARCHAR NOT NULL,
        vnode_lo INTEGER NOT NULL,
        vnode_hi INTEGER NOT NULL,
        state VARCHAR NOT NULL,
        nonce VARCHAR NOT NULL,
        rows_read BIGINT NOT NULL,
        rows_written BIGINT NOT NULL,
        finished_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (view_name, vnode_lo)
    )""",
    # What each view's stored state was computed from (a fingerprint of its query, columns and
    # refresh mode): a view whose statement changed under the same name must not go on from state
    # its old query made.
    """CREATE TABLE IF NOT EXISTS table_definitions (
        table_name VARCHAR PRIMARY KEY,
        fingerprint VARCHAR NOT NULL
    )""",
    # Views whose statement changed after they committed epochs (epochal/checkpoint/statements/rebuilds.py):
    # the old rows serve while the new statement backfills under a shadow name, until the switch.
    # The column names the stored rows have (JSON list): a changed view that a sink reads must
    # keep them, since the sink's target was made with them (epochal/checkpoint/statements/views.py).
    "ALTER TABLE table_definitions ADD COLUMN IF NOT EXISTS columns VARCHAR",
    """CREATE TABLE IF NOT EXISTS view_rebuilds (
        view_name VARCHAR PRIMARY KEY,
        state VARCHAR NOT NULL,
        old_fingerprint VARCHAR NOT NULL,
        new_fingerprint VARCHAR NOT NULL,
        frozen_epoch BIGINT NOT NULL,
        switched_epoch BIGINT,
        switch_snapshot VARCHAR,
        started_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL
    )""",
    # Why a rebuild cannot switch yet, shown by `epochal status` (e.g. its new statement changes the
    # type of a column that a sink or a view reads); NULL when nothing holds it.
    "ALTER TABLE view_rebuilds ADD COLUMN IF NOT EXISTS held VARCHAR",
    # Whether the old statement is maintained while the new one backfills (epochal/runtime/rebuild_step.py):
    # PENDING until the first step decides, then MAINTAINED or FROZEN. NULL: a rebuild started
    # before the old rows could be maintained, frozen since.
    "ALTER TABLE view_rebuilds ADD COLUMN IF NOT EXISTS old_rows VARCHAR",
    # When a definition's fingerprint was recorded, and when a rebuild's new statement was: a
    # process that read its SQL files before then holds an older statement, which must neither
    # undo the change nor compute the view (epochal/checkpoint/statements/views.py). NULL: before this.
    "ALTER TABLE table_definitions ADD COLUMN IF NOT EXISTS recorded_at DOUBLE PRECISION",
    "ALTER TABLE view_rebuilds ADD COLUMN IF NOT EXISTS fingerprint_at DOUBLE PRECISION",
    # Every view statement a pipeline ran, by fingerprint (JSON: query, options, refresh): a
    # rebuild finds the old statement here to keep maintaining the old rows while the new backfills.
    """CREATE TABLE IF NOT EXISTS view_statements (
        fingerprint VARCHAR PRIMARY KEY,
        statement VARCHAR NOT NULL,
        recorded_at DOUBLE PRECISION NOT NULL
    )""",
    # Source backfill (epochal/checkpoint/backfills/split_rows.py): where each split's history starts
    # (the first offset the source ever planned for it: 0, or the end of the log under
    # scan.startup.mode = 'latest'), set when the split is first seen; NULL in older stores.
    "ALTER TABLE split_frontier ADD COLUMN IF NOT EXISTS first_offset BIGINT",
    # The SOURCE inputs a backfill reads from their splits (JSON list; NULL until decided).
    "ALTER TABLE backfills ADD COLUMN IF NOT EXISTS split_sources VARCHAR",
    # Per split of those sources, its state (epochal/checkpoint/backfills/splits.py) and how far it is read.
    """CREATE TABLE IF NOT EXISTS backfill_splits (
        view_name VARCHAR NOT NULL,
        source VARCHAR NOT NULL,
        split VARCHAR NOT NULL,
        phase VARCHAR NOT NULL,
        read_offset BIGINT NOT NULL,
        target BIGINT NOT NULL,
        rows_read BIGINT NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (view_name, source, split)
    )""",
    # The files each chunk read from a split went to, recorded with the split's new offset.
    """CREATE TABLE IF NOT EXISTS backfill_split_chunks (
        view_name VARCHAR NOT NULL,
        source VARCHAR NOT NULL,
        split VARCHAR NOT NULL,
        start_offset BIGINT NOT NULL,
        end_offset BIGINT NOT NULL,
        rows_read BIGINT NOT NULL,
        location VARCHAR NOT NULL,
        PRIMARY KEY (view_name, location)
    )""",
    # Files of a view's state dropped when its statement changed (epochal/checkpoint/statements/views.py),
    # listed in the dropping transaction and deleted by the next run: a location, or the directory
    # of the backfill at ``backfill_epoch`` (its unpublished ranges and chunks are named by no row;
    # also listed when a backfill that had written nothing moves its snapshot epoch up).
    """CREATE TABLE IF NOT EXISTS dropped_files (
        table_name VARCHAR NOT NULL,
        location VARCHAR,
        backfill_epoch BIGINT,
        dropped_at DOUBLE PRECISION NOT NULL
    )""",
    # Tables (sources and views) that left the pipeline and were retired, with when: a run that
    # loaded the pipeline before then still names them, and must neither wait for them at a commit
    # nor write them again (epochal/checkpoint/backfills/rows.py). A process that loaded the
    # pipeline after the retirement and names the table again brings it back.
    """CREATE TABLE IF NOT EXISTS retired_tables (
        table_name VARCHAR PRIMARY KEY,
        retired_at DOUBLE PRECISION NOT NULL
    )""",
    # Files retention let go of (old snapshots, change files every reader is past: catalog.py),
    # kept on disk until no reader can still be scanning them (epochal/checkpoint/retired_files.py):
    # a step of an epoch injected up to ``retired_epoch`` may have chosen them before they were
    # retired. Recovery's sweep keeps them while they are listed here.
    """CREATE TABLE IF NOT EXISTS retired_files (
        location VARCHAR PRIMARY KEY,
        table_name VARCHAR NOT NULL,
        retired_at DOUBLE PRECISION NOT NULL,
        retired_epoch BIGINT
    )""",
    # Each source's declaration (JSON: kind, primary key, columns and types) its stored rows and
    # the views over it were written with: a changed type or key is refused at injection, a column
    # added or removed is recorded (epochal/checkpoint/statements/sources.py).
    """CREATE TABLE IF NOT EXISTS source_declarations (
        source_name VARCHAR PRIMARY KEY,
        declaration VARCHAR NOT NULL,
        recorded_at DOUBLE PRECISION NOT NULL
    )""",
    # What each sink reads and where it writes, recorded at its first delivery: a sink whose target
    # changed under the same name is refused (epochal/checkpoint/statements/sinks.py).
    # ``refused``: why the last delivery step refused (shown by `epochal status`), until one is not.
    """CREATE TABLE IF NOT EXISTS sink_declarations (
        sink VARCHAR PRIMARY KEY,
        declaration VARCHAR NOT NULL,
        recorded_at DOUBLE PRECISION NOT NULL,
        refused VARCHAR
    )""",
    "ALTER TABLE sink_declarations ADD COLUMN IF NOT EXISTS refused VARCHAR",
    # How to reach the target again once the sink left the pipeline with batches not finished (its
    # connector, options as written, ``${NAME}`` references unresolved and literal secrets left out,
    # and columns): JSON of ``SinkRecipe``, kept current by every delivery step.
    "ALTER TABLE sink_declarations ADD COLUMN IF NOT EXISTS recipe VARCHAR",
    # One row per check and committed epoch (epochal/checkpoint/checks.py): whether its query found
    # offending rows, how many, up to 5 of them as JSON; an ``error`` check that failed holds the
    # epoch back from the sinks downstream until a later epoch passes or ``released_at`` is set.
    """CREATE TABLE IF NOT EXISTS check_results (
        check_name VARCHAR NOT NULL,
        epoch BIGINT NOT NULL,
        table_name VARCHAR NOT NULL,
        severity VARCHAR NOT NULL,
        passed BOOLEAN NOT NULL,
        failed_rows BIGINT NOT NULL,
        sample VARCHAR,
        evaluated_at DOUBLE PRECISION NOT NULL,
        released_by VARCHAR,
        released_at DOUBLE PRECISION,
        PRIMARY KEY (check_name, epoch)
    )""",
    # Which check holds each sink, as its last delivery step found (shown by `epochal status`).
    """CREATE TABLE IF NOT EXISTS check_holds (
        sink VARCHAR PRIMARY KEY,
        check_name VARCHAR NOT NULL,
        epoch BIGINT NOT NULL,
        held_at DOUBLE PRECISION NOT NULL
    )""",
    # The indexes the controller's queries need (the primary keys cover lookups by epoch).
    "CREATE INDEX IF NOT EXISTS epochs_by_state ON epochs (state, epoch)",
    "CREATE INDEX IF NOT EXISTS collected_by_asset ON collected (asset, epoch)",
    "CREATE INDEX IF NOT EXISTS sink_batches_by_state ON sink_batches (sink, state, last_epoch)",
    "CREATE INDEX IF NOT EXISTS snapshots_by_table ON snapshots (table_name, state, epoch)",
)
