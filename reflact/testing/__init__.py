"""Helpers for testing reflact and trying it offline; nothing here runs unless asked for by name."""
