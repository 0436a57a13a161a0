"""The controller's check methods: the recorded result of each check at each committed epoch, a
release, and what holds each sink (:mod:`epochal.checkpoint.checks`, docs/checks.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from epochal.checkpoint.checks import CheckRecords, CheckResult


class CheckMethods:
    check_records: CheckRecords

    def check_result(self, check: str, epoch: int) -> CheckResult | None:
        """``check``'s recorded result at ``epoch``, or None when it was not evaluated there yet."""
        return self.check_records.get(check, epoch)

    def record_check(self, result: CheckResult) -> CheckResult:
        """Keep ``result`` unless one is recorded for its check and epoch already; the kept one."""
        return self.check_records.record(result)

    def check_results(self, check: str | None = None, after: int | None = None) -> list[CheckResult]:
        """Recorded results, oldest epoch first: of one check or all, after an epoch or all."""
        return self.check_records.results(check, after)

    def release_check(self, check: str, by: str) -> list[int]:
        """Treat ``check``'s failing epochs as passed; the epochs released."""
        return self.check_records.release(check, by)

    def note_check_hold(self, sink: str, hold: CheckResult | None) -> None:
        """The failing result that keeps ``sink`` where it is (None: nothing), for `epochal status`."""
        self.check_records.note_hold(sink, hold)
