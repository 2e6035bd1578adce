"""``rebound bench scale``: a synthetic cluster of N jobs that Rebound's real worker, node agents and Temporal dev
server must handle, and what that costs (issue 12; ``docs/benchmarks/scale.md``)."""
