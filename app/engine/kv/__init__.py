"""What the KV cells hold: the debug-log cell map, its view, and sequence operations."""
