"""`epochal checks list | release NAME`: the pipeline's checks with their failing epochs, and
releasing a failing ``error`` check's hold on the sinks (docs/checks.md)."""

from __future__ import annotations

import argparse
import getpass
import json
from collections.abc import Callable
from typing import Any

from epochal.errors import EpochalError


def add_parser(sub: Any, runtime: Callable[[], Any]) -> None:
    """The ``checks`` subcommand, on ``sub`` (argparse's subparsers); ``runtime()`` opens the pipeline."""
    p = sub.add_parser("checks", help="data checks: list them with their failing epochs, release a hold")
    p.add_argument("action", choices=("list", "release"))
    p.add_argument("name", nargs="?", help="release: the check whose failing epochs are treated as passed")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=lambda args: cmd_checks(args, runtime()))


def cmd_checks(args: argparse.Namespace, runtime: Any) -> int:
    checks = runtime.pipeline.checks
    controller = runtime.controller
    if args.action == "release":
        if not args.name:
            raise EpochalError("epochal checks release needs the check's name: epochal checks release NAME")
        if args.name not in checks and not controller.check_results(args.name):
            known = ", ".join(sorted(checks)) or "none"
            raise EpochalError(f"no check named {args.name!r} (checks: {known})")
        released = controller.release_check(args.name, getpass.getuser())
        if args.json:
            print(json.dumps({"check": args.name, "released_epochs": released}))
        elif released:
            print(
                f"released check {args.name} at epoch(s) {', '.join(map(str, released))}: they count as passed; "
                "the sinks it held deliver up to the newest passing epoch at their next step, in one batch"
            )
        else:
            print(f"check {args.name} has no failing epoch to release")
        return 0
    if args.name:
        raise EpochalError("epochal checks list takes no name")
    listed = []
    for check in checks.values():
        results = controller.check_results(check.name)
        failing = [r.as_dict() for r in results if not r.passed]
        listed.append(
            {
                "check": check.name,
                "table": check.table,
                "severity": check.severity,
                "builtin": check.builtin,
                "evaluated_epochs": len(results),
                "last_epoch": results[-1].epoch if results else None,
                "last_passed": results[-1].passed if results else None,
                "failing": failing,
            }
        )
    if args.json:
        print(json.dumps(listed, indent=2, default=str))
        return 0
    if not listed:
        print("no checks: declare one with CREATE CHECK name ON table AS SELECT ... (docs/checks.md)")
    for item in listed:
        last = "never evaluated" if item["last_epoch"] is None else (
            f"epoch {item['last_epoch']} {'passed' if item['last_passed'] else 'FAILED'}"
        )
        print(f"{item['check']:<28} {item['severity']:<5} on {item['table']:<24} {last}")
        for failure in item["failing"]:
            released = f", released by {failure['released_by']}" if failure["released_at"] else ""
            print(f"  failed at epoch {failure['epoch']}: {failure['failed_rows']} row(s){released}; "
                  f"sample {json.dumps(failure['sample'][:2], default=str)}")
    return 0
