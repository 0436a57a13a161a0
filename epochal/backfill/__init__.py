"""Backfill runs: a view added to a running pipeline is filled from its inputs' state at a snapshot
epoch, vnode range by vnode range, then catches up on their change logs epoch by epoch, and joins
commit alignment at an epoch boundary (RisingWave's snapshot backfill). The states and their
rules are the checkpoint's (``epochal.checkpoint.backfills``); ``runner`` does the work with Spark."""
