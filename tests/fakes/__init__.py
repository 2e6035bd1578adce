"""fakes."""
