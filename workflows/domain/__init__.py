"""Typed pydantic models shared by workflows, activities and workers (frozen at every Temporal boundary)."""
