"""The audit record kinds, one row each: what a record of the kind must hold, how the console
names it, and which OCSF class and activity it is exported as.

Rules:
1. A kind is one row of `KINDS`: its name (the record's `kind`), its console label, the record
   fields every record of it holds (`required`, beyond the envelope every record has: `v`, `ts`,
   `id`, `kind`, `sandbox`, `client`, `decision`, `reason`), its OCSF class (with the profiles
   its events declare) and its activity rule. A new kind of an existing OCSF class is one row; a
   kind of a new class is one row and that class's attributes in `ocsf.py` (`CLASS_ATTRIBUTES`).
   The writer's schema names the kinds too (`sandgate.proxy.RECORD_KINDS`, until the record
   leaves the proxy's contract); tests/audit/test_ocsf_schema.py checks the two agree.
2. Classes, activities and their captions are those of the OCSF version `OCSF_VERSION` names;
   tests/audit/test_ocsf_schema.py checks every row against that version's schema.
3. An activity rule reads only the record's fields, never fails: a value it does not know is
   OCSF's 99 Other with the record's own word as `activity_name`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sandgate.lifecycle.audit.policy_change import Change
from sandgate.lifecycle.audit.record import RecordJSON
from sandgate.lifecycle.exec_trail import OPERATIONS, OTHER_OPERATION, PTY_INPUT

OCSF_VERSION = "1.3.0"
OTHER = 99  # OCSF's "Other" in every enumeration: the name is then the source's own word
SECURITY_CONTROL = "security_control"  # the OCSF profile of action, disposition and firewall_rule
HOST = "host"  # the OCSF profile of `actor`: a connection's process (proxy/origin.py)

Activity = tuple[int, str]


@dataclass(frozen=True)
class OcsfClass:
    uid: int
    name: str
    category_uid: int
    category_name: str
    profiles: tuple[str, ...]


NETWORK_ACTIVITY = OcsfClass(4001, "Network Activity", 4, "Network Activity", (SECURITY_CONTROL, HOST))
HTTP_ACTIVITY = OcsfClass(4002, "HTTP Activity", 4, "Network Activity", (SECURITY_CONTROL, HOST))
DNS_ACTIVITY = OcsfClass(4003, "DNS Activity", 4, "Network Activity", (SECURITY_CONTROL,))
API_ACTIVITY = OcsfClass(6003, "API Activity", 6, "Application Activity", ())
PROCESS_ACTIVITY = OcsfClass(1007, "Process Activity", 1, "System Activity", ())
FILE_ACTIVITY = OcsfClass(1001, "File System Activity", 1, "System Activity", ())


@dataclass(frozen=True)
class AuditKind:
    name: str
    label: str
    required: tuple[str, ...]
    ocsf: OcsfClass
    activity: Callable[[RecordJSON], Activity]


# HTTP Activity's activity_id by request method (OCSF 1.3.0 enumerates no PATCH: Other + name).
HTTP_METHODS = {"CONNECT": 1, "DELETE": 2, "GET": 3, "HEAD": 4, "OPTIONS": 5, "POST": 6, "PUT": 7, "TRACE": 8}
_CREATE, _UPDATE, _DELETE = (1, "Create"), (3, "Update"), (4, "Delete")
# API Activity's activity by control-plane change (a word no row has: 99 Other).
API_CHANGES: dict[str, Activity] = {
    Change.CREATE: _CREATE, Change.VAULT_CREATE: _CREATE,
    Change.POLICY_REPLACE: _UPDATE, Change.POLICY_PATCH: _UPDATE, Change.NETWORKPOLICY_REPLACE: _UPDATE,
    Change.NETWORKPOLICY_PATCH: _UPDATE, Change.SANDGATE_POLICY_REPLACE: _UPDATE, Change.VAULT_PATCH: _UPDATE,
    Change.APPROVAL_ALLOW_SANDBOX: _UPDATE, Change.RENEW: _UPDATE, Change.RENEW_ON_ACCESS: _UPDATE,
    Change.POLICY_DELETE: _DELETE, Change.NETWORKPOLICY_DELETE: _DELETE, Change.VAULT_DELETE: _DELETE,
}  # fmt: skip


# Process Activity's and File System Activity's activity captions by id.
PROCESS_ACTIVITIES = {1: "Launch", 2: "Terminate", 3: "Open", 4: "Inject", 5: "Set User ID"}
FILE_ACTIVITIES = {1: "Create", 2: "Read", 3: "Update", 4: "Delete", 5: "Rename", 6: "Set Attributes",
                   7: "Set Security", 8: "Get Attributes", 9: "Get Security", 14: "Open"}  # fmt: skip
# An execd operation's activity (lifecycle/exec_trail.py's table); a process event's.
EXECD_OPERATIONS = {op.name: op.activity for op in (*OPERATIONS.values(), PTY_INPUT, OTHER_OPERATION)}
PROCESS_EVENTS = {"exec": 1, "ptrace": 3}  # a program launched; a process opened by another (ptrace)


def http_method(record: RecordJSON) -> Activity:
    method = (record.get("method") or "").upper()
    return HTTP_METHODS.get(method, OTHER), method.title() or "Other"


def connection(record: RecordJSON) -> Activity:
    if record.get("event") in ("closed", "revoked"):  # the connection's end: its bytes, not a decision
        return 2, "Close"
    return (5, "Refuse") if record["decision"] == "deny" else (6, "Traffic")


def dns_query(_record: RecordJSON) -> Activity:
    return 1, "Query"


def security_event(record: RecordJSON) -> Activity:
    return OTHER, record.get("event") or record["reason"]


def api_change(record: RecordJSON) -> Activity:
    change = record.get("event") or record["reason"]
    return API_CHANGES.get(change, (OTHER, change))


# API Activity's activity of a control-plane call (`api`) by its method; a WebSocket is a Read.
API_CALLS: dict[str, Activity] = {"POST": _CREATE, "GET": (2, "Read"), "WS": (2, "Read"), "PUT": _UPDATE,
                                  "PATCH": _UPDATE, "DELETE": _DELETE}  # fmt: skip


def api_call(record: RecordJSON) -> Activity:
    method = (record.get("method") or "").upper()
    return API_CALLS.get(method, (OTHER, method.title() or "Other"))


def execd_operation(record: RecordJSON) -> Activity:
    captions = PROCESS_ACTIVITIES if record["kind"] == "command" else FILE_ACTIVITIES
    operation = record.get("method") or "Other"
    activity = EXECD_OPERATIONS.get(operation, OTHER)
    return (activity, captions[activity]) if activity in captions else (OTHER, operation)


def process_event(record: RecordJSON) -> Activity:
    event = record.get("method") or "Other"
    activity = PROCESS_EVENTS.get(event, OTHER)
    return (activity, PROCESS_ACTIVITIES[activity]) if activity != OTHER else (OTHER, event)


KINDS: dict[str, AuditKind] = {
    kind.name: kind
    for kind in (
        AuditKind("request", "request", ("method", "host", "port", "scheme"), HTTP_ACTIVITY, http_method),
        AuditKind("connection", "connection", ("port",), NETWORK_ACTIVITY, connection),
        AuditKind("dns", "DNS", ("host",), DNS_ACTIVITY, dns_query),
        AuditKind("security_event", "security event", ("event",), NETWORK_ACTIVITY, security_event),
        AuditKind("policy_change", "policy change", ("event", "detail"), API_ACTIVITY, api_change),
        AuditKind("lifecycle", "lifecycle", ("event", "detail"), API_ACTIVITY, api_change),
        AuditKind("api", "API call", ("method", "path"), API_ACTIVITY, api_call),
        AuditKind("command", "command", ("method", "detail"), PROCESS_ACTIVITY, execd_operation),
        AuditKind("file", "file", ("method", "detail"), FILE_ACTIVITY, execd_operation),
        AuditKind("process", "process", ("method", "detail"), PROCESS_ACTIVITY, process_event),
    )
}
LABELS = {name: kind.label for name, kind in KINDS.items()}
# The kinds of what ran and was touched inside a sandbox (OCSF System Activity): shown by their
# operation and path, not as a network request.
SYSTEM_KINDS = tuple(name for name, kind in KINDS.items() if kind.ocsf.category_uid == 1)
