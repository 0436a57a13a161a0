"""Spark as a process Epochal manages: building a session (local JVM, cluster or Spark Connect), the
managed Connect server and its idle watchdog, the session slots runs attach to, and the warm-up."""
