"""The OpenSandbox Python SDK 1.1.1, unchanged, against a real `sandgate serve`.

Flow: create with networkPolicy + credentialProxy -> commands.run -> files write/read ->
egress get/patch -> credential-vault create/patch/get -> a request from inside the sandbox gets
the credential injected (and never sees it) -> kill.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from opensandbox import SandboxManagerSync, SandboxSync
from opensandbox.config.connection_sync import ConnectionConfigSync
from opensandbox.exceptions import SandboxException
from opensandbox.models.sandboxes import CredentialProxyConfig, NetworkPolicy, NetworkRule, SandboxFilter

from tests.conformance.conftest import API_HOST
from tests.support.server import SandgateServer

pytestmark = pytest.mark.root
SECRET = "sk-test-0123456789abcdef"


def connection(server: SandgateServer, **kwargs: object) -> ConnectionConfigSync:
    return ConnectionConfigSync(
        domain=server.domain,
        api_key=server.api_key,
        protocol="http",
        request_timeout=timedelta(seconds=30),
        disable_metrics=True,
        **kwargs,
    )


def test_sdk_create_run_files_egress_vault_kill(server: SandgateServer) -> None:
    sandbox = SandboxSync.create(
        "sandgate/host",
        entrypoint=["sleep", "infinity"],
        resource={"cpu": "1", "memory": "512Mi"},
        metadata={"suite": "conformance"},
        network_policy=NetworkPolicy(
            defaultAction="deny", egress=[NetworkRule(action="allow", target=API_HOST)]
        ),
        credential_proxy=CredentialProxyConfig(enabled=True),
        connection_config=connection(server),
        ready_timeout=timedelta(seconds=20),
    )
    try:
        execution = sandbox.commands.run("echo hello-from-$((40+2))")
        assert execution.exit_code == 0
        assert "".join(m.text for m in execution.logs.stdout).strip() == "hello-from-42"

        sandbox.files.write_file("/tmp/conformance.txt", "written by the SDK")
        assert sandbox.files.read_file("/tmp/conformance.txt") == "written by the SDK"

        policy = sandbox.get_egress_policy()
        assert [(r.action, r.target) for r in policy.egress] == [("allow", API_HOST)]
        sandbox.patch_egress_rules([NetworkRule(action="deny", target="blocked.example.com")])
        targets = [r.target for r in sandbox.get_egress_policy().egress]
        assert targets == ["blocked.example.com", API_HOST]

        vault = sandbox.credential_vault
        state = vault.create(
            credentials=[{"name": "api-token", "source": {"type": "inline", "value": "old-value-1234"}}],
            bindings=[
                {
                    "name": "api",
                    "match": {"hosts": [API_HOST]},
                    "auth": {"type": "bearer", "credential": "api-token"},
                }
            ],
        )
        assert state.revision == 1
        state = vault.patch(
            expected_revision=1,
            credentials={"replace": [{"name": "api-token", "source": {"type": "inline", "value": SECRET}}]},
        )
        assert state.revision == 2
        fetched = vault.get()
        assert fetched.revision == 2 and [c.name for c in fetched.credentials] == ["api-token"]
        assert SECRET not in fetched.model_dump_json()
        assert vault.get_binding("api").auth.type == "bearer"

        run = sandbox.commands.run(f"curl -sS --max-time 10 https://{API_HOST}/echo")
        output = "".join(m.text for m in run.logs.stdout)
        assert run.exit_code == 0, output + "".join(m.text for m in run.logs.stderr)
        echoed = json.loads(output)
        authorization = {k.lower(): v for k, v in echoed["headers"].items()}["authorization"]
        assert authorization.startswith("Bearer ")
        assert SECRET not in output  # injected upstream, scrubbed on the way back

        denied = sandbox.commands.run(
            "curl -sS --max-time 10 -o /dev/null -w '%{http_code}' https://blocked.example.com/"
        )
        assert "".join(m.text for m in denied.logs.stdout) != "200"

        # OpenSandbox's clients filter by its pools' states too: one sandgate never produces
        # (Allocated) is a question that matches nothing, not an error
        manager = SandboxManagerSync.create(connection(server))
        try:
            listed = manager.list_sandbox_infos(
                SandboxFilter(states=["Pending", "Allocated", "Running"], metadata={"suite": "conformance"})
            )
            none = manager.list_sandbox_infos(SandboxFilter(states=["Allocated"]))
        finally:
            manager.close()
        assert [info.id for info in listed.sandbox_infos] == [sandbox.id]
        assert none.sandbox_infos == [] and none.pagination.total_items == 0
    finally:
        sandbox.kill()
        sandbox.close()
    with server.client() as client:
        assert client.get(f"/v1/sandboxes/{sandbox.id}").status_code == 404


def test_sdk_through_server_proxy(server: SandgateServer) -> None:
    """use_server_proxy: execd is reached through /v1/sandboxes/{id}/proxy/44772 with the API key."""
    sandbox = SandboxSync.create(
        "sandgate/host",
        entrypoint=["sleep", "infinity"],
        connection_config=connection(server, use_server_proxy=True),
        ready_timeout=timedelta(seconds=20),
    )
    try:
        endpoint = sandbox.get_endpoint(44772)
        assert "/proxy/44772" in endpoint.endpoint
        execution = sandbox.commands.run("printf proxied")
        assert "".join(m.text for m in execution.logs.stdout) == "proxied"
    finally:
        sandbox.kill()
        sandbox.close()


def test_sdk_create_quotes_a_failing_entrypoint(server: SandgateServer) -> None:
    """An entrypoint that starts and exits non-zero: the create's error quotes its path, status
    and stderr; one that fails after the create answered shows as Failed on GET, the same words."""
    with pytest.raises(SandboxException) as failed:
        SandboxSync.create(
            "sandgate/host",
            entrypoint=["/bin/sh", "-c", "echo boom-on-stderr >&2; exit 3"],
            connection_config=connection(server),
            ready_timeout=timedelta(seconds=20),
        )
    message = str(failed.value)
    assert "boom-on-stderr" in message and "the entrypoint /bin/sh exited with status 3" in message
    assert "Traceback" not in message and "posix_spawnp" not in message

    late = SandboxSync.create(
        "sandgate/host",
        entrypoint=["/bin/sh", "-c", "sleep 1; echo late-failure >&2; exit 4"],
        connection_config=connection(server),
        ready_timeout=timedelta(seconds=20),
    )
    try:
        assert late.get_info().status.state == "Running"
        deadline = time.monotonic() + 15
        while (status := late.get_info().status).state == "Running" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert status.state == "Failed" and status.reason == "SANDBOX_EXITED"
        assert "late-failure" in status.message
        assert "the entrypoint /bin/sh exited with status 4" in status.message
        # the list says what GET says, and a state filter goes by it
        manager = SandboxManagerSync.create(connection(server))
        try:
            failed_ones = manager.list_sandbox_infos(SandboxFilter(states=["Failed"])).sandbox_infos
            running = manager.list_sandbox_infos(SandboxFilter(states=["Running"])).sandbox_infos
        finally:
            manager.close()
        assert late.id in [info.id for info in failed_ones] and late.id not in [info.id for info in running]
    finally:
        late.kill()
        late.close()
