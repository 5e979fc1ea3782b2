"""orleanspy: virtual actors for Python with an adaptive reminder service."""
