"""resourceLimits quantities as the runtime's limits (fast tier: pure)."""

from __future__ import annotations

import pytest

from sandgate.lifecycle.cgroups import Limits
from sandgate.lifecycle.errors import LifecycleError
from sandgate.lifecycle.quantities import parse_quantity, runtime_limits


@pytest.mark.parametrize(
    ("text", "value"),
    [("500m", 0.5), ("2", 2.0), ("512Mi", 512 * 2**20), ("2Gi", 2 * 2**30), ("1G", 1e9), ("3k", 3000.0)],
)
def test_quantities_in_kubernetes_units(text: str, value: float) -> None:
    assert parse_quantity(text, "cpu") == value


def test_limits_from_a_request_and_unknown_keys_ignored() -> None:
    limits = runtime_limits({"cpu": "250m", "memory": "300Mi", "pids": "77", "gpu": "1"})
    assert limits == Limits(memory_bytes=300 * 2**20, pids_max=77, cpu_quota=0.25)
    assert runtime_limits({}) == Limits()


def test_a_value_that_is_no_quantity_names_the_field() -> None:
    with pytest.raises(LifecycleError, match=r"resourceLimits\.memory='lots'") as raised:
        runtime_limits({"memory": "lots"})
    assert raised.value.kind == "invalid"


def test_disk_from_opensandbox_s_or_kubernetes_name_and_a_floor() -> None:
    assert runtime_limits({"disk": "2Gi"}).disk_bytes == 2 * 2**30
    assert runtime_limits({"ephemeral-storage": "512Mi"}).disk_bytes == 512 * 2**20
    with pytest.raises(LifecycleError, match=r"resourceLimits\.disk='1Mi' is below 16Mi"):
        runtime_limits({"disk": "1Mi"})
