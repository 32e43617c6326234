"""Running: one run's stage (stage), a conversation with re-asks and the cost cap (ask), what
happened to each minibatch (outcome, events, progress), the run dir (rundir, newdir), and what
is made of it afterwards (preview, summary, run_report)."""
