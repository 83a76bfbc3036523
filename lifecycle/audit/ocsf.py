"""Map an audit record (schema v1) to an OCSF 1.3.0 event.

Rules: pure and table-driven; one function, `to_ocsf(record)`. Request records become HTTP
Activity (4002), connection records and security events Network Activity (4001), DNS records
DNS Activity (4003), policy changes the OCSF Base Event (0) since OCSF has no class for a
network-policy edit. Everything sandgate-specific that OCSF has no attribute for (sandbox kind,
binding, inspect, event, detail, schema version) goes under `unmapped`. A request record left
`incomplete` (forwarded, its response never ended) has status Unknown. docs/audit.md has the
field-by-field table.
"""

from __future__ import annotations

from datetime import datetime
from importlib import metadata
from typing import Any

from sandgate.lifecycle.audit.record import RecordJSON
from sandgate.proxy import AUDIT_FILE, INCOMPLETE

OCSF_VERSION = "1.3.0"

# HTTP Activity activity_id by request method (OCSF 1.3.0 enumerates no PATCH: Other + name).
_HTTP_ACTIVITY = {
    "CONNECT": 1,
    "DELETE": 2,
    "GET": 3,
    "HEAD": 4,
    "OPTIONS": 5,
    "POST": 6,
    "PUT": 7,
    "TRACE": 8,
}
# (class_uid, class_name, category_uid, category_name) per record kind.
_CLASS = {
    "request": (4002, "HTTP Activity", 4, "Network Activity"),
    "connection": (4001, "Network Activity", 4, "Network Activity"),
    "security_event": (4001, "Network Activity", 4, "Network Activity"),
    "dns": (4003, "DNS Activity", 4, "Network Activity"),
    "policy_change": (0, "Base Event", 0, "Uncategorized"),
    "lifecycle": (0, "Base Event", 0, "Uncategorized"),
}
# decision -> (action_id, action, disposition_id, disposition, status_id, status, severity_id)
_DECISION = {
    "allow": (1, "Allowed", 1, "Allowed", 1, "Success", 1),
    "report": (1, "Allowed", 17, "Logged", 1, "Success", 2),
    "deny": (2, "Denied", 2, "Blocked", 2, "Failure", 3),
}
_SEVERITY = {1: "Informational", 2: "Low", 3: "Medium", 4: "High"}


def _product_version() -> str:
    try:
        return metadata.version("sandgate")
    except metadata.PackageNotFoundError:
        return "unknown"


_PRODUCT = {"name": "sandgate", "vendor_name": "sandgate", "version": _product_version()}


def _endpoint(address: str | None) -> dict[str, Any]:
    """'ip:port' or '[v6]:port' -> {ip, port}."""
    if not address:
        return {}
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    return {"ip": host, "port": int(port)} if port.isdigit() and host else {"ip": address}


def _activity(record: RecordJSON) -> tuple[int, str]:
    kind = record["kind"]
    if kind == "request":
        method = (record.get("method") or "").upper()
        return _HTTP_ACTIVITY.get(method, 99), method.title() or "Unknown"
    if kind == "connection":
        if record.get("event") == "closed":  # a pass-through connection's end: bytes, not a decision
            return 2, "Close"
        return (5, "Refuse") if record["decision"] == "deny" else (6, "Traffic")
    if kind == "dns":
        return 1, "Query"
    return 99, record.get("event") or kind


def to_ocsf(record: RecordJSON) -> dict[str, Any]:
    """One OCSF event for one audit record (the dict form the index and API return)."""
    class_uid, class_name, category_uid, category_name = _CLASS[record["kind"]]
    activity_id, activity_name = _activity(record)
    action_id, action, disposition_id, disposition, status_id, status, severity_id = _DECISION[
        record["decision"]
    ]
    if record["kind"] == "security_event":
        severity_id = 4
    when = datetime.fromisoformat(record["ts"].replace("Z", "+00:00"))
    source = _endpoint(record.get("client")) | {"uid": record["sandbox"], "name": record["sandbox"]}
    destination = _endpoint(record.get("upstream"))
    if record.get("host"):
        destination["hostname"] = record["host"]
    if record.get("port") is not None and "port" not in destination:
        destination["port"] = record["port"]
    event: dict[str, Any] = {
        "class_uid": class_uid,
        "class_name": class_name,
        "category_uid": category_uid,
        "category_name": category_name,
        "activity_id": activity_id,
        "activity_name": activity_name,
        "type_uid": class_uid * 100 + activity_id,
        "time": int(when.timestamp() * 1000),
        "severity_id": severity_id,
        "severity": _SEVERITY[severity_id],
        "status_id": status_id,
        "status": status,
        "status_detail": record["reason"],
        "message": record["reason"],
        "action_id": action_id,
        "action": action,
        "disposition_id": disposition_id,
        "disposition": disposition,
        "metadata": {
            "version": OCSF_VERSION,
            "uid": record["id"],
            "original_time": record["ts"],
            "log_name": AUDIT_FILE,
            "profiles": ["security_control"],
            "product": _PRODUCT,
        },
        "src_endpoint": source,
        "dst_endpoint": destination,
        "connection_info": {
            "protocol_name": "udp" if record["kind"] == "dns" else "tcp",
            "direction_id": 2,
            "direction": "Outbound",
        },
        "traffic": {
            "bytes_in": record["bytes_in"],
            "bytes_out": record["bytes_out"],
            "bytes": record["bytes_in"] + record["bytes_out"],
        },
        "unmapped": {
            "schema_version": record["v"],
            "sandbox": record["sandbox"],
            "kind": record["kind"],
            "binding": record.get("binding"),
            "inspect": record.get("inspect"),
            "event": record.get("event"),
            "detail": record.get("detail"),
        },
    }
    if record.get("event") == INCOMPLETE:  # forwarded; no response end was recorded
        event["status_id"], event["status"] = 0, "Unknown"
        event["status_detail"] = f"{record['reason']}; incomplete: forwarded, its response never ended"
    if record.get("duration_ms") is not None:
        event["duration"] = round(record["duration_ms"])
    if record.get("rule"):
        event["firewall_rule"] = {"uid": record["rule"], "name": record["rule"], "desc": record["reason"]}
    if record.get("sni"):
        event["tls"] = {"sni": record["sni"]}
    _add_protocol_objects(event, record)
    return event


def _add_protocol_objects(event: dict[str, Any], record: RecordJSON) -> None:
    if record["kind"] == "request":
        url = {
            "scheme": record.get("scheme"),
            "hostname": record.get("host"),
            "port": record.get("port"),
            "path": record.get("path"),
        }
        url["url_string"] = f"{url['scheme'] or 'http'}://{url['hostname']}:{url['port']}{url['path'] or ''}"
        event["http_request"] = {"http_method": record.get("method"), "url": url}
        if record.get("status") is not None:
            event["http_response"] = {"code": record["status"]}
    elif record["kind"] == "dns":
        event["query"] = {"hostname": record.get("host")}
