"""The audit API over a real uvicorn server: auth, pages, cursors, OCSF, summary, SSE follow."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx

from tests.audit.conftest import API_KEY, Served, generated, wait_indexed, write_records

AUTH = {"OPEN-SANDBOX-API-KEY": API_KEY}


def test_every_route_needs_the_api_key(served: Served) -> None:
    for path in ("/v1/audit", "/v1/audit/summary", "/v1/audit/follow", "/v1/audit/index"):
        assert httpx.get(served.url + path).status_code == 401
        assert httpx.get(served.url + path, headers={"OPEN-SANDBOX-API-KEY": "wrong"}).status_code == 401


def test_pages_with_cursor_and_filters(served: Served) -> None:
    records = generated(400)
    write_records(served.state_dir, records)
    wait_indexed(served.store, 400)
    denied = sorted(
        (r for r in records if r["decision"] == "deny" and r["sandbox"] == "sbx-0000"),
        key=lambda r: r["ts"],
        reverse=True,
    )
    seen: list[str] = []
    params: dict[str, Any] = {"sandbox": "sbx-0000", "decision": "deny", "limit": 3, "since": "1d"}
    for _ in range(200):
        body = httpx.get(served.url + "/v1/audit", params=params, headers=AUTH).raise_for_status().json()
        seen.extend(r["id"] for r in body["records"])
        if not body["next_cursor"]:
            break
        params["cursor"] = body["next_cursor"]
    assert seen == [r["id"] for r in denied] and len(seen) > 3


def test_bad_filters_say_what_to_fix(served: Served) -> None:
    answer = httpx.get(served.url + "/v1/audit", params={"since": "last week"}, headers=AUTH)
    assert answer.status_code == 400 and "1h" in answer.json()["detail"]
    answer = httpx.get(served.url + "/v1/audit", params={"decision": "maybe"}, headers=AUTH)
    assert answer.status_code == 400 and "decision" in answer.json()["detail"]
    answer = httpx.get(served.url + "/v1/audit", params={"cursor": "nope"}, headers=AUTH)
    assert answer.status_code == 400 and "cursor" in answer.json()["detail"]


def test_ocsf_format_and_summary(served: Served) -> None:
    records = generated(300)
    write_records(served.state_dir, records)
    wait_indexed(served.store, 300)
    body = (
        httpx.get(
            served.url + "/v1/audit", params={"format": "ocsf", "kind": "request", "limit": 20}, headers=AUTH
        )
        .raise_for_status()
        .json()
    )
    assert body["records"] and all(e["class_uid"] == 4002 for e in body["records"])
    assert all(e["metadata"]["version"] == "1.3.0" for e in body["records"])
    summary = (
        httpx.get(served.url + "/v1/audit/summary", params={"sandbox": "sbx-0001"}, headers=AUTH)
        .raise_for_status()
        .json()
    )
    mine = [r for r in records if r["sandbox"] == "sbx-0001"]
    assert summary["total"] == len(mine)
    assert summary["denied"] == sum(r["decision"] == "deny" for r in mine)


def test_index_health_counts_what_it_could_not_take(served: Served) -> None:
    records = generated(5)
    write_records(served.state_dir, records[:3])
    with (served.state_dir / "audit.jsonl").open("a") as handle:
        handle.write('{"v":1,"kind":"request","id":"cut-mid-li\n')  # a line a crash cut short
    write_records(served.state_dir, records[3:])
    wait_indexed(served.store, 5)
    health = httpx.get(served.url + "/v1/audit/index", headers=AUTH).raise_for_status().json()
    assert health == {"records": 5, "malformed_lines": 1, "gaps": 0}


def read_events(response: httpx.Response, wanted: int, timeout: float) -> list[tuple[int, dict[str, Any]]]:
    events: list[tuple[int, dict[str, Any]]] = []
    event_id = 0
    deadline = time.monotonic() + timeout
    for line in response.iter_lines():
        if line.startswith("id: "):
            event_id = int(line[4:])
        elif line.startswith("data: "):
            events.append((event_id, json.loads(line[6:])))
            if len(events) >= wanted:
                return events
        assert time.monotonic() < deadline, f"only {len(events)} of {wanted} events within {timeout} s"
    return events


def test_follow_streams_new_matching_records_and_resumes(served: Served) -> None:
    old = generated(50, seed=1)
    write_records(served.state_dir, old)
    wait_indexed(served.store, 50)
    fresh = [r | {"id": f"fresh-{n}", "sandbox": "sbx-live"} for n, r in enumerate(generated(40, seed=2))]
    expected = [r["id"] for r in fresh if r["decision"] == "deny"]
    assert expected
    timer = threading.Timer(0.5, write_records, args=(served.state_dir, fresh))
    with httpx.stream(
        "GET",
        served.url + "/v1/audit/follow",
        params={"sandbox": "sbx-live", "decision": "deny"},
        headers=AUTH,
        timeout=10,
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        timer.start()
        events = read_events(response, len(expected), timeout=10)
    assert [record["id"] for _, record in events] == expected, "only new, matching records, in order"
    # Reconnecting with Last-Event-ID after the first event replays the rest.
    with httpx.stream(
        "GET",
        served.url + "/v1/audit/follow",
        params={"sandbox": "sbx-live", "decision": "deny"},
        headers={**AUTH, "Last-Event-ID": str(events[0][0])},
        timeout=10,
    ) as response:
        replay = read_events(response, len(expected) - 1, timeout=10)
    assert [record["id"] for _, record in replay] == expected[1:]
