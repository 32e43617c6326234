"""The command line's parts beside its entry point (reflact/run.py): its `--help` (usage)."""
