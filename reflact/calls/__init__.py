"""Calls: the optimizer seam (protocol: Optimizer, Reply, Usage, the dry-run estimator) and its
OpenAI-SDK implementation (client, completion), with the response cache and rate limits."""
