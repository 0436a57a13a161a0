"""Statements that change between runs: a changed view (rebuilt or refused), a changed source, a sink
moved to another target, and the rebuilds that replace a view's rows at a switch epoch."""
