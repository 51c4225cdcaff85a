"""Runners: a model with a cache that grows by a block and rolls back, and the passes that run it."""
