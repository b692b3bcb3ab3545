"""Observation shared by both engines: per-task stats, the Prometheus exporter, the console."""
