"""`sandgate down`: remove what a server of this state dir left in the kernel, and say what.

Rules:
1. Never beside a running server: down holds the state dir's lock (`statelock`) for its whole
   run, so it refuses while a server runs and no server starts meanwhile.
2. Only what this state dir's instance owns, found by its names: the nft table `nft_table`,
   netns `sg-<instance>-*`, host veths `<iface_prefix><n>`, mounts under the state dir and the
   netns pins, cgroups `sandgate-<instance>-*`, the sandboxes' filesystems and their loop devices
   (`<disk_dir>/sandgate-<instance>-*`), a proxy child a killed server left behind (its argv
   names this state dir's proxy.json), and gvisor sandboxes' runsc processes (runsc, its sandbox
   and gofer: their `--root` lies in this state dir; they die with their cgroup).
3. Fail closed: a sandbox that still runs keeps its network and the nft table (without the
   table its veth would be an open route). Running sandboxes are stopped only with
   `stop_sandboxes`; their records and vault entries then go too. Unclaimed warm-pool sandboxes
   (never persisted) are always removed.
4. The report is what the kernel shows before and after (`Footprint`), not what was attempted.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from sandgate.lifecycle import statelock
from sandgate.lifecycle.cgroups import SandboxCgroup
from sandgate.lifecycle.confinement import RUN_NETNS
from sandgate.lifecycle.credential_state import VaultState
from sandgate.lifecycle.kernel import instance_tag, mount_points
from sandgate.lifecycle.proxy_supervisor import proxy_processes, stop_proxies
from sandgate.lifecycle.runtime.gvisor import processes as runsc_processes
from sandgate.lifecycle.runtime.sandbox_disk import image_prefix, loop_devices
from sandgate.lifecycle.sandbox_store import SandboxStore
from sandgate.lifecycle.settings import Settings
from sandgate.proxy import control_socket
from sandgate.vault import SecretStore

log = logging.getLogger(__name__)
VERBS = {  # the rest: "removed"
    "proxy process": "stopped",
    "runsc process": "stopped",
    "mount": "unmounted",
    "loop device": "detached",
}


@dataclass(frozen=True)
class Footprint:
    """This instance's kernel objects, by kind ("nft table", "netns", ...) -> names."""

    items: dict[str, frozenset[str]] = field(default_factory=dict)

    def minus(self, other: Footprint) -> dict[str, list[str]]:
        return {
            kind: sorted(names - other.items.get(kind, frozenset())) for kind, names in self.items.items()
        }


@dataclass
class Report:
    removed: dict[str, list[str]]
    kept: dict[str, list[str]]
    stopped_sandboxes: list[str]
    forgotten_records: list[str]
    running: list[str]

    def lines(self, state_dir: Path) -> list[str]:
        out = [f"stopped sandbox {s}" for s in self.stopped_sandboxes]
        out += [
            f"{VERBS.get(kind, 'removed')} {kind} {name}"
            for kind, names in self.removed.items()
            for name in names
        ]
        out += [f"removed the record of sandbox {s} (and its vault entries)" for s in self.forgotten_records]
        if self.running:
            out.append(
                f"kept {len(self.running)} running sandbox(es) ({', '.join(self.running)}) with their "
                "networks and the nft table (their egress fails closed until `sandgate serve` re-adopts "
                "them); `sandgate down --sandboxes` stops them"
            )
        return out or [f"nothing to remove: no trace of a server of {state_dir} in the kernel"]


def footprint(settings: Settings, instance: str) -> Footprint:
    netns_prefix = f"sg-{instance}-"
    state_dir = str(settings.state_dir.resolve())
    pins = str(RUN_NETNS / netns_prefix)
    disks = str(settings.disk_dir.resolve() / image_prefix(instance))  # Docker's mount there
    mounts = {m for m in mount_points() if m.startswith((pins, state_dir + "/", disks))}
    return Footprint(
        {
            "nft table": frozenset(
                [f"inet {settings.nft_table}"] if _nft_table_exists(settings.nft_table) else []
            ),
            "proxy process": frozenset(str(pid) for pid in proxy_processes(settings.state_dir)),
            "netns": frozenset(n for n in _listdir(RUN_NETNS) if n.startswith(netns_prefix)),
            "veth": frozenset(_host_links(settings.iface_prefix)),
            "mount": frozenset(mounts),
            "cgroup": frozenset(SandboxCgroup.names(f"sandgate-{instance}-")),
            "loop device": frozenset(loop_devices(disks)),
            "runsc process": frozenset(
                map(str, runsc_processes([settings.state_dir.resolve() / "sandboxes"]))
            ),
        }
    )


def tear_down(settings: Settings, *, stop_sandboxes: bool) -> Report:
    """Everything in rule 2 that rule 3 lets go; raises statelock.AlreadyRunning beside a server."""
    from sandgate.lifecycle.wiring import make_networks, make_runtime, open_vault

    lock = statelock.acquire(settings.state_dir)
    try:
        instance = instance_tag(settings.state_dir)
        before = footprint(settings, instance)
        stop_proxies(settings.state_dir)
        control_socket(settings.state_dir).unlink(missing_ok=True)
        runtime = make_runtime(settings, instance)
        alive = set(runtime.adopt())  # removes what is left of dead sandboxes (dirs, mounts, cgroups)
        store = SandboxStore(settings.state_database)
        try:
            records = {record.id for record in store.list_sandboxes()}
            stopped = sorted(alive if stop_sandboxes else alive - records)  # strays: unclaimed pool members
            for sandbox_id in stopped:
                runtime.delete(sandbox_id)
            running = sorted(alive - set(stopped))
            make_networks(settings, instance).cleanup_leftovers(keep=set(running))
            if not running:
                make_networks(settings, instance).remove_table()
            forgotten = sorted(records - set(running))
            vault = open_vault(settings)
            for sandbox_id in forgotten:
                forget(store, vault, sandbox_id)
        finally:
            store.close()
        after = footprint(settings, instance)
        return Report(before.minus(after), after.minus(Footprint()), stopped, forgotten, running)
    finally:
        lock.release()


def forget(store: SandboxStore, vault: SecretStore, sandbox_id: str) -> None:
    """Delete a sandbox's record and the vault entries its credential vault wrote."""
    stored = store.get_vault(sandbox_id)
    state = stored.document if stored else VaultState()
    for entry in state.entries().values():
        try:
            vault.delete(entry)
        except Exception:
            log.exception("could not delete vault entry %s of sandbox %s", entry, sandbox_id)
    store.delete_sandbox(sandbox_id)


def _nft_table_exists(table: str) -> bool:
    done = subprocess.run(["nft", "list", "table", "inet", table], capture_output=True)
    return done.returncode == 0


def _host_links(prefix: str) -> list[str]:
    """This network namespace's links named <prefix><n> (sysfs may show another namespace's)."""
    from pyroute2 import IPRoute

    pattern = re.compile(re.escape(prefix) + r"\d+")
    with IPRoute() as host:
        names = [link.get("ifname") or "" for link in host.get_links()]
    return [name for name in names if pattern.fullmatch(name)]


def _listdir(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []
