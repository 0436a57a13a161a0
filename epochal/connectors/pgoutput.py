"""PostgreSQL's ``pgoutput`` logical decoding messages (protocol version 1), decoded.

``pg_logical_slot_peek_binary_changes(..., 'proto_version', '1', 'publication_names', ...)``
returns one message per row. This module turns them into the changes of one upstream table, as
``Change`` values in commit order, with each transaction's commit LSN (its Begin message's final
LSN), so the caller can keep exactly the transactions of an epoch's LSN range. Pure: bytes in,
values out (column values stay as PostgreSQL's text output; the caller types them).

Message layouts: https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass, field

from epochal.errors import EpochalError

#: A column's value in a tuple: its text, None for NULL, or UNCHANGED for a TOASTed value the
#: update did not touch (PostgreSQL does not send it again).
UNCHANGED = object()


class DecodeError(EpochalError):
    """A message that is not pgoutput protocol 1 as documented."""


@dataclass(frozen=True)
class Relation:
    oid: int
    namespace: str
    name: str
    #: replica identity: 'd' default (the primary key), 'n' nothing, 'f' full, 'i' an index
    identity: str
    columns: tuple[str, ...]
    type_oids: tuple[int, ...]
    #: whether each column is part of the replica identity key
    key_flags: tuple[bool, ...]

    @property
    def qualified(self) -> str:
        return f"{self.namespace}.{self.name}"


@dataclass(frozen=True)
class Change:
    """One row change: ``kind`` is 'insert', 'update', 'delete' or 'truncate'."""

    kind: str
    relation: Relation
    #: commit LSN of the transaction the change belongs to
    commit_lsn: int
    #: the new row (insert, update), by column name
    new: dict[str, object] | None = None
    #: the old key ('K') or whole old row ('O', REPLICA IDENTITY FULL), when the message has one
    old: dict[str, object] | None = None
    #: whether ``old`` is the whole old row ('O'); a key tuple ('K') sends its other columns as NULL
    old_is_row: bool = False


@dataclass
class _Reader:
    data: bytes
    pos: int = 0

    def take(self, fmt: str) -> tuple:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise DecodeError(f"pgoutput message cut short at byte {self.pos} (wanted {size} more)")
        values = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return values

    def byte(self) -> str:
        return chr(self.take("!B")[0])

    def string(self) -> str:
        end = self.data.find(b"\0", self.pos)
        if end < 0:
            raise DecodeError("pgoutput string without its terminating NUL")
        text = self.data[self.pos : end].decode("utf-8")
        self.pos = end + 1
        return text

    def tuple_data(self, relation: Relation) -> dict[str, object]:
        (count,) = self.take("!h")
        if count != len(relation.columns):
            raise DecodeError(
                f"a row of {relation.qualified} has {count} columns where its Relation message has "
                f"{len(relation.columns)}"
            )
        values: dict[str, object] = {}
        for name in relation.columns:
            kind = self.byte()
            if kind == "n":
                values[name] = None
            elif kind == "u":
                values[name] = UNCHANGED
            elif kind in ("t", "b"):
                (length,) = self.take("!i")
                raw = self.data[self.pos : self.pos + length]
                self.pos += length
                values[name] = raw.decode("utf-8") if kind == "t" else raw
            else:
                raise DecodeError(f"unknown tuple column kind {kind!r} in a row of {relation.qualified}")
        return values


@dataclass
class Decoder:
    """Decodes a stream of messages; remembers the Relation messages seen (a Relation precedes the
    first change of a table in each decoding session, and again after its schema changed)."""

    relations: dict[int, Relation] = field(default_factory=dict)
    #: the final (commit) LSN of the transaction being decoded, None between transactions
    commit_lsn: int | None = None

    def decode(self, messages: Iterable[bytes]) -> Iterable[Change | Relation]:
        """The changes of ``messages`` in order; a Relation message is yielded too (the caller
        checks a table's columns against what it expects)."""
        for message in messages:
            yield from self._one(bytes(message))

    def _one(self, message: bytes) -> Iterable[Change | Relation]:
        reader = _Reader(message)
        tag = reader.byte()
        if tag == "B":
            final_lsn, _timestamp, _xid = reader.take("!QqI")
            self.commit_lsn = final_lsn
        elif tag == "C":
            self.commit_lsn = None
        elif tag == "R":
            oid = reader.take("!I")[0]
            namespace, name = reader.string(), reader.string()
            identity = reader.byte()
            (count,) = reader.take("!h")
            columns, types, keys = [], [], []
            for _ in range(count):
                (flags,) = reader.take("!B")
                columns.append(reader.string())
                type_oid, _typmod = reader.take("!Ii")
                types.append(type_oid)
                keys.append(bool(flags & 1))
            relation = Relation(oid, namespace, name, identity, tuple(columns), tuple(types), tuple(keys))
            self.relations[oid] = relation
            yield relation
        elif tag in ("I", "U", "D"):
            relation = self._relation(reader.take("!I")[0])
            lsn = self._in_transaction(tag)
            if tag == "I":
                self._expect(reader, "N", relation)
                yield Change("insert", relation, lsn, new=reader.tuple_data(relation))
            elif tag == "U":
                old = None
                kind = reader.byte()
                old_is_row = kind == "O"
                if kind in ("K", "O"):
                    old = reader.tuple_data(relation)
                    kind = reader.byte()
                if kind != "N":
                    raise DecodeError(f"an Update of {relation.qualified} without its new row")
                new = reader.tuple_data(relation)
                yield Change("update", relation, lsn, new=new, old=old, old_is_row=old_is_row)
            else:
                kind = reader.byte()
                if kind not in ("K", "O"):
                    raise DecodeError(f"a Delete of {relation.qualified} without the old key")
                yield Change("delete", relation, lsn, old=reader.tuple_data(relation), old_is_row=kind == "O")
        elif tag == "T":
            count, _options = reader.take("!iB")
            lsn = self._in_transaction(tag)
            for _ in range(count):
                yield Change("truncate", self._relation(reader.take("!I")[0]), lsn)
        elif tag in ("Y", "O", "M"):
            pass  # a type, an origin, a logical message: nothing a table's rows depend on
        else:
            raise DecodeError(f"unknown pgoutput message {tag!r}")

    def _relation(self, oid: int) -> Relation:
        relation = self.relations.get(oid)
        if relation is None:
            raise DecodeError(f"a change of relation {oid} before its Relation message")
        return relation

    def _in_transaction(self, tag: str) -> int:
        if self.commit_lsn is None:
            raise DecodeError(f"a {tag!r} message outside a transaction (no Begin before it)")
        return self.commit_lsn

    @staticmethod
    def _expect(reader: _Reader, kind: str, relation: Relation) -> None:
        got = reader.byte()
        if got != kind:
            raise DecodeError(f"expected tuple marker {kind!r} in a change of {relation.qualified}, got {got!r}")


def lsn_text(lsn: int) -> str:
    """An LSN as PostgreSQL writes it (``16/B374D848``)."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def lsn_int(text: str) -> int:
    """An LSN written as PostgreSQL writes it, as an int."""
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) | int(low, 16)
