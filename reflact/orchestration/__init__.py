"""Orchestration: one run end to end (experiment): the optimizer chosen, lock, config recorded,
observers, stage, summary, analysis, status."""
