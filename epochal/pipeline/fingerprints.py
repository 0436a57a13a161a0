"""What a view's stored rows depend on, as the meta store records it: the statement's fingerprint,
and the statement kept so that an old version can be planned again while its view rebuilds."""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from epochal.pipeline.model import ViewDef


def view_fingerprint(view: ViewDef) -> str:
    """What a view's stored rows depend on: its query (whitespace aside), columns and refresh mode."""
    text = " ".join(view.query.split()) + "|" + ",".join(view.columns) + "|" + view.refresh
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def view_statement(view: ViewDef) -> str:
    """The statement as the meta store keeps it (``view_statements``): enough to plan it again."""
    return json.dumps({"query": view.query, "options": dict(view.options), "refresh": view.refresh}, sort_keys=True)
