"""Core: what every stage shares. The import lock (imports), `UserError` and exit codes (errors),
safe file writes and the file lock (files), one-line messages and markdown tables (text), the
launch dir's outputs/ (launch), where shipped files live (shipped), the two groups (groups), the
update modes (modes) and the names of run metrics (metrics)."""
