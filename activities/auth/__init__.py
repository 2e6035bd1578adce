"""Operators' authentication: MUNGE credentials verified on the worker (``workflows.policy.operators``)."""
