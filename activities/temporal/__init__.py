"""Temporal as an external system: how Rebound starts and messages its own workflows (``rebound_workflows``)."""
