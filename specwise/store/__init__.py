"""Where models come from: the catalog of pinned packages, their preparation, the cache's inventory, loading."""
