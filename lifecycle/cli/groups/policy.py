"""`sandgate policy`: Check, explain and format egress policy files.

check, explain, fmt and diff need no state dir, no settings and no root: they read the files given
(diff --sandbox asks the server); suggest reads this host's audit log, as `sandgate logs` does.
Exit codes: 0 ok / allowed / same, 1 denied (explain), not formatted (fmt --check) or different
(diff), 2 invalid policy.
"""

from __future__ import annotations

import difflib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any
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
    Presets,
    Request,
    Suggestion,
    compile_policy,
    load_policy,
    load_preset,
    policy_from_dict,
    suggest_policy,
    to_document,
    to_source_document,
)

if TYPE_CHECKING:
    from sandgate.lifecycle.audit.record import RecordJSON

INVALID = 2
NO_PRESETS = Presets()
SCHEME_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


@click.group("policy")
def group() -> None:
    """Check, explain and format egress policy files."""


def with_presets(command: Any) -> Any:
    """--preset-dir: where the file's `include: [preset:NAME]` are found (repeatable)."""
    return click.option(
        "--preset-dir",
        "preset_dirs",
        multiple=True,
        type=click.Path(file_okay=False, path_type=Path),
        help="Directory of presets the file includes (repeat; the server's preset_dirs).",
    )(command)


def load_reporting(
    path: Path, max_rules: int = DEFAULT_MAX_RULES, presets: Presets = NO_PRESETS
) -> Policy | None:
    """The file's policy, or None after printing every problem as file:line:column."""
    try:
        policy = load_policy(path, presets, max_rules)
    except PolicyError as exc:
        for issue in exc.issues:
            click.echo(str(issue) if issue.file == str(path) else f"{path}: {issue}")
        return None
    return policy


def _load_or_exit(path: Path, preset_dirs: tuple[Path, ...] = ()) -> Policy:
    policy = load_reporting(path, presets=Presets(preset_dirs))
    if policy is None:
        sys.exit(INVALID)
    return policy


@group.command("check")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--max-rules", default=DEFAULT_MAX_RULES, show_default=True, help="Rule limit to enforce.")
@with_presets
def check(files: tuple[Path, ...], max_rules: int, preset_dirs: tuple[Path, ...]) -> None:
    """Validate policy and preset files (a file with a `preset:` block is a preset); print every
    error as file:line:column: message (hint: ...)."""
    failed = False
    for path in files:
        if is_preset_file(path):
            failed |= not check_preset(path)
            continue
        policy = load_reporting(path, max_rules, Presets(preset_dirs))
        if policy is None:
            failed = True
        else:
            click.echo(f"ok {path} ({len(policy.egress)} rules, {len(policy.bindings)} bindings)")
    if failed:
        sys.exit(INVALID)


def is_preset_file(path: Path) -> bool:
    """A file whose top level holds a `preset:` block (a policy never has one)."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False  # the policy loader says what is wrong with it, with its line
    return isinstance(data, dict) and "preset" in data


def check_preset(path: Path) -> bool:
    """Check one preset as an include would load it; print ok or every problem at its file:line."""
    try:
        preset = load_preset(path)
    except PolicyError as exc:
        for issue in exc.issues:
            click.echo(str(issue))
        return False
    click.echo(f"ok {path} (preset {preset.name}@{preset.version}, {len(preset.rules)} rules)")
    return True


@group.command("explain")
@click.argument("file", type=click.Path(path_type=Path))
@click.argument("url")
@click.option("--method", "-X", default="GET", show_default=True, help="HTTP method of the request.")
@click.option("--connection", is_flag=True, help="Decide the connection only (as at SNI/CONNECT time).")
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@with_presets
def explain(
    file: Path, url: str, method: str, connection: bool, output: str, preset_dirs: tuple[Path, ...]
) -> None:
    """Show the decision for URL under FILE's policy (exit 0 allow, 1 deny, 2 invalid); a rule a
    preset brought in is named by its file:line in the preset."""
    policy = _load_or_exit(file, preset_dirs)
    request = _request_from_url(url, None if connection else method)
    decision = compile_policy(policy).decide(request)
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


def canonical_yaml(policy: Policy, as_written: bool = False) -> str:
    """The canonical text of a policy as block YAML, scalar-only collections inline: what is
    enforced (presets expanded), or `as_written` (its own rules and its `include`)."""
    document = to_source_document(policy) if as_written else to_document(policy)
    return yaml.safe_dump(document, sort_keys=False, default_flow_style=None, width=110)


@group.command("fmt")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--check", "check_only", is_flag=True, help="Exit 1 if FILE is not in canonical form.")
@click.option("--write", is_flag=True, help="Rewrite FILE in canonical form (comments are not kept).")
@with_presets
def fmt(file: Path, check_only: bool, write: bool, preset_dirs: tuple[Path, ...]) -> None:
    """Print FILE's policy in canonical YAML (or check / rewrite it in place)."""
    text = canonical_yaml(_load_or_exit(file, preset_dirs), as_written=True)
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


SUGGEST_MAX_RECORDS = 1_000_000  # records read for one suggestion (a page of 1000 at a time)


