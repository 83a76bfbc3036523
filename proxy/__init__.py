"""sandgate.proxy."""
