"""Presets: named, versioned policy fragments a policy includes by name (`include: [preset:NAME]`).

Rules:
1. A preset is a YAML file `NAME.yaml` in one of the preset directories (`Presets.dirs`, searched
   in order; the operator's `preset_dirs` setting), holding a `preset:` block (`version`, what it
   opens: `description`, and the exfiltration risk it carries: `risk`) and `egress:` rules. A
   preset holds no bindings, no default and no includes of its own.
2. `preset:NAME` takes the preset's current version, `preset:NAME@V` insists on version V.
   Each of its rules keeps its file:line in the preset file as its id, so `policy explain` and
   the audit record name the line in the preset that decided.
3. Included rules follow the policy's own rules: a policy's `deny` comes first. The document a
   sandbox keeps and the proxy compiles is the expansion (`to_document`); the file's own form,
   with its `include`, is `to_source_document` (what `policy fmt` writes).
4. A reference the directories cannot satisfy is an error at the include's own file:line that
   lists the presets there are (or says that no preset directory is configured).
The files are read by the loader (the one module of sandgate.policy that touches files).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from sandgate.policy.models import EgressRule

REFERENCE = re.compile(r"^preset:(?P<name>[a-z0-9][a-z0-9._-]{0,62})(?:@(?P<version>[1-9][0-9]{0,5}))?$")
PRESET_KEYS = frozenset({"preset", "egress"})


@dataclass(frozen=True)
class Preset:
    name: str
    version: int
    description: str
    risk: str
    path: Path
    rules: tuple[EgressRule, ...]


@dataclass(frozen=True)
class Presets:
    """Where presets are found (rule 1); `Presets()` has none."""

    dirs: tuple[Path, ...] = ()

    def listing(self, names: list[str]) -> str:
        """What a reader needs when a reference fails: which presets there are, and where."""
        if not self.dirs:
            return (
                "no preset directory is configured (the server's preset_dirs, policy commands' --preset-dir)"
            )
        return f"presets in {', '.join(map(str, self.dirs))}: {', '.join(names) or 'none'}"