@group.command("suggest")
@click.option("--sandbox", required=True, help="The sandbox whose audit records to learn from.")
@click.option("--since", help="From: 90s, 15m, 1h, 2d, 1w ago, 'today' or RFC 3339 (default: all kept).")
@click.option(
    "-o", "--output", "out", type=click.Path(path_type=Path), help="Write the policy here (default: stdout)."
)
@click.pass_obj
def suggest(obj: Any, sandbox: str, since: str | None, out: Path | None) -> None:
    """Write the smallest policy that allows what SANDBOX did (reads this host's audit log; run
    a workload in report mode first). Review it: bindings are left as comments to fill in."""
    from sandgate.lifecycle.audit import AuditFilter, QueryError, observed
    from sandgate.lifecycle.cli.groups.logs import BadFilter, sandbox_by_prefix
    from sandgate.lifecycle.wiring import audit_index

    index = audit_index(obj.settings())
    index.ingest()
    sandbox_id = sandbox_by_prefix(index, sandbox)
    try:
        query = AuditFilter.model_validate({"sandbox": sandbox_id, "since": since})
    except (QueryError, ValueError) as exc:
        raise BadFilter(exc) from None
    records: list[RecordJSON] = []
    cursor: str | None = None
    while len(records) < SUGGEST_MAX_RECORDS:
        page = index.page(query, 1000, cursor)
        records += page.records
        if not (cursor := page.next_cursor):
            break
    if not records:
        raise click.ClickException(
            f"no audit records of sandbox {sandbox_id}{f' since {since}' if since else ''}"
        )
    seen, refused = observed(reversed(records))
    suggestion = suggest_policy(seen, refused)
    bindings = sorted({(r["host"], r["binding"]) for r in records if r.get("binding") and r.get("host")})
    text = suggested_text(suggestion, sandbox_id, len(records), since, bindings)
    if out is None:
        click.echo(text, nl=False)
    else:
        out.write_text(text, encoding="utf-8")
        click.echo(
            f"wrote {out}: {len(suggestion.document['egress'])} rules from {len(records)} records", err=True
        )


def suggested_text(
    suggestion: Suggestion, sandbox_id: str, count: int, since: str | None, bindings: list[tuple[str, str]]
) -> str:
    """The suggestion as a commented policy file (the comments are for the reviewer). Hosts and
    names in comments come from audit records, which sandboxes wrote: `visible` keeps each on its
    comment line (a newline in an SNI must not start a line of policy)."""
    from sandgate.lifecycle.visible import visible

    head = [
        f"# Suggested by `sandgate policy suggest` from {count} audit records of sandbox {sandbox_id}"
        + (f" (since {since})." if since else "."),
        "# It allows what the workload was seen to do and nothing else; review it before use.",
        *(f"# {visible(note)}" for note in suggestion.notes),
    ]
    body = yaml.safe_dump(suggestion.document, sort_keys=False, default_flow_style=None, width=110)
    tail = []
    if bindings:
        tail = [
            "# Credentials were injected for these hosts; fill in a binding for each you keep:",
            "# bindings:",
        ]
        for host, name in bindings:
            tail += [f"#   - name: {visible(name)}", "#     credential: <vault entry name>"]
            tail += [f"#     match: {{hosts: [{visible(host)}]}}", "#     auth: {type: bearer}"]
    return "\n".join(head) + "\n" + body + ("\n".join(tail) + "\n" if tail else "")


@group.command("diff")
@click.argument("file", type=click.Path(path_type=Path))
@click.argument("other", required=False, type=click.Path(path_type=Path))
@click.option("--sandbox", help="Compare with this sandbox's live policy instead of OTHER.")
@click.option("--domain", help="Server host:port for --sandbox (OPEN_SANDBOX_DOMAIN).")
@click.option("--api-key", help="API key for --sandbox (OPEN_SANDBOX_API_KEY).")
@click.option("--protocol", type=click.Choice(["http", "https"]), help="(OPEN_SANDBOX_PROTOCOL)")
@with_presets
def diff(
    file: Path, other: Path | None, sandbox: str | None, preset_dirs: tuple[Path, ...], **connection: Any
) -> None:
    """Show how FILE's policy differs from OTHER's or a sandbox's live one, in canonical form with
    presets expanded (exit 0 same, 1 different, 2 invalid)."""
    if (other is None) == (sandbox is None):
        raise click.UsageError("give OTHER (a policy file) or --sandbox ID, not both")
    mine = canonical_yaml(_load_or_exit(file, preset_dirs))
    if other is not None:
        theirs, label = canonical_yaml(_load_or_exit(other, preset_dirs)), str(other)
    else:
        assert sandbox is not None
        theirs, label = _live_policy(sandbox, connection), f"sandbox {sandbox} (live)"
    lines = list(difflib.unified_diff(theirs.splitlines(True), mine.splitlines(True), label, str(file)))
    click.echo("".join(lines), nl=False)
    sys.exit(1 if lines else 0)


def _live_policy(sandbox: str, connection: dict[str, Any]) -> str:
    from sandgate.lifecycle.cli.groups.sandbox import client_from

    answer = client_from(dict(connection)).egress(sandbox, "GET", "/sandgate-policy")
    return canonical_yaml(policy_from_dict(answer["policy"], f"sandbox {sandbox}"))
