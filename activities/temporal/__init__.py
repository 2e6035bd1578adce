"""Temporal as an external system: starting and messaging Rebound's workflows (``rebound_workflows``), discovery
(starts a JobRecovery per opted-in job), the Fleet's isolation requests, and the audit (reads the workflows' records,
writes the report)."""
