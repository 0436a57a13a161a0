"""A piece of a log file decoded into Arrow line batches (pure logic: no Spark).

Executors hand Spark these batches for every large log read; the rows must be the lines as Python's
own decoding gives them, with their numbers, whatever the bytes are."""

from __future__ import annotations

import random

import pytest

from epochal.connectors.log_lines import BATCH_LINES, LinePiece, piece_batches

# ASCII, two-, three- and four-byte characters, a truncated sequence, bytes that are never UTF-8,
# a carriage return (left in the line, as the text reader left it)
PIECES = [b"a", b"{", b"\xc3\xa9", b"\xe2\x82\xac", b"\xe2\x82", b"\xff", b"\x80", b"\r", b"\xf0\x9f\x98\x80"]


def _rows(path: str, piece: LinePiece) -> list[tuple[str, int, str]]:
    rows: list[tuple[str, int, str]] = []
    for batch in piece_batches(path, piece):
        batch.validate(full=True)
        rows += zip(*(batch.column(i).to_pylist() for i in range(3)), strict=True)
    return rows


@pytest.mark.parametrize("lines", [0, 1, BATCH_LINES + 3])
def test_piece_lines_are_python_decoding_of_the_bytes(tmp_path, lines):
    rng = random.Random(lines)
    data = b"".join(b"".join(rng.choice(PIECES) for _ in range(rng.randint(0, 5))) + b"\n" for _ in range(lines))
    head = b'{"earlier": 1}\n'
    path = tmp_path / "0001.jsonl"
    path.write_bytes(head + data)
    split = "t\u00e9/0001.jsonl"

    rows = _rows(str(path), LinePiece(split, 7, len(head), len(head) + len(data), lines))

    expected = data.decode("utf-8", errors="replace").split("\n")[:-1]
    assert rows == [(split, 7 + i, line) for i, line in enumerate(expected)]


def test_a_piece_that_no_longer_holds_its_lines_is_an_error(tmp_path):
    path = tmp_path / "0001.jsonl"
    path.write_bytes(b"a\nb\nc\n")
    with pytest.raises(OSError, match="expected 2 lines, found 3"):
        _rows(str(path), LinePiece("s", 0, 0, 6, 2))
