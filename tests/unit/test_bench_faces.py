"""The benchmarks use sandgate only through its public faces, so they cannot rot when internals move.

A benchmark reaches sandgate through the HTTP API (a real `sandgate serve`), a CLI (`sandgate`,
`python -m sandgate.proxy`, `python -m sandgate.execd`) or a component's `__init__`
(`from sandgate.policy import ...`); it never imports a module below a component. The one
exception left is named here with its reason, so it cannot grow unnoticed.
"""

from __future__ import annotations

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
FACES = {f"sandgate.{c}" for c in ("policy", "vault", "proxy", "lifecycle", "execd")}
# bench_write_ahead times the proxy engine's audit writer and the worker pool's drain one record
# at a time, which no face exposes; the proxy benchmark's load rows measure the same path whole.
# bench_process_lookup times one lookup of a connection's process (proxy/origin.py's `find`),
# which the proxy runs in a thread beside its event loop, where no face can time it alone.
INTERNAL_ALLOWED = {"bench_write_ahead.py", "bench_process_lookup.py"}


def sandgate_imports(source: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
    return [name for name in names if name == "sandgate" or name.startswith("sandgate.")]


def test_benchmarks_import_only_component_faces() -> None:
    internal = {
        source.name: [name for name in sandgate_imports(source) if name not in FACES]
        for source in sorted(BENCH.glob("*.py"))
    }
    offending = {name: found for name, found in internal.items() if found and name not in INTERNAL_ALLOWED}
    assert not offending, f"benchmarks importing sandgate internals: {offending}"
    assert all(internal[name] for name in INTERNAL_ALLOWED), "an allowed exception no longer needs to be"


def test_the_check_sees_an_internal_import(tmp_path: Path) -> None:
    source = tmp_path / "bench_x.py"
    source.write_text("from sandgate.policy import Request\nfrom sandgate.lifecycle.network import X\n")
    assert sandgate_imports(source) == ["sandgate.policy", "sandgate.lifecycle.network"]
