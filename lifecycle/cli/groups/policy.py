"""`sandgate policy`: Check, explain and format egress policy files.

These commands need no state dir, no settings and no root: they only read the files given.
Exit codes: 0 ok / allowed, 1 denied (explain) or not formatted (fmt --check), 2 invalid policy.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from urllib.parse import urlsplit

import click
import yaml

from sandgate.policy import (
    DEFAULT_MAX_RULES,
    AwsSigV4Auth,
    Binding,
    Decision,
    OAuth2Auth,
    Policy,
    PolicyError,
    Request,
    compile_policy,
    load_policy,
    to_document,
)

INVALID = 2
SCHEME_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


@click.group("policy")
def group() -> None:
    """Check, explain and format egress policy files."""


def load_reporting(path: Path, max_rules: int = DEFAULT_MAX_RULES) -> Policy | None:
    """The file's policy, or None after printing every problem as file:line:column."""
    try:
        policy = load_policy(path)
        compile_policy(policy, max_rules)
    except PolicyError as exc:
        for issue in exc.issues:
            click.echo(str(issue) if issue.file == str(path) else f"{path}: {issue}")
        return None
    return policy


def _load_or_exit(path: Path) -> Policy:
    policy = load_reporting(path)
    if policy is None:
        sys.exit(INVALID)
    return policy


@group.command("check")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--max-rules", default=DEFAULT_MAX_RULES, show_default=True, help="Rule limit to enforce.")
def check(files: tuple[Path, ...], max_rules: int) -> None:
    """Validate policy files; print every error as file:line:column: message (hint: ...)."""
    failed = False
    for path in files:
        policy = load_reporting(path, max_rules)
        if policy is None:
            failed = True
        else:
            click.echo(f"ok {path} ({len(policy.egress)} rules, {len(policy.bindings)} bindings)")
    if failed:
        sys.exit(INVALID)


@group.command("explain")
@click.argument("file", type=click.Path(path_type=Path))
@click.argument("url")
@click.option("--method", "-X", default="GET", show_default=True, help="HTTP method of the request.")
@click.option("--connection", is_flag=True, help="Decide the connection only (as at SNI/CONNECT time).")
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
def explain(file: Path, url: str, method: str, connection: bool, output: str) -> None:
    """Show the decision for URL under FILE's policy (exit 0 allow, 1 deny, 2 invalid)."""
    policy = _load_or_exit(file)
    request = _request_from_url(url, None if connection else method)
    decision = compile_policy(policy, max(len(policy.egress), DEFAULT_MAX_RULES)).decide(request)
    if output == "json":
        click.echo(json.dumps(decision.to_dict()))
    else:
        click.echo(_explain_text(decision, request, url, policy))
    sys.exit(0 if decision.allowed else 1)


def _request_from_url(url: str, method: str | None) -> Request:
    parts = urlsplit(url if "://" in url else f"https://{url}")
    scheme = parts.scheme.lower()
    host = parts.netloc.rsplit("@", 1)[-1]
    if host.startswith("["):
        host = host[: host.index("]") + 1]
    elif ":" in host:
        host = host.rsplit(":", 1)[0]
    try:
        port = parts.port or SCHEME_PORTS.get(scheme, 443)
    except ValueError as exc:
        raise click.BadParameter(f"bad port in {url!r}: {exc}", param_hint="URL") from exc
    if not host:
        raise click.BadParameter(f"no host in {url!r}", param_hint="URL")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    http_scheme = "https" if scheme in ("https", "wss") else "http"
    if method is None:
        return Request(host, port, http_scheme)
    return Request(host, port, http_scheme, method.upper(), path)


def _explain_text(decision: Decision, request: Request, url: str, policy: Policy) -> str:
    what = f"{request.method} {url}" if request.method else f"connection {request.host}:{request.port}"
    head = decision.action + (" (report only: would deny)" if decision.report_only else "")
    lines = [f"{head} {what}: reason={decision.reason} rule={decision.rule or '-'}"]
    lines.append(
        f"  inspect={'yes' if decision.inspect else 'no'} bindings={','.join(decision.bindings) or '-'}"
    )
    by_name = {binding.name: binding for binding in policy.bindings}
    shown = [name for name in decision.bindings if name in by_name]
    lines += [f"  binding {name}: {_how_injected(by_name[name])}" for name in shown]
    if decision.detail:
        lines.append(f"  detail: {decision.detail}")
    return "\n".join(lines)


def _how_injected(binding: Binding) -> str:
    """What the proxy does with a binding's credential, in a few words (names only, never values)."""
    auth = binding.auth
    if isinstance(auth, OAuth2Auth):
        return f"oauth2 {auth.grant}: a token minted by the proxy from {urlsplit(auth.tokenUrl).netloc}"
    if isinstance(auth, AwsSigV4Auth):
        scope = f"{','.join(auth.services)} in {','.join(auth.regions)}"
        placeholder = auth.placeholderAccessKeyId
        return f"awsSigV4: re-signed with the real key for {scope} (sandbox key id {placeholder})"
    return f"{auth.type}: vault credential(s) {', '.join(binding.credential_names())}"


def canonical_yaml(policy: Policy) -> str:
    """The canonical text of a policy: to_document as block YAML, scalar-only collections inline."""
    return yaml.safe_dump(to_document(policy), sort_keys=False, default_flow_style=None, width=110)


@group.command("fmt")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--check", "check_only", is_flag=True, help="Exit 1 if FILE is not in canonical form.")
@click.option("--write", is_flag=True, help="Rewrite FILE in canonical form (comments are not kept).")
def fmt(file: Path, check_only: bool, write: bool) -> None:
    """Print FILE's policy in canonical YAML (or check / rewrite it in place)."""
    text = canonical_yaml(_load_or_exit(file))
    if check_only:
        if file.read_text(encoding="utf-8") != text:
            click.echo(f"{file}: not in canonical form (run `sandgate policy fmt --write {file}`)")
            sys.exit(1)
        click.echo(f"ok {file}")
    elif write:
        file.write_text(text, encoding="utf-8")
        click.echo(f"formatted {file}")
    else:
        click.echo(text, nl=False)
