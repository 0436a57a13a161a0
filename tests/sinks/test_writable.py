"""A sink target this process can never write is refused at once, naming the user's option, path,
cause and fix, instead of retrying for EPOCHAL_SINK_RETRY_S and naming an internal ``.lock`` file.

The tests run as root, where a chmod'ed directory is still writable; a path under a regular FILE
(ENOTDIR) fails for root too, so that is the unwritable target here."""

from __future__ import annotations

import errno
import time
from pathlib import Path

import pytest

from epochal.checkpoint.sinks.writer_errors import error_kind
from epochal.sinks.base import SinkConfigError, SinkError
from epochal.sinks.writable import unwritable
from tests.epochal_harness import make_harness


def test_a_path_under_a_regular_file_is_unwritable_and_a_fresh_directory_is_not(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("x")
    assert unwritable(tmp_path / "plain" / "deep" / "out.duckdb") == (
        f"{tmp_path / 'plain'} is a file, not a directory, so nothing can be created under it"
    )
    assert unwritable(tmp_path / "new" / "deeper" / "out.duckdb") is None
    assert unwritable(tmp_path / "plain") is None  # an existing writable file


def test_a_permission_error_is_a_config_error_not_retried() -> None:
    assert error_kind(PermissionError(errno.EACCES, "Permission denied", "/x/.lock")) is SinkConfigError
    assert error_kind(OSError(errno.EROFS, "Read-only file system")) is SinkConfigError
    in_a_task = RuntimeError("PythonException: NotADirectoryError: [Errno 20] Not a directory")
    assert error_kind(in_a_task) is SinkConfigError
    assert error_kind(ConnectionError(errno.ECONNREFUSED, "refused")) is SinkError  # a target down: retried


@pytest.mark.parametrize(
    ("connector", "option"),
    [("connector = 'duckdb', database = '{d}/out.duckdb', table = 't'", "database"),
     ("connector = 'deltalake', location = '{d}/lake/t'", "location")],
)
def test_a_sink_on_an_unwritable_path_fails_at_once_naming_the_path_and_the_fix(
    spark, tmp_path: Path, connector: str, option: str
) -> None:
    plain = tmp_path / "plain"
    plain.write_text("x")
    sql = (
        "CREATE TABLE orders (id BIGINT, amount DOUBLE)\n"
        "WITH (connector = 'log', path = 'data/orders', format = 'json');\n"
        f"CREATE SINK s FROM orders WITH ({connector.format(d=plain)});\n"
    )
    h = make_harness(tmp_path, {"p.sql": sql})
    runtime = h.runtime(spark)
    h.produce(['{"id": 1, "amount": 2}'])
    record, _ = runtime.start_epoch(None, None)
    runtime.run_source(record.epoch, "orders")
    runtime.commit(record.epoch)
    started = time.monotonic()
    with pytest.raises(SinkConfigError) as raised:
        runtime.run_sink(record.epoch, "s")
    assert time.monotonic() - started < 5  # not EPOCHAL_SINK_RETRY_S of retries
    message = str(raised.value)
    assert message.startswith(f"sink s: cannot write {option} = '{plain}/")
    assert f"{plain} is a file, not a directory" in message and "Fix: set " in message
    assert ".lock" not in message
    assert runtime.controller.committed_epoch() == record.epoch  # the epoch stays committed; the sink waits
