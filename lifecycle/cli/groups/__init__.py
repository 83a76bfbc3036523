"""One module per `sandgate` subcommand group, imported only when its command runs (cli/__init__.py)."""
