"""Tracking: MLflow as a live view of the run dir: the store (store), what a run holds (mirror),
the tracker thread that follows the stage (live)."""
