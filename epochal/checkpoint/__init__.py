"""The checkpoint controller's parts, one concern each (Dagster-free):

* ``records``: epoch states and their transition table, the records and errors;
* ``epoch_log``: inject, lease, collect, commit (the barrier worker);
* ``recovery``: back to the committed epoch after a failure;
* ``catalog``: snapshots, what a table's state is made of, retention and history pruning;
* ``sink_coordinator``: exactly-once delivery into sinks, with two-phase commit;
* ``status``: one consistent read for `epochal status`.

``epochal.checkpoint.controller.CheckpointController`` puts them together over one meta store.
"""
