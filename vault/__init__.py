"""sandgate.vault."""
