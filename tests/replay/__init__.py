"""Replay of committed workflow histories against the current workflow code (docs/adr/012)."""
