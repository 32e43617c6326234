"""Prompting: minibatches (plan), the analyst templates and user message (prompts), and a
minibatch's messages fitted to the context window (messages)."""
