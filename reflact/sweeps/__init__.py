"""Sweeps: a multirun's MLflow parent run and fixed settings (sweep), its grid report
(grid_report)."""
