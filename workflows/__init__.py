"""Rebound's deterministic zone: workflows, their domain models and pure policy.

Everything under this package may be imported by Temporal's workflow sandbox, so it imports only the standard
library, pydantic and temporalio, and performs no I/O at import time.
"""
