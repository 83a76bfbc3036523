"""Create, delete and egress changes of `Service`, in the fast tier (no root): every failure
point of a create (cold, and a warm-pool claim) leaves nothing behind, a failing undo step does
not stop the others, and a failed egress change leaves the old state in force.

The collaborators that need root (netns + nftables networks, the bubblewrap runtime, the proxy
child) are replaced by small loopback stand-ins; what runs is real: the SQLite store, the policy
compiler, and a real execd process per sandbox on its own 127.x address (so the create really
waits for `/ping`). The same flows run through a real `sandgate serve` as root in
tests/conformance and tests/lifecycle.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandgate.lifecycle.audit import PolicyChange
from sandgate.lifecycle.cgroups import Limits
from sandgate.lifecycle.confinement import SandboxNet
from sandgate.lifecycle.credential_state import CredentialEntry, VaultState
from sandgate.lifecycle.egress_control import EgressControl, VaultBuild
from sandgate.lifecycle.errors import LifecycleError
from sandgate.lifecycle.opensandbox_shapes import NetworkPolicy, NetworkRule
from sandgate.lifecycle.policy_book import SandgatePolicies
from sandgate.lifecycle.runtime.base import EXECD_PORT, SandboxSpec, ping_execd
from sandgate.lifecycle.sandbox_store import SandboxStore
from sandgate.lifecycle.service import CreateRequest, Service
from sandgate.policy import Policy
from sandgate.proxy import SandboxEntry

ALLOW_ONE = NetworkPolicy.model_validate(
    {"defaultAction": "deny", "egress": [{"action": "allow", "target": "api.example.test"}]}
)


class Broken(Exception):
    """What an injected failure raises (so a test can tell it from a real one)."""


class LoopbackConfinement:
    """Addresses in a random 127.x.y.0/24 instead of namespaces: each sandbox one address."""

    name = "loopback"

    def __init__(self, proxy: RecordingProxy) -> None:
        self.proxy = proxy
        self.prefix = f"127.{secrets.randbelow(200) + 20}.{secrets.randbelow(250) + 1}"
        self.live: dict[str, SandboxNet] = {}
        self.fail = False
        self.fail_destroy = False
        self._next = 2
        self._guard = threading.Lock()

    def prepare(self, sandbox_id: str) -> SandboxNet:
        if self.fail:
            raise Broken("network")
        with self._guard:  # the warm pool builds members on its own thread
            net = SandboxNet(
                netns=f"fake-{sandbox_id[:8]}", address=f"{self.prefix}.{self._next}", gateway=""
            )
            self._next += 1
            self.live[sandbox_id] = net
        return net

    def release(self, sandbox_id: str) -> None:
        if self.fail_destroy:
            raise Broken("network destroy")
        self.live.pop(sandbox_id, None)

    def adopt(self, keep: set[str]) -> set[str]:
        return {key for key in self.live if key in keep}


class ExecdRuntime:
    """Each sandbox is a real execd process listening on the sandbox's loopback address."""

    name = "execd-process"
    isolations = ("standard",)

    def __init__(self, root: Path) -> None:
        self.root = root
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.fail = False
        self.die_at_start = False
        self.fail_configure = False
        self.configured: dict[str, tuple[dict[str, str], Limits]] = {}

    def create(self, spec: SandboxSpec, net: SandboxNet | None) -> str:
        assert net is not None
        if self.fail:
            raise Broken("runtime")
        workdir = self.root / spec.sandbox_id
        workdir.mkdir()
        argv = [sys.executable, "-m", "sandgate.execd", "--host", net.address, "--port", str(EXECD_PORT),
                "--root", str(workdir)]  # fmt: skip
        if self.die_at_start:
            argv = [sys.executable, "-c", "print('entrypoint failed: no such file'); raise SystemExit(3)"]
        self.processes[spec.sandbox_id] = subprocess.Popen(
            argv, env={"PATH": os.environ["PATH"], "EXECD_ACCESS_TOKEN": spec.execd_token or ""},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        return net.address

    def delete(self, sandbox_id: str) -> None:
        process = self.processes.pop(sandbox_id, None)
        if process is not None:
            process.kill()
            process.communicate()

    def configure(self, sandbox_id: str, env: dict[str, str], limits: Limits) -> None:
        """What a warm-pool claim gives a running sandbox (the local runtime writes files)."""
        if self.fail_configure:
            raise Broken("configure")
        self.configured[sandbox_id] = (env, limits)

    def pause(self, sandbox_id: str) -> None: ...

    def resume(self, sandbox_id: str) -> None: ...

    def adopt(self) -> list[str]:
        return [key for key, process in self.processes.items() if process.poll() is None]

    def alive(self, sandbox_id: str) -> bool:
        process = self.processes.get(sandbox_id)
        return process is not None and process.poll() is None

    def log_tail(self, sandbox_id: str, limit: int = 2000) -> str:
        process = self.processes.get(sandbox_id)
        if process is None or process.poll() is None or process.stdout is None:
            return ""
        return process.stdout.read().decode(errors="replace")[-limit:]


class RecordingProxy:
    """The proxy's control socket: the entries it holds, by address."""

    def __init__(self) -> None:
        self.entries: dict[str, SandboxEntry] = {}
        self.fail = False

    def put_sandbox(self, entry: SandboxEntry) -> None:
        if self.fail:
            raise Broken("proxy")
        self.entries[entry.address] = entry

    def drop_sandbox(self, address: str) -> None:
        self.entries.pop(address, None)

    def metrics(self) -> str:
        return ""


class DictVault:
    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def put(self, name: str, value: str) -> None:
        self.values[name] = value

    def delete(self, name: str) -> None:
        self.values.pop(name, None)


def break_inserts(store: SandboxStore, table: str) -> None:
    """Make SQLite itself refuse every insert into `table` (as a full disk or a lock would)."""
    with store.transaction() as db:
        db.execute(
            f"CREATE TRIGGER refuse_{table} BEFORE INSERT ON {table} "
            f"BEGIN SELECT RAISE(ABORT, 'injected: {table} refused'); END"
        )


class Rig:
    def __init__(self, tmp_path: Path, pool_size: int = 0) -> None:
        (tmp_path / "sandboxes").mkdir()
        self.store = SandboxStore(tmp_path / "state.db")
        self.proxy = RecordingProxy()
        self.networks = LoopbackConfinement(self.proxy)
        self.runtime = ExecdRuntime(tmp_path / "sandboxes")
        self.vault = DictVault()
        self.audit: list[tuple[str, str]] = []
        self.bad_image = False
        self.egress = EgressControl(
            self.store,
            proxy=self.proxy,
            vault=self.vault,  # type: ignore[arg-type]
            policies=SandgatePolicies(max_rules=100),
            audit=self._audit,
        )
        self.service = Service(
            self.store,
            confinement=self.networks,
            runtime=self.runtime,
            egress=self.egress,
            check_image=self._check_image,
            ready_timeout=10.0,
            warm_pool_size=pool_size,
        )

    def _audit(self, sandbox_id: str, what: str, change: PolicyChange) -> None:
        self.audit.append((sandbox_id, what))

    def _check_image(self, image: str) -> None:
        if self.bad_image:
            raise Broken(f"image {image} not found")

    def assert_nothing_left(self) -> None:
        assert self.networks.live == {}
        assert self.proxy.entries == {}
        assert self.runtime.processes == {}
        assert self.store.list_sandboxes() == []
        assert self.vault.values == {}
        assert self.audit == []


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    yield from rigged(Rig(tmp_path))


@pytest.fixture
def pooled(tmp_path: Path) -> Iterator[Rig]:
    """A rig whose service has a warm pool of one, full before the test starts."""
    made = Rig(tmp_path, pool_size=1)
    made.service.start()
    assert made.service.pool is not None and made.service.pool.wait_full(30)
    yield from rigged(made)


def rigged(made: Rig) -> Iterator[Rig]:
    try:
        yield made
    finally:
        made.service.stop()
        for sandbox_id in list(made.runtime.processes):
            made.runtime.delete(sandbox_id)
        made.store.close()


def request(
    policy: NetworkPolicy | None = ALLOW_ONE,
    entrypoint: tuple[str, ...] = ("sleep", "infinity"),
    **limits: str,
) -> CreateRequest:
    return CreateRequest(
        image="sandgate/host", entrypoint=list(entrypoint), env={"GREETING": "hi"}, metadata={},
        extensions={}, platform=None, resource_limits=limits, timeout=600, network_policy=policy,
        credential_proxy=False,
    )  # fmt: skip


def test_create_runs_a_real_execd_and_delete_removes_every_part(rig: Rig) -> None:
    record = rig.service.create(request())
    assert record.state == "Running"
    assert ping_execd(record.address or "")
    assert rig.store.get_sandbox(record.id).state == "Running"
    assert rig.proxy.entries[record.address or ""].policy.egress[0].target == "api.example.test"
    assert rig.audit == [(record.id, "create")]

    rig.service.delete(record.id)
    rig.audit.clear()
    rig.assert_nothing_left()
    assert not ping_execd(record.address or "")


FAILURES: dict[str, Callable[[Rig], None]] = {
    "image": lambda rig: setattr(rig, "bad_image", True),
    "network": lambda rig: setattr(rig.networks, "fail", True),
    "proxy push": lambda rig: setattr(rig.proxy, "fail", True),
    "runtime start": lambda rig: setattr(rig.runtime, "fail", True),
    "execd never ready": lambda rig: setattr(rig.runtime, "die_at_start", True),
    "store sandbox": lambda rig: break_inserts(rig.store, "sandboxes"),
    "store policy": lambda rig: break_inserts(rig.store, "policies"),
}


@pytest.mark.parametrize("failure", FAILURES)
def test_a_failed_create_leaves_nothing_behind(rig: Rig, failure: str) -> None:
    FAILURES[failure](rig)
    with pytest.raises(LifecycleError) as raised:
        rig.service.create(request())
    assert raised.value.kind in ("invalid", "unavailable")
    rig.assert_nothing_left()


def test_a_failing_undo_step_does_not_stop_the_others(rig: Rig) -> None:
    rig.runtime.fail = True
    rig.networks.fail_destroy = True
    with pytest.raises(LifecycleError, match="could not be started: runtime"):
        rig.service.create(request())
    assert rig.proxy.entries == {} and rig.store.list_sandboxes() == []
    assert len(rig.networks.live) == 1  # the one step that failed; logged, the rest undone


def test_a_bad_resource_quantity_is_refused_before_anything_is_built(rig: Rig) -> None:
    with pytest.raises(LifecycleError, match=r"resourceLimits\.memory='lots'"):
        rig.service.create(request(memory="lots"))
    rig.assert_nothing_left()


def test_a_sandbox_that_dies_at_start_fails_with_its_output(rig: Rig) -> None:
    rig.runtime.die_at_start = True
    with pytest.raises(LifecycleError, match="entrypoint failed: no such file"):
        rig.service.create(request())


def test_an_invalid_policy_is_refused_before_anything_is_built(rig: Rig) -> None:
    misplaced_wildcard = NetworkRule(action="allow", target="*.*.example.test")
    with pytest.raises(LifecycleError) as raised:
        rig.service.create(request(NetworkPolicy(egress=[misplaced_wildcard])))
    assert raised.value.kind == "invalid"
    rig.assert_nothing_left()


def test_a_policy_change_the_proxy_refuses_leaves_the_old_policy(rig: Rig) -> None:
    record = rig.service.create(request())
    before = rig.egress.policy(record.id)
    rig.proxy.fail = True
    with pytest.raises(Broken):
        rig.egress.change_policy(record.id, deny_all, actor="test", what="egress replace")
    after = rig.egress.policy(record.id)
    assert (after.revision, after.document) == (before.revision, before.document)
    assert rig.proxy.entries[record.address or ""].policy == before.document


def test_a_policy_change_the_store_refuses_is_pushed_back(rig: Rig) -> None:
    """The proxy took the new policy, SQLite refused it: the proxy gets the stored one again."""
    record = rig.service.create(request())
    before = rig.egress.policy(record.id)
    break_inserts(rig.store, "policies")
    with pytest.raises(sqlite3.IntegrityError, match="injected"):
        rig.egress.change_policy(record.id, deny_all, actor="test", what="replace")
    assert rig.egress.policy(record.id) == before
    assert rig.proxy.entries[record.address or ""].policy == before.document
    assert rig.audit == [(record.id, "create")]


def deny_all(_current: Policy) -> Policy:
    return Policy(defaultAction="deny", egress=[])


def test_a_repush_never_puts_back_the_policy_a_change_replaced(rig: Rig) -> None:
    """The supervisor's repush after a proxy restart reads a sandbox's policy, and a change of
    that policy lands before the repush's push does: the proxy must end with the new policy."""
    record = rig.service.create(request())
    reached, release = threading.Event(), threading.Event()
    put = rig.proxy.put_sandbox

    def held_put(entry: SandboxEntry) -> None:
        if threading.current_thread().name == "repush":
            reached.set()
            release.wait(30)
        put(entry)

    rig.proxy.put_sandbox = held_put  # type: ignore[method-assign]
    repush = threading.Thread(target=rig.egress.repush, name="repush")
    change = threading.Thread(target=rig.egress.change_policy, args=(record.id, deny_all, "test", "replace"))
    repush.start()
    assert reached.wait(30)
    change.start()
    change.join(1.0)  # without the sandbox's lock the change is done here, the repush still held
    release.set()
    for thread in (repush, change):
        thread.join(30)
    stored = rig.egress.policy(record.id)
    assert stored.revision == 2
    assert rig.proxy.entries[record.address or ""].policy == stored.document


def one_credential(sandbox_id: str) -> VaultBuild:
    """A vault change that writes one credential value (no binding)."""

    def build(old: VaultState | None, revision: int) -> tuple[VaultState, dict[str, str]]:
        entry = f"{sandbox_id}/r{revision}/token"
        credential = CredentialEntry(name="token", sourceType="inline", revision=revision, entry=entry)
        return VaultState(credentials=[credential]), {entry: "s3cr3t"}

    return build


@pytest.mark.parametrize("failure", ["proxy push", "store"])
def test_a_vault_change_that_fails_removes_the_new_values(rig: Rig, failure: str) -> None:
    record = rig.service.create(request())
    if failure == "proxy push":
        rig.proxy.fail = True
    else:
        break_inserts(rig.store, "vaults")
    with pytest.raises((Broken, sqlite3.IntegrityError)):
        rig.egress.change_vault(
            record.id, one_credential(record.id), "test", "credential-vault create", None, must_exist=False
        )
    assert rig.vault.values == {}
    assert rig.store.get_vault(record.id) is None
    assert rig.proxy.entries[record.address or ""].credentials == {}


def test_a_warm_pool_claim_configures_pushes_and_starts_the_entrypoint(pooled: Rig) -> None:
    assert pooled.service.pool is not None
    (member,) = pooled.service.pool.members()
    record = pooled.service.create(request(memory="64Mi"))
    assert record.id == member and record.state == "Running"
    assert pooled.runtime.configured[member] == ({"GREETING": "hi"}, Limits(memory_bytes=64 << 20))
    assert pooled.proxy.entries[record.address or ""].sandbox_id == member
    assert pooled.store.get_sandbox(member).execd_token
    assert pooled.audit == [(member, "create")]


CLAIM_FAILURES: dict[str, tuple[Callable[[Rig], None], tuple[str, ...], bool]] = {
    # what breaks, the entrypoint, whether the cold create after it succeeds
    "configure": (lambda rig: setattr(rig.runtime, "fail_configure", True), ("sleep", "9"), True),
    "entrypoint refused by execd": (lambda rig: None, ("",), True),
    "proxy push": (lambda rig: setattr(rig.proxy, "fail", True), ("sleep", "9"), False),
    "store": (lambda rig: break_inserts(rig.store, "sandboxes"), ("sleep", "9"), False),
}


@pytest.mark.parametrize("failure", CLAIM_FAILURES)
def test_a_failed_claim_removes_the_member_and_starts_cold(pooled: Rig, failure: str) -> None:
    """A claim that fails at any step discards the member whole (its execd, network and proxy
    entry) and falls back to a cold create, which succeeds or fails on its own."""
    assert pooled.service.pool is not None
    (member,) = pooled.service.pool.members()
    breaks, entrypoint, cold_works = CLAIM_FAILURES[failure]
    breaks(pooled)
    if cold_works:
        record = pooled.service.create(request(entrypoint=entrypoint))
        assert record.id != member and pooled.store.get_sandbox(record.id).state == "Running"
        assert set(pooled.proxy.entries) == {record.address}
    else:
        with pytest.raises(LifecycleError):
            pooled.service.create(request(entrypoint=entrypoint))
        assert pooled.proxy.entries == {} and pooled.store.list_sandboxes() == []
    assert member not in pooled.runtime.processes and member not in pooled.networks.live
