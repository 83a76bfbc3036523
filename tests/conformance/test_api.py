"""The lifecycle API's own contract, over HTTP against the running server: auth, error shape,
request ids, list filters and pagination, endpoints, egress token, and schemathesis."""

from __future__ import annotations

import time

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.support.server import SandgateServer

pytestmark = pytest.mark.root


def test_open_paths_and_auth_codes(server: SandgateServer) -> None:
    bare = httpx.Client(base_url=server.base_url, trust_env=False)
    assert bare.get("/health").json() == {"status": "healthy"}
    assert bare.get("/openapi.json").status_code == 200
    missing = bare.get("/v1/sandboxes")
    assert (missing.status_code, missing.json()["code"]) == (401, "MISSING_API_KEY")
    wrong = bare.get("/sandboxes", headers={"OPEN-SANDBOX-API-KEY": "nope"})
    assert (wrong.status_code, wrong.json()["code"]) == (401, "INVALID_API_KEY")
    assert wrong.headers["X-Request-ID"]


def test_errors_are_code_and_message(server: SandgateServer) -> None:
    with server.client() as client:
        unknown = client.get("/v1/sandboxes/does-not-exist", headers={"X-Request-ID": "req-42"})
        assert unknown.status_code == 404 and set(unknown.json()) == {"code", "message"}
        assert unknown.headers["X-Request-ID"] == "req-42"
        invalid = client.post("/v1/sandboxes", json={"image": {"uri": "sandgate/host"}, "timeout": 5})
        assert invalid.status_code == 422 and "timeout" in invalid.json()["message"]
        # not a reference (an unknown one is pulled: tests/images/test_pull.py has those answers)
        image = client.post("/v1/sandboxes", json={"image": {"uri": "No/Such-Image"}, "entrypoint": ["x"]})
        assert image.status_code == 400 and "No/Such-Image" in image.json()["message"]


def test_list_filters_pagination_metadata_and_egress_token(server: SandgateServer) -> None:
    first = server.create_sandbox(metadata={"team": "a", "k": "x=y&z"}, timeout=600)
    second = server.create_sandbox(metadata={"team": "b"})
    with server.client() as client:
        by_team = client.get("/v1/sandboxes", params={"metadata": "team=a"}).json()
        assert [s["id"] for s in by_team["items"]] == [first["id"]]
        tricky = client.get("/v1/sandboxes", params={"metadata": "k=x%3Dy%26z"}).json()
        assert [s["id"] for s in tricky["items"]] == [first["id"]]
        page = client.get("/v1/sandboxes", params={"pageSize": 1, "page": 2, "state": "Running"}).json()
        assert page["pagination"] == {
            "page": 2,
            "pageSize": 1,
            "totalItems": 2,
            "totalPages": 2,
            "hasNextPage": False,
        }
        # a state no sandbox is in (sandgate never produces Allocated) matches nothing, no 400
        mixed = client.get("/v1/sandboxes", params={"state": ["Pending", "Allocated", "running"]})
        assert mixed.status_code == 200, mixed.text
        assert {s["id"] for s in mixed.json()["items"]} == {first["id"], second["id"]}
        nobody = client.get("/v1/sandboxes", params={"state": ["Allocated", "Evicted"], "metadata": "team=a"})
        assert nobody.status_code == 200, nobody.text
        assert nobody.json() == {
            "items": [],
            "pagination": {"page": 1, "pageSize": 20, "totalItems": 0, "totalPages": 0, "hasNextPage": False},
        }
        assert "expiresAt" not in client.get(f"/v1/sandboxes/{second['id']}").json()  # nulls are omitted

        patched = client.patch(
            f"/v1/sandboxes/{first['id']}/metadata", json={"team": None, "new": "1"}
        ).json()
        assert patched["metadata"] == {"k": "x=y&z", "new": "1"}

        egress = client.get(f"/v1/sandboxes/{first['id']}/endpoints/18080").json()
        token = egress["headers"]["OPENSANDBOX-EGRESS-AUTH"]
        url = f"http://{egress['endpoint']}/policy"
        assert httpx.get(url, trust_env=False).status_code == 401
        other = client.get(f"/v1/sandboxes/{second['id']}/endpoints/18080").json()
        other_token = other["headers"]["OPENSANDBOX-EGRESS-AUTH"]
        assert (
            httpx.get(url, headers={"OPENSANDBOX-EGRESS-AUTH": other_token}, trust_env=False).status_code
            == 401
        )
        status = httpx.get(url, headers={"OPENSANDBOX-EGRESS-AUTH": token}, trust_env=False).json()
        assert status["mode"] == "deny_all"  # created without networkPolicy: deny everything
        bad = httpx.patch(
            url, json=[{"action": "allow", "target": "*"}], headers={"OPENSANDBOX-EGRESS-AUTH": token}
        )
        assert bad.status_code == 400 and bad.headers["content-type"].startswith("text/plain")

        assert client.post(f"/v1/sandboxes/{first['id']}/pause").status_code == 202
        assert client.get(f"/v1/sandboxes/{first['id']}").json()["status"]["state"] == "Paused"
        assert client.post(f"/v1/sandboxes/{first['id']}/resume").status_code == 202
        for sandbox in (first, second):
            assert client.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 204


def test_openapi_passes_schemathesis_without_server_errors(server: SandgateServer) -> None:
    schema = schemathesis.openapi.from_url(
        f"{server.base_url}/openapi.json", headers={"OPEN-SANDBOX-API-KEY": server.api_key}
    )
    failures: list[str] = []
    for operation in schema.get_all_operations():
        op = operation.ok()
        if op.method.upper() == "POST" and op.path.endswith("/sandboxes"):
            continue  # creates real sandboxes; covered by the conformance flows

        @settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(case=op.as_strategy())
        def check(case: schemathesis.Case) -> None:
            response = case.call(base_url=server.base_url, headers={"OPEN-SANDBOX-API-KEY": server.api_key})
            # a documented 501 is the answer of a feature sandgate does not offer (api/unsupported.py)
            not_offered = response.status_code == 501 and "501" in case.operation.definition.raw["responses"]
            if response.status_code >= 500 and not not_offered:
                failures.append(
                    f"{case.method} {case.formatted_path}: {response.status_code} {response.text[:200]}"
                )

        check()
    assert not failures, "\n".join(failures)


def test_audit_api_and_console_are_mounted(server: SandgateServer) -> None:
    """The audit query API sits behind the API key; the console has its own login page."""
    sandbox_id = server.create_sandbox()["id"]
    with server.client() as client:
        client.delete(f"/v1/sandboxes/{sandbox_id}")
    bare = httpx.Client(base_url=server.base_url, trust_env=False)
    assert bare.get("/v1/audit").status_code == 401
    assert bare.get("/console/login").status_code == 200
    with server.client() as client:
        deadline_records: list[dict[str, object]] = []
        for _ in range(50):  # the index follows the log in the background
            deadline_records = client.get("/v1/audit", params={"sandbox": sandbox_id}).json()["records"]
            if deadline_records:
                break
            time.sleep(0.1)
        assert any(r["kind"] == "policy_change" for r in deadline_records)
