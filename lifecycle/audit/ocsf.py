"""Map an audit record (schema v1) to an OCSF event of the version `OCSF_VERSION` names.

Rules:
1. Pure; one function, `to_ocsf(record)`. The record's kind row (`kinds.KINDS`) gives the class,
   its profiles and the activity; `CLASS_ATTRIBUTES` fills what that class has beyond the
   attributes every event has. Every event is valid against the OCSF schema of its
   `metadata.version` (tests/audit/test_ocsf_schema.py checks real records of a real run).
2. An attribute holds only what it means: an `ip` only an IP address, a `hostname` only a
   hostname (a name OCSF's hostname type refuses, `_srv._tcp...` or a redacted one, stays in
   `unmapped.host`), an endpoint only when it names something. Enumerations and their captions
   come from the schema; `type_uid` is `class_uid * 100 + activity_id`.
3. `unmapped` holds only what OCSF has no attribute for: the record's schema version and kind,
   the credential binding injected, whether TLS was intercepted, the record's `event` where no
   activity says it, the SNI (OCSF's `tls` object needs the negotiated TLS version, which the
   record does not have) and a host no hostname attribute can hold.
4. A request record left `incomplete` (forwarded, its response never ended) has status Unknown
   and `http_response.code` 0 (OCSF 1.3.0 requires a response; 0 is "none", as HAR writes it).
docs/audit.md has the field-by-field table.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import re
from collections.abc import Callable
from datetime import datetime
from importlib import metadata
from typing import Any
from urllib.parse import urlsplit

from sandgate.lifecycle.audit.kinds import (
    DNS_ACTIVITY,
    HTTP_METHODS,
    KINDS,
    OCSF_VERSION,
    OTHER,
    SECURITY_CONTROL,
    AuditKind,
)
from sandgate.lifecycle.audit.policy_change import PolicyChange
from sandgate.lifecycle.audit.record import RecordJSON
from sandgate.proxy import AUDIT_FILE, INCOMPLETE

Event = dict[str, Any]

# decision -> (action_id, action, disposition_id, disposition, status_id, status, severity_id)
_DECISION = {
    "allow": (1, "Allowed", 1, "Allowed", 1, "Success", 1),
    "report": (1, "Allowed", 17, "Logged", 1, "Success", 2),
    "deny": (2, "Denied", 2, "Blocked", 2, "Failure", 3),
}
_SEVERITY = {1: "Informational", 2: "Low", 3: "Medium", 4: "High"}
# OCSF's hostname_t (and no longer than a DNS name may be).
_HOSTNAME = re.compile(
    r"(([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9\-]*[a-zA-Z0-9])\.)*([A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9\-]*[A-Za-z0-9])"
)
_STRING_MAX = 65_535  # OCSF's string_t
_QTYPE = re.compile(r"qtype=(\S+)")  # the proxy's DNS detail starts with the question's type


def _product_version() -> str:
    try:
        return metadata.version("sandgate")
    except metadata.PackageNotFoundError:
        return "unknown"


_PRODUCT = {"name": "sandgate", "vendor_name": "sandgate", "version": _product_version()}


def to_ocsf(record: RecordJSON) -> Event:
    """One OCSF event for one audit record (the dict form the index and API return)."""
    kind = KINDS[record["kind"]]
    activity_id, activity_name = kind.activity(record)
    _action_id, _action, _disposition_id, _disposition, status_id, status, severity_id = _DECISION[
        record["decision"]
    ]
    if record["kind"] == "security_event":
        severity_id = 4
    when = datetime.fromisoformat(record["ts"].replace("Z", "+00:00"))
    event: Event = {
        "class_uid": kind.ocsf.uid,
        "class_name": kind.ocsf.name,
        "category_uid": kind.ocsf.category_uid,
        "category_name": kind.ocsf.category_name,
        "activity_id": activity_id,
        "activity_name": activity_name,
        "type_uid": kind.ocsf.uid * 100 + activity_id,
        "type_name": f"{kind.ocsf.name}: {'Other' if activity_id == OTHER else activity_name}",
        "time": int(when.timestamp() * 1000),
        "severity_id": severity_id,
        "severity": _SEVERITY[severity_id],
        "status_id": status_id,
        "status": status,
        "message": record["reason"],
        "metadata": {
            "version": OCSF_VERSION,
            "uid": record["id"],
            "original_time": record["ts"],
            "log_name": AUDIT_FILE,
            "profiles": list(kind.ocsf.profiles),
            "product": _PRODUCT,
        },
        "unmapped": {"schema_version": record["v"], "kind": record["kind"]},
    }
    if SECURITY_CONTROL in kind.ocsf.profiles:
        _add_security_control(event, record)
    CLASS_ATTRIBUTES[kind.ocsf.uid](event, record, kind)
    if record.get("principal"):
        _add_principal(event, record["principal"])
    event["unmapped"] = {key: value for key, value in event["unmapped"].items() if value is not None}
    return event


def _add_principal(event: Event, principal: dict[str, Any]) -> None:
    """Who made a control-plane call: `actor.user` (its uid the key id or OIDC subject, its org
    the tenant, its one group the role; an admin is OCSF's Admin user type), how it proved
    itself in `unmapped.principal_via` (and the credential kind a record's detail names, `api-key`
    or `execd-token`, in `unmapped.credential`)."""
    admin = principal["role"] == "admin"
    actor = event.setdefault("actor", {})
    if credential := actor.get("user", {}).get("name"):  # the credential the call showed
        event["unmapped"]["credential"] = credential
    actor["user"] = {
        "uid": principal["id"],
        "name": principal["id"],
        "type_id": 2 if admin else 1,
        "type": "Admin" if admin else "User",
        "org": {"uid": principal["tenant"], "name": principal["tenant"]},
        "groups": [{"name": principal["role"]}],
    }
    event["unmapped"]["principal_via"] = principal["via"]


def _add_security_control(event: Event, record: RecordJSON) -> None:
    action_id, action, disposition_id, disposition, *_ = _DECISION[record["decision"]]
    event |= {
        "action_id": action_id,
        "action": action,
        "disposition_id": disposition_id,
        "disposition": disposition,
    }
    if record.get("rule"):
        event["firewall_rule"] = {"uid": record["rule"], "name": record["rule"], "desc": record["reason"]}


def _network(event: Event, record: RecordJSON, kind: AuditKind) -> None:
    """What Network, HTTP and DNS Activity share: endpoints, connection, traffic, duration."""
    event["status_detail"] = _bounded(record.get("detail") or record["reason"])
    source = _address(record.get("client"))
    if record["sandbox"] != "-":  # a connection from an address that names no sandbox
        source |= {"uid": record["sandbox"], "name": record["sandbox"]}
    if source:
        event["src_endpoint"] = source
    destination = _address(record.get("upstream"))
    if record.get("via"):  # it left through the company's proxy: `upstream` is that proxy's address
        event["proxy_endpoint"] = _proxy_endpoint(record["via"], destination)
        event["metadata"]["profiles"].append(NETWORK_PROXY)
        destination = {}
    host = None if kind.ocsf.uid == DNS_ACTIVITY.uid else record.get("host")  # DNS: the question's
    if host and _is_ip(host):
        destination.setdefault("ip", host)
    elif host and _hostname(host):
        destination["hostname"] = host
    elif host:
        event["unmapped"]["host"] = host
    if destination:
        if record.get("port") is not None:
            destination.setdefault("port", record["port"])
        event["dst_endpoint"] = destination
    if (process := _connection_process(record.get("process"))) is not None:
        event["actor"] = {"process": process}
    elif record.get("process"):
        event["unmapped"]["process"] = record["process"]  # why the process is not known
    event["connection_info"] = {"direction_id": 2, "direction": "Outbound"}
    if kind.name in ("request", "connection"):  # DNS and some security events may come over UDP
        event["connection_info"] |= {"protocol_name": "tcp", "protocol_num": 6}
    event["traffic"] = {
        "bytes_in": record["bytes_in"],
        "bytes_out": record["bytes_out"],
        "bytes": record["bytes_in"] + record["bytes_out"],
    }
    if record.get("duration_ms") is not None:
        event["duration"] = round(record["duration_ms"])
    if record["kind"] != "security_event":  # a security event's `event` is its activity_name
        event["unmapped"]["event"] = record.get("event")
    event["unmapped"] |= {
        "binding": record.get("binding"),
        "inspect": record.get("inspect"),
        "sni": record.get("sni"),
    }


def _http(event: Event, record: RecordJSON, kind: AuditKind) -> None:
    _network(event, record, kind)
    scheme, host, port, path = (
        record.get("scheme") or "http",
        record.get("host"),
        record.get("port"),
        record.get("path"),
    )
    url: dict[str, Any] = {"scheme": scheme, "port": port, "path": _bounded(path or "")}
    url["url_string"] = _bounded(f"{scheme}://{host}:{port}{path or ''}")
    if host and _hostname(host):
        url["hostname"] = host
    event["http_request"] = {"url": url}
    if record.get("method") in HTTP_METHODS:  # OCSF 1.3.0 enumerates these: others stay in unmapped
        event["http_request"]["http_method"] = record["method"]
    else:
        event["unmapped"]["method"] = record.get("method")
    # OCSF 1.3.0 requires a response; a request whose response never ended has none: code 0,
    # "no response", as HAR and curl write it.
    event["http_response"] = {"code": record["status"] if record.get("status") is not None else 0}
    if record.get("event") == INCOMPLETE:  # forwarded; no response end was recorded
        event["status_id"], event["status"] = 0, "Unknown"
        event["status_detail"] = f"{record['reason']}; incomplete: forwarded, its response never ended"


def _dns(event: Event, record: RecordJSON, kind: AuditKind) -> None:
    _network(event, record, kind)
    """The name asked is the query's, not an endpoint's (dst_endpoint is the resolver's address)."""
    host = record.get("host")
    if host and _hostname(host):
        event["query"] = {"hostname": host}
        if qtype := _QTYPE.match(record.get("detail") or ""):
            event["query"]["type"] = qtype.group(1)
    else:
        event["unmapped"]["host"] = host


def _api(event: Event, record: RecordJSON, _kind: AuditKind) -> None:
    """A control-plane change (API Activity): who, which operation, on which sandbox's document.
    The caller's address is not recorded: `client` names the control plane (src_endpoint's
    service), and `actor` the credential the caller used (`api-key`, `egress-token`, `api`), its
    principal when the record names one (`_add_principal`). An `api` record is one call: its
    action, route, answer status and what it acted on."""
    if record["kind"] == "api":
        _api_call(event, record)
        return
    change = PolicyChange.from_detail(record.get("detail"))
    operation = change.change or record.get("event") or record["reason"]
    event["actor"] = {"user": {"name": change.actor or "unknown"}}
    event["api"] = {"operation": operation, "service": {"name": "sandgate"}}
    event["src_endpoint"] = _address(record["client"]) or {"svc_name": record["client"]}
    resource: dict[str, Any] = {"uid": record["sandbox"], "name": record["sandbox"]}
    if record["kind"] == "lifecycle":  # the sandbox itself: its detail is the old and new expiry
        resource["type"] = "sandbox"
        resource["data"] = _detail_object(record.get("detail"))
    else:
        document = "credential vault" if operation.startswith("credential-vault") else "egress policy"
        resource["type"] = f"sandbox {document}"
        if change.revision is not None:
            resource["version"] = str(change.revision)
        resource["data"] = change.model_dump(exclude={"actor", "change"})
    event["resources"] = [resource]


def _api_call(event: Event, record: RecordJSON) -> None:
    event["api"] = {"operation": record["reason"], "service": {"name": "sandgate"}}
    if record.get("status") is not None:
        event["api"]["response"] = {"code": record["status"]}
    event["src_endpoint"] = {"svc_name": record["client"]}
    if not record.get("principal"):  # a call refused for want of a valid key
        event["actor"] = {"user": {"name": "unauthenticated"}}
    method = record.get("method") or ""
    event["http_request"] = {"url": {"path": record.get("path") or "/"}}
    if method in HTTP_METHODS:
        event["http_request"]["http_method"] = method
    else:  # PATCH, and a WebSocket (WS): not in OCSF's list
        event["unmapped"]["method"] = method
    if record["decision"] == "deny":
        event["status_id"], event["status"] = 2, "Failure"
        event["status_detail"] = f"answered {record.get('status')}"
    target = record["sandbox"] if record["sandbox"] != "-" else None
    data = _detail_object(record.get("detail"))
    if target is not None or data:
        event["resources"] = [{"uid": target or "-", "type": "sandbox" if target else "server", "data": data}]


def _system(event: Event, record: RecordJSON, kind: AuditKind) -> dict[str, Any]:
    """What Process and File System Activity share: the sandbox as the device, the outcome, the
    caller (an execd call's API key or token, a process event's parent); the record's facts
    (its `detail`) not mapped here are returned for the class to take from and the rest goes
    under `unmapped.facts`."""
    facts: dict[str, Any] = json.loads(record.get("detail") or "{}")
    event["device"] = {"type_id": 6, "type": "Virtual", "uid": record["sandbox"], "name": record["sandbox"]}
    failed = (
        facts.get("exit_code") not in (None, 0) or (record.get("status") or 0) >= 400 or "problem" in facts
    )
    if failed:
        event["status_id"], event["status"] = 2, "Failure"
        event["status_detail"] = _bounded(str(facts.get("problem") or facts.get("error") or record["reason"]))
    if record.get("event") == INCOMPLETE:  # written ahead; its outcome was never recorded
        event["status_id"], event["status"] = 0, "Unknown"
        event["status_detail"] = "incomplete: sent to execd, its answer never ended"
    if record.get("duration_ms") is not None:
        event["duration"] = round(record["duration_ms"])
    if (actor := facts.pop("actor", None)) is not None:
        event["actor"] = {"user": {"name": actor}, "app_name": "sandgate"}
        event["unmapped"]["client"] = record.get("client")  # these classes have no src_endpoint
    event["unmapped"]["facts"] = facts
    return facts


def _process(event: Event, record: RecordJSON, kind: AuditKind) -> None:
    """An execd command or code cell (`command`), or a program the kernel saw start (`process`)."""
    facts = _system(event, record, kind)
    if record["kind"] == "process":
        process: dict[str, Any] = {"pid": facts.pop("pid", 0) or 0}
        if facts.get("argv"):
            process["cmd_line"] = _bounded(" ".join(facts.pop("argv")))
        if exe := facts.pop("exe", None):
            process["file"] = _regular_file(exe)
        if (ppid := facts.pop("ppid", None)) is not None:
            process["parent_process"] = {"pid": ppid}
            event["actor"] = {"process": {"pid": ppid}}
        if "target_pid" in facts:  # ptrace: the tracer is the actor, the traced the process
            event["actor"] = {"process": {"pid": process["pid"]}}
            process = {"pid": facts.pop("target_pid")}
        if (uid := facts.pop("uid", None)) is not None:
            process["user"] = {"uid": str(uid)}
        event["actor"] = event.get("actor") or {"app_name": "kernel"}
    else:
        process = {"uid": facts.get("run_id") or record["id"]}
        if text := facts.get("command") or facts.get("code") or facts.get("input"):
            process["cmd_line"] = _bounded(text)
        if facts.get("exit_code") is not None:
            event["exit_code"] = facts["exit_code"]
    event["process"] = process


def _file(event: Event, record: RecordJSON, kind: AuditKind) -> None:
    """An execd file operation: its first file (with the sha256 of what was written or read) and,
    for a move, where it went."""
    facts = _system(event, record, kind)
    files = facts.get("files") or []
    path = record.get("path") or (files[0].get("path") if files else None) or ""
    folder = facts.get("op") in ("mkdir", "rmdir", "list", "search")
    file: dict[str, Any] = {
        "name": path.rstrip("/").rsplit("/", 1)[-1] or path or "-",
        "type_id": 2 if folder else 1,
    }
    if path:
        file["path"] = _bounded(path)
    written = files[0] if files else {}
    digest = written.get("sha256") or written.get("new_sha256") or facts.get("read_sha256")
    if digest:
        file["hashes"] = [{"algorithm_id": 3, "algorithm": "SHA-256", "value": digest}]
    if (size := written.get("bytes", written.get("new_bytes"))) is not None:
        file["size"] = size
    event["file"] = file
    moves = facts.get("moves") or []
    if moves and isinstance(moves[0].get("dest"), str):
        dest = moves[0]["dest"]
        event["file_result"] = _regular_file(dest)


def _regular_file(path: str) -> dict[str, Any]:
    return {"name": path.rsplit("/", 1)[-1] or path, "path": path, "type_id": 1}


def _connection_process(found: dict[str, Any] | None) -> dict[str, Any] | None:
    """The OCSF process (the `host` profile's `actor.process`) that opened a connection."""
    if not found or found.get("pid") is None:
        return None
    process: dict[str, Any] = {"pid": found["pid"]}
    if exe := found.get("exe"):
        process["file"] = _regular_file(exe)
    return process


def _detail_object(detail: str | None) -> dict[str, Any]:
    """A record's JSON detail as an object, never failing (what is no object reads as empty)."""
    try:
        data = json.loads(detail or "{}")
    except ValueError:
        return {}
    return {k: v for k, v in data.items() if k != "actor"} if isinstance(data, dict) else {}


CLASS_ATTRIBUTES: dict[int, Callable[[Event, RecordJSON, AuditKind], None]] = {
    1001: _file,
    1007: _process,
    4001: _network,
    4002: _http,
    4003: _dns,
    6003: _api,
}


NETWORK_PROXY = "network_proxy"  # the OCSF profile of proxy_endpoint


def _proxy_endpoint(via: str, address: dict[str, Any]) -> dict[str, Any]:
    """The upstream proxy (`via`, http://host:port) as OCSF's network_proxy endpoint."""
    url = urlsplit(via)
    endpoint = dict(address)
    if url.hostname and _is_ip(url.hostname):
        endpoint.setdefault("ip", url.hostname)
    elif url.hostname and _hostname(url.hostname):
        endpoint["hostname"] = url.hostname
    if url.port is not None:
        endpoint.setdefault("port", url.port)
    return endpoint


def _address(address: str | None) -> dict[str, Any]:
    """'ip:port' or '[v6]:port' -> {ip, port}; anything else (None, '-', a word) -> {}."""
    host, _, port = (address or "").rpartition(":")
    host = host.strip("[]")
    return {"ip": host, "port": int(port)} if port.isdigit() and _is_ip(host) else {}


@functools.lru_cache(maxsize=4096)  # a run's addresses and names repeat: parsing was half the cost
def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


@functools.lru_cache(maxsize=4096)
def _hostname(text: str) -> bool:
    return len(text) <= 253 and _HOSTNAME.fullmatch(text) is not None


def _bounded(text: str) -> str:
    """Within OCSF's string length (the JSONL keeps the whole text)."""
    return text if len(text) <= _STRING_MAX else text[: _STRING_MAX - 1] + "…"
