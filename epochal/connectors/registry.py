"""Source connectors by the name used in ``CREATE SOURCE ... WITH (connector = '...')``."""

from __future__ import annotations

from epochal.connectors.base import ConnectorSpec
from epochal.connectors.log import LogConnectorSpec
from epochal.connectors.mysql_cdc import MysqlCdcConnectorSpec
from epochal.connectors.nexmark import NexmarkConnectorSpec
from epochal.connectors.posix_fs import PosixFsConnectorSpec
from epochal.connectors.postgres_cdc import PostgresCdcConnectorSpec

SOURCE_CONNECTORS: dict[str, ConnectorSpec] = {
    spec.name: spec
    for spec in (
        NexmarkConnectorSpec(),
        LogConnectorSpec(),
        PosixFsConnectorSpec(),
        PostgresCdcConnectorSpec(),
        MysqlCdcConnectorSpec(),
    )
}


def connector_spec(name: str) -> ConnectorSpec | None:
    """The connector called ``name`` (case-insensitive), or None when there is none."""
    return SOURCE_CONNECTORS.get(name.strip().lower())
