"""Models: runners with rollback-able caches, loading, and the catalog of default models."""
