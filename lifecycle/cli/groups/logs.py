"""`sandgate logs`: query, follow and export the audit log from the host.

Rules: reads the state dir directly (the JSONL and its SQLite index; the index is brought up to
date first), so it works whether or not the server runs. Filters are the API's and the
console's (`AuditFilter`). Output is oldest-to-newest so `--follow` continues at the bottom;
colour only when stdout is a terminal (or `--color`). Record text is untrusted: every field
shown in a table goes through `visible` (control characters escaped, one record one row); JSON
output is escaped by the encoder.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import click

from sandgate.lifecycle.visible import visible
from sandgate.policy import OUTCOMES
from sandgate.proxy import RECORD_KINDS

if TYPE_CHECKING:  # the audit package imports FastAPI: at run time only
    from sandgate.lifecycle.audit import Summary
    from sandgate.lifecycle.audit.record import RecordJSON

DECISION_COLOURS = {"allow": "green", "deny": "red", "report": "yellow"}
COLUMNS = ("TIME (UTC)", "SANDBOX", "KIND", "DECISION", "REQUEST", "STATUS", "BINDING", "REASON", "RULE")
WIDEST = {"REQUEST": 64, "REASON": 48, "SANDBOX": 24}
FOLLOW_POLL_S = 0.5
MAX_CANDIDATES = 10  # ids listed when a --sandbox prefix is ambiguous


def request_text(record: RecordJSON) -> str:
    from sandgate.lifecycle.audit import SYSTEM_KINDS

    if record["kind"] in SYSTEM_KINDS:  # what was done to the sandbox: the operation and its path
        text = f"{record.get('method') or ''} {record.get('path') or ''}".strip()
        return f"{text} [{record['event']}]" if record.get("event") else text
    port = record.get("port")
    target = (record.get("host") or "") + (f":{port}" if port and port not in (80, 443) else "")
    text = f"{record.get('method') or ''} {target}{record.get('path') or ''}".strip()
    return f"{text} [{record['event']}]" if record.get("event") else text


def table_cells(record: RecordJSON) -> list[str]:
    cells = [
        record["ts"][:23].replace("T", " "),
        record["sandbox"],
        record["kind"],
        record["decision"],
        request_text(record),
        str(record.get("status") or ""),
        record.get("binding") or "",
        record["reason"],
        record.get("rule") or "",
    ]
    return [visible(cell) for cell in cells]


def clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


class TablePrinter:
    """Aligned columns; widths from the first batch, capped so a long path cannot wreck a row."""

    def __init__(self, color: bool | None) -> None:
        self.color = color
        self.widths: list[int] | None = None

    def print(self, records: list[RecordJSON]) -> None:
        rows = [table_cells(r) for r in records]
        if self.widths is None:
            self.widths = [
                min(max([len(h), *(len(row[i]) for row in rows)]), WIDEST.get(h, 40))
                for i, h in enumerate(COLUMNS)
            ]
            header = "  ".join(h.ljust(w) for h, w in zip(COLUMNS, self.widths, strict=True)).rstrip()
            click.echo(click.style(header, bold=True), color=self.color)
        for record, row in zip(records, rows, strict=True):
            cells = [clip(cell, w).ljust(w) for cell, w in zip(row, self.widths, strict=True)]
            cells[3] = click.style(
                cells[3], fg=DECISION_COLOURS[record["decision"]], bold=record["decision"] == "deny"
            )
            click.echo("  ".join(cells).rstrip(), color=self.color)


def emit(records: list[RecordJSON], output: str, printer: TablePrinter) -> None:
    if output == "table":
        printer.print(records)
        return
    from sandgate.lifecycle.audit import to_ocsf

    for record in records:
        click.echo(json.dumps(to_ocsf(record) if output == "ocsf" else record, separators=(",", ":")))


def print_summary(summary: Summary, color: bool | None) -> None:
    scope = f"sandbox {summary.sandbox}" if summary.sandbox else "all sandboxes"
    since = f" since {summary.since}" if summary.since else ""
    click.echo(
        click.style(f"{scope}{since}: {summary.total} records, {summary.denied} denied", bold=True),
        color=color,
    )
    sections = (
        ("Top hosts", "HOST", summary.top_hosts),
        ("Denials by reason", "REASON", summary.denials_by_reason),
        ("Injections by binding", "BINDING -> HOST", summary.injections_by_binding),
    )
    for title, label, rows in sections:
        keys = [visible(row.key) for row in rows]
        click.echo()
        click.echo(click.style(title, bold=True, underline=True), color=color)
        width = max([len(label), *map(len, keys)])
        click.echo(f"{label.ljust(width)}  {'COUNT':>8}  {'DENIED':>8}")
        for key, row in zip(keys, rows, strict=True):
            denied = click.style(f"{row.denied:>8}", fg="red") if row.denied else f"{row.denied:>8}"
            click.echo(f"{key.ljust(width)}  {row.count:>8}  {denied}", color=color)
        if not rows:
            click.echo("(none)")


class BadFilter(click.ClickException):
    """One line naming the option and what it accepts (a usage error: exit status 2)."""

    exit_code = 2

    def __init__(self, exc: Exception) -> None:
        from pydantic import ValidationError

        if isinstance(exc, ValidationError):
            problems = [
                f"--{'.'.join(map(str, error['loc']))}: {error['msg'].removeprefix('Value error, ')}"
                for error in exc.errors()
            ]
            super().__init__("; ".join(problems))
        else:
            super().__init__(str(exc))


def sandbox_by_prefix(index: Any, given: str) -> str:
    """The sandbox id `given` names: itself, or the one id it starts (the table shows ids cut
    short, with a "…"); a start several ids share is an error that lists them."""
    wanted = given.removesuffix("…")
    candidates: list[str] = index.sandboxes_starting_with(wanted, limit=MAX_CANDIDATES + 1)
    if wanted in candidates or not candidates:
        return wanted
    if len(candidates) == 1:
        return candidates[0]
    more = ", ..." if len(candidates) > MAX_CANDIDATES else ""
    raise click.ClickException(
        f"--sandbox {given!r} is the start of several sandbox ids "
        f"({', '.join(map(visible, candidates[:MAX_CANDIDATES]))}"
        f"{more}); give more of it"
    )


@click.group("logs", invoke_without_command=True)
@click.option("--sandbox", help="Only this sandbox (its id, or the start of it as the table shows).")
@click.option("--decision", type=click.Choice(OUTCOMES), help="Only this decision.")
@click.option("--kind", type=click.Choice(RECORD_KINDS), help="Only this record kind.")
@click.option("--host", help="Only this host (`*` wildcards allowed, e.g. '*.example.com').")
@click.option("--binding", help="Only requests that carried this credential binding.")
@click.option("--reason", help="Only this decision reason (exact text).")
@click.option("--status", type=int, help="Only this upstream HTTP status.")
@click.option("--since", help="From: 90s, 15m, 1h, 2d, 1w ago, 'today', 'yesterday' or RFC 3339.")
@click.option("--until", help="Until (exclusive), same forms as --since.")
@click.option(
    "--limit", type=click.IntRange(1, 1000), default=50, show_default=True, help="Records per page."
)
@click.option("--cursor", help="Continue with older records (printed after a full page).")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new records as they are written.")
@click.option("--summary", is_flag=True, help="Top hosts, denials by reason, injections by binding.")
@click.option(
    "-o", "--output", type=click.Choice(["table", "json", "ocsf"]), default="table", show_default=True
)
@click.option("--color/--no-color", default=None, help="Colour (default: when stdout is a terminal).")
@click.pass_context
def command(
    ctx: click.Context,
    output: str,
    limit: int,
    cursor: str | None,
    follow: bool,
    summary: bool,
    color: bool | None,
    **filters: Any,
) -> None:
    """Query and follow the audit log (what each sandbox reached, what was denied and why, what
    each ran and touched); `logs verify` checks its hash chain."""
    if ctx.invoked_subcommand is not None:
        return
    from sandgate.lifecycle.audit import AuditFilter, QueryError
    from sandgate.lifecycle.wiring import audit_index

    index = audit_index(ctx.obj.settings())
    index.ingest()
    if filters["sandbox"]:
        filters["sandbox"] = sandbox_by_prefix(index, filters["sandbox"])
    try:
        query = AuditFilter.model_validate(filters)
    except (QueryError, ValueError) as exc:
        raise BadFilter(exc) from None
    if summary:
        print_summary(index.summary(query), color)
        return
    try:
        page = index.page(query, limit, cursor)
    except QueryError as exc:
        raise BadFilter(exc) from None
    printer = TablePrinter(color)
    seq = index.last_seq()
    if page.records or output != "table":
        emit(list(reversed(page.records)), output, printer)
    elif not follow:
        click.echo("no records match", err=True)
    if page.next_cursor and not follow:
        click.echo(f"older records: --cursor {page.next_cursor}", err=True)
    while follow:
        time.sleep(FOLLOW_POLL_S)
        index.ingest()
        top = index.last_seq()
        batch = index.after(seq, query, 1000, top)
        emit([record for _, record in batch], output, printer)
        seq = batch[-1][0] if len(batch) == 1000 else top


@command.command("verify")
@click.pass_obj
def verify(obj: Any) -> None:
    """Check the audit files' hash chain: an edited, removed, inserted or reordered line is
    reported (file:line), and the exit status is 1."""
    from sandgate.proxy import audit_path, verify_chain

    verdict = verify_chain(audit_path(obj.settings().state_dir))
    for problem in verdict.problems:
        click.echo(f"{problem.file}:{problem.line}: {problem.what}")
    click.echo(
        f"{verdict.lines} lines, {verdict.chained} chained"
        + (
            f", {verdict.unchained_before} older unchained lines (not checked)"
            if verdict.unchained_before
            else ""
        )
        + f": {len(verdict.problems)} problem{'s' if len(verdict.problems) != 1 else ''}",
        err=bool(verdict.problems),
    )
    if verdict.problems:
        raise SystemExit(1)
