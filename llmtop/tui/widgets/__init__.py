"""The dashboard's widgets, one per file, grouped by screen area."""
