"""Report generator comparing implementations and methods."""
