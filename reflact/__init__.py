"""reflact: the reflect stage of skill optimisation as a configured, logged experiment."""
