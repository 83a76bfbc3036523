"""sandgate.execd."""
