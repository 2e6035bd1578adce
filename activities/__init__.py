"""activities."""
