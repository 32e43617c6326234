"""Inputs: a dataset folder read and checked (dataset), one trajectory block of a prompt
(render), other agents' logs turned into a dataset folder (importers)."""
