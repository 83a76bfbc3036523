"""sandgate.lifecycle."""
