"""The `sandgate` command line: one click group, one module per subcommand group.

Each group module (serve, policy, vault, egress, logs, sandbox, image) registers its commands
on its own group; this module only assembles them. Settings are loaded lazily through
`CliContext.settings(...)` so that commands needing none (e.g. `policy check`) work without a
state dir or config file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from sandgate.lifecycle.cli.groups import egress, image, logs, policy, sandbox, serve, vault
from sandgate.lifecycle.settings import Settings, load_settings


class CliContext:
    """What the top-level flags say; settings are built on first use with command flags on top."""

    def __init__(self, config: Path | None, state_dir: Path | None) -> None:
        self.config = config
        self.state_dir = state_dir

    def settings(self, **flags: Any) -> Settings:
        try:
            return load_settings(self.config, state_dir=self.state_dir, **flags)
        except (FileNotFoundError, ValueError) as exc:
            raise click.UsageError(f"bad settings: {exc}") from exc


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="sandgate")
@click.option("--config", type=click.Path(path_type=Path), help="TOML config file (also SANDGATE_CONFIG).")
@click.option(
    "--state-dir", type=click.Path(path_type=Path), help="State directory (also SANDGATE_STATE_DIR)."
)
@click.pass_context
def main(ctx: click.Context, config: Path | None, state_dir: Path | None) -> None:
    """sandgate: egress gateway and credential vault for AI-agent sandboxes."""
    ctx.obj = CliContext(config, state_dir)


for group in (
    serve.command,
    policy.group,
    vault.group,
    egress.group,
    logs.command,
    sandbox.group,
    image.group,
):
    main.add_command(group)
