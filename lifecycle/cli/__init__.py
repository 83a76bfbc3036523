"""The `sandgate` command line: one click group, one module per subcommand group.

Rules:
1. Each group module (serve, policy, vault, egress, logs, sandbox, image, approvals, down,
   node-proxy) registers its
   commands on its own group; this module only names them. A group module is imported when its
   command runs, never for `--help` or another group: the server side pulls in mitmproxy,
   FastAPI, httpx and docker, seconds of imports a `policy check` must not pay
   (tests/unit/test_cli_imports.py holds the import graph to that).
2. Settings are loaded lazily through `CliContext.settings(...)` so that commands needing none
   (e.g. `policy check`) work without a state dir or config file.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

# name -> (module under sandgate.lifecycle.cli.groups, attribute, the one-line help `--help` lists)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "serve": ("serve", "command", "Run the control-plane API and the egress proxy."),
    "policy": ("policy", "group", "Check, explain and format egress policy files."),
    "vault": ("vault", "group", "Manage credentials in the vault (write-only: values are never shown)."),
    "egress": ("egress", "group", "Read and change a running sandbox's egress policy."),
    "logs": (
        "logs",
        "command",  # a group: `logs verify`
        "Query and follow the audit log (what each sandbox reached, what was denied...",
    ),
    "sandbox": ("sandbox", "group", "Create, list, inspect, run commands in and remove sandboxes."),
    "image": ("image", "group", "Manage the local runtime's image store."),
    "approvals": (
        "approvals",
        "group",
        "Answer requests held for a reviewer (policy `ask`): list, allow, deny.",
    ),
    "down": ("down", "command", "Remove what a stopped or killed server left in the kernel."),
    "node-proxy": ("node_proxy", "command", "Run a Kubernetes node's egress proxy agent (as root)."),
}


if TYPE_CHECKING:
    from sandgate.lifecycle.settings import Settings


class CliContext:
    """What the top-level flags say; settings are built on first use with command flags on top."""

    def __init__(self, config: Path | None, state_dir: Path | None) -> None:
        self.config = config
        self.state_dir = state_dir

    def settings(self, **flags: Any) -> Settings:
        from sandgate.lifecycle.settings import load_settings

        try:
            return load_settings(self.config, state_dir=self.state_dir, **flags)
        except (FileNotFoundError, ValueError) as exc:
            raise click.UsageError(f"bad settings: {exc}") from exc


class Refused(click.ClickException):
    """A refusal printed as one line, `sandgate: <what>`, exit status 1."""

    def show(self, file: Any = None) -> None:
        click.echo(f"sandgate: {self.message}", err=True)


class LazyGroup(click.Group):
    """Imports a subcommand's module only when that subcommand is looked up to run."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, attribute, _ = COMMANDS[cmd_name]
        command: click.Command = getattr(
            importlib.import_module(f"sandgate.lifecycle.cli.groups.{module}"), attribute
        )
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, short) for name, (_, _, short) in COMMANDS.items()])


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="sandgate")
@click.option("--config", type=click.Path(path_type=Path), help="TOML config file (also SANDGATE_CONFIG).")
@click.option(
    "--state-dir", type=click.Path(path_type=Path), help="State directory (also SANDGATE_STATE_DIR)."
)
@click.pass_context
def main(ctx: click.Context, config: Path | None, state_dir: Path | None) -> None:
    """sandgate: egress gateway and credential vault for AI-agent sandboxes."""
    ctx.obj = CliContext(config, state_dir)
