"""A create request's `resourceLimits` as the runtime's limits.

Rules: Kubernetes-style quantities only ('500m' CPUs, '512Mi'/'2Gi'/'1G' bytes, plain numbers);
a value that is not one is a `LifecycleError("invalid")` naming the field, before anything is
built. Unknown keys are ignored, as OpenSandbox's runtimes do. The disk a sandbox may write is
`disk` (OpenSandbox's name for a guest's disk size) or Kubernetes' `ephemeral-storage`.
"""

from __future__ import annotations

from sandgate.lifecycle.cgroups import Limits
from sandgate.lifecycle.errors import LifecycleError
from sandgate.lifecycle.runtime.sandbox_disk import MIN_DISK_BYTES

UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
         "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "m": 1e-3}  # fmt: skip


def parse_quantity(value: str, what: str) -> float:
    """'500m' -> 0.5, '512Mi' -> 536870912.0; `what` names the field in the error."""
    for suffix in sorted(UNITS, key=len, reverse=True):
        if value.endswith(suffix):
            number, scale = value[: -len(suffix)], UNITS[suffix]
            break
    else:
        number, scale = value, 1
    try:
        return float(number) * scale
    except ValueError:
        raise LifecycleError(
            "invalid", f"resourceLimits.{what}={value!r} is not a quantity (use e.g. '500m', '1', '512Mi')"
        ) from None


DISK_KEYS = ("disk", "ephemeral-storage")


def runtime_limits(resource_limits: dict[str, str]) -> Limits:
    """cpu -> CPUs, memory -> bytes, pids -> a count, disk -> bytes; absent keys get the
    runtime's defaults (pids and disk) or stay unlimited."""
    cpu, memory, pids = (resource_limits.get(key) for key in ("cpu", "memory", "pids"))
    disk = next(((key, resource_limits[key]) for key in DISK_KEYS if key in resource_limits), None)
    disk_bytes = int(parse_quantity(disk[1], disk[0])) if disk else None
    if disk and disk_bytes is not None and disk_bytes < MIN_DISK_BYTES:
        raise LifecycleError("invalid", f"resourceLimits.{disk[0]}={disk[1]!r} is below 16Mi")
    return Limits(
        memory_bytes=int(parse_quantity(memory, "memory")) if memory is not None else None,
        pids_max=int(parse_quantity(pids, "pids")) if pids is not None else None,
        cpu_quota=parse_quantity(cpu, "cpu") if cpu is not None else None,
        disk_bytes=disk_bytes,
    )
