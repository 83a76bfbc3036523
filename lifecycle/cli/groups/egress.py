"""`sandgate egress`: read and change a running sandbox's egress policy.

`get` shows the sandgate policy document; `set` replaces it (from a policy file, or from
`--rule action=target` flags over a deny default); `patch` merges rules as `osb egress patch`;
`delete` removes the rules for targets. All go through the control plane's egress API.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
import yaml

from sandgate.lifecycle.cli.groups.policy import INVALID, load_reporting
from sandgate.lifecycle.cli.groups.sandbox import client_from, connection_options, emit, guarded


def parse_rules(rules: tuple[str, ...]) -> list[dict[str, str]]:
    parsed = []
    for rule in rules:
        action, sep, target = rule.partition("=")
        if not sep or action not in ("allow", "deny") or not target:
            raise click.BadParameter(
                f"{rule!r}: write action=target, e.g. allow=api.example.com", param_hint="--rule"
            )
        parsed.append({"action": action, "target": target})
    return parsed


def checked_file(path: Path) -> dict[str, Any]:
    """The file's document once it passes `sandgate policy check` (problems printed as
    file:line:column, exit 2), so a mistake is reported where it is in the file."""
    if load_reporting(path) is None:
        sys.exit(INVALID)
    document: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return document


@click.group("egress")
def group() -> None:
    """Read and change a running sandbox's egress policy."""


@group.command("get")
@click.argument("sandbox_id")
@connection_options
@guarded
def get(**o: Any) -> None:
    """Show the sandbox's policy (its sandgate document and revision)."""
    answer = client_from(o).egress(o["sandbox_id"], "GET", "/sandgate-policy")
    emit(answer, "yaml" if o["output"] == "table" else o["output"])


@group.command("set")
@click.argument("sandbox_id")
@click.option(
    "-f", "--file", "policy_file", type=click.Path(path_type=Path), help="sandgate policy file (YAML/JSON)."
)
@click.option("--rule", "rules", multiple=True, help="action=target (repeat), over defaultAction deny.")
@connection_options
@guarded
def set_(**o: Any) -> None:
    """Replace the whole policy."""
    if bool(o["policy_file"]) == bool(o["rules"]):
        raise click.UsageError("give either --file or --rule (one or more)")
    policy = checked_file(o["policy_file"]) if o["policy_file"] else {"egress": parse_rules(o["rules"])}
    answer = client_from(o).egress(o["sandbox_id"], "PUT", "/sandgate-policy", json={"policy": policy})
    emit(answer, "yaml" if o["output"] == "table" else o["output"])


@group.command("patch")
@click.argument("sandbox_id")
@click.option("--rule", "rules", multiple=True, required=True, help="action=target (repeat).")
@connection_options
@guarded
def patch(**o: Any) -> None:
    """Merge rules: same target overrides, new rules first (OpenSandbox PATCH /policy)."""
    answer = client_from(o).egress(o["sandbox_id"], "PATCH", "/policy", json=parse_rules(o["rules"]))
    emit(answer, "yaml" if o["output"] == "table" else o["output"])


@group.command("delete")
@click.argument("sandbox_id")
@click.argument("targets", nargs=-1, required=True)
@connection_options
@guarded
def delete(**o: Any) -> None:
    """Remove the rules for TARGETS (unknown targets are ignored)."""
    answer = client_from(o).egress(o["sandbox_id"], "DELETE", "/policy", json=list(o["targets"]))
    emit(answer, "yaml" if o["output"] == "table" else o["output"])
