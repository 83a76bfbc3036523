"""Which isolation a sandbox runs under, chosen once at create time.

Rules:
1. A create names it in its OpenSandbox `extensions` as `sandgate.isolation` (`standard` or
   `gvisor`); without it the server's `isolation` setting holds. The choice is written back into
   the record's extensions, so GET /sandboxes/{id} and the create's audit record show it.
2. Never a silent downgrade: an isolation this host's runtime cannot give (gvisor without runsc)
   is refused with a 4xx that says what to install, before anything is built.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sandgate.lifecycle.errors import LifecycleError

ISOLATION_KEY = "sandgate.isolation"
ISOLATIONS = ("standard", "gvisor")


def choose(extensions: Mapping[str, str], default: str, available: Sequence[str]) -> str:
    """The isolation a create asks for (rule 1), or LifecycleError (rule 2)."""
    isolation = extensions.get(ISOLATION_KEY, default)
    if isolation not in ISOLATIONS:
        raise LifecycleError(
            "invalid", f"extensions[{ISOLATION_KEY!r}] = {isolation!r}: choose one of {', '.join(ISOLATIONS)}"
        )
    if isolation not in available:
        raise LifecycleError(
            "unsupported",
            f"isolation {isolation!r} is not available on this host (it offers {', '.join(available)}): "
            "gvisor needs runsc (`apt-get install runsc`, then restart the server); or ask for "
            f"extensions[{ISOLATION_KEY!r}] = 'standard'",
        )
    return isolation
