"""sandgate-runsc's spec rewrite (lifecycle/runtime/runsc_wrapper.py), without Docker: which
netns a container joins, what it refuses, and which calls it leaves alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandgate.lifecycle.runtime.runsc_wrapper import Refused, bundle_of, joined


def spec(*env: str) -> dict[str, object]:
    return {
        "process": {"env": ["PATH=/bin", *env]},
        "linux": {"namespaces": [{"type": "pid"}, {"type": "network", "path": "/var/run/docker/netns/x"}]},
    }


def test_the_named_netns_replaces_the_engines_and_the_variable_goes() -> None:
    out = joined(spec("SANDGATE_NETNS=sg-ab12-0-sb1"))
    assert out["process"]["env"] == ["PATH=/bin"]  # type: ignore[index]
    assert out["linux"]["namespaces"] == [  # type: ignore[index]
        {"type": "pid"},
        {"type": "network", "path": "/run/netns/sg-ab12-0-sb1"},
    ]


@pytest.mark.parametrize("name", ["../../proc/1/ns/net", "a/b", "..", ".", "", "-x", "sg\n1"])
def test_a_name_that_is_not_a_plain_netns_name_is_refused(name: str) -> None:
    with pytest.raises(Refused, match="not a netns name"):
        joined(spec(f"SANDGATE_NETNS={name}"))


def test_a_container_without_the_variable_is_left_as_it_is() -> None:
    assert joined(spec()) == spec()


@pytest.mark.parametrize(
    ("argv", "bundle"),
    [
        (["--root", "/r", "--log", "/l.json", "create", "--bundle", "/b", "--pid-file", "/p", "id"], "/b"),
        (["--platform=ptrace", "create", "--bundle=/b2", "id"], "/b2"),
        (["create", "-b", "/b3", "id"], "/b3"),
        (["--root", "/r", "start", "id"], None),
        (["--root", "/r", "delete", "--force", "id"], None),
    ],
)
def test_only_create_calls_are_rewritten(argv: list[str], bundle: str | None) -> None:
    assert bundle_of(argv) == (Path(bundle) if bundle else None)
