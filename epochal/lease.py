"""A claim renewed from a background thread while the work it covers runs (epochs, backfills,
snapshots, sink deliveries, the managed Spark server's lease)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from types import TracebackType

log = logging.getLogger("epochal.lease")

#: How often, as a share of the epoch timeout, a lease is renewed: a few renewals can fail (a meta
#: store hiccup) before a live run looks dead to recovery.
LEASE_RENEWALS_PER_TIMEOUT = 4


class Lease:
    """Renews a claim from a background thread while the work it covers runs, so a step that is
    slow but alive is never taken for dead. ``renew()`` returns False once the claim is gone (the
    epoch was recovered): renewing stops, and the writer meets the fence on its next collect."""

    def __init__(self, what: str, renew: Callable[[], bool], interval_s: float):
        self.what = what
        self._renew = renew
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease:{what}", daemon=True)
        self.lost = False

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                if not self._renew():
                    self.lost = True
                    log.warning("%s: the claim is gone (recovered, or its owner gone); renewing stops", self.what)
                    return
            except Exception:  # a meta-store hiccup: the next renewal may get through
                log.warning("%s: lease renewal failed; retrying in %.1fs", self.what, self._interval, exc_info=True)

    def __enter__(self) -> Lease:
        self._thread.start()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
