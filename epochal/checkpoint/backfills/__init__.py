"""Backfills in the meta store: the backfill and split state machines, their rows, the epochs a
backfill reads and writes, and the controls (pause, cancel) of a backfill."""
