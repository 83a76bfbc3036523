"""sandgate.policy."""
