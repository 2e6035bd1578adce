"""workers."""
