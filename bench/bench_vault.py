"""Vault benchmark: redactor throughput, render and reveal latency.

Redactor: MB/s of `redact()` and of the streaming form (64 KiB chunks) over 8 MiB of JSON-like
text, over 8 MiB of base64 (the worst case for the automaton: every byte could start a
pattern) and over 1 MiB of escape-dense HTML with JSON in it (the worst case for the escape
decoder: an escape every 20 bytes), with 10 and 1,000 secrets (each expanded into its encoded
forms), and the time to build the automaton.
`SANDGATE_BENCH_REDACTOR=FILE` also runs the `Redactor` of another version's `vault/redact.py`
(a standalone module before escapes were decoded: `git show 9b2125b:vault/redact.py > FILE`),
row by row after the current one, for before/after figures from one run.
Render: microseconds per `render(binding, store.reveal)` against a LocalStore (one stat per
reveal; decryption only when the file changed) and per passthrough target substitution.
"""

from __future__ import annotations

import base64
import importlib.util
import os
import secrets
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench import sized
from sandgate.policy import Binding
from sandgate.vault import LocalStore, Redactor, render

DATA_BYTES = sized(8 * 1024 * 1024, 256 * 1024)
# an escape every 20 bytes: decoding them is what this row measures
ESCAPED_BYTES = sized(1024 * 1024, 64 * 1024)
CHUNK = 64 * 1024
BEST_OF = sized(5, 1)
BUILDS = sized(3, 1)  # automaton builds timed, best of
SECRETS = sized((10, 1000), (10, 100))
CALLS = sized(20_000, 500)


def json_text(size: int, values: list[str]) -> bytes:
    record = b'{"id": 12345, "name": "example item", "tags": ["alpha", "beta"], "ok": true},\n'
    body = bytearray(record * (size // len(record)))
    for index, value in enumerate(values[:50]):  # a few real hits to replace
        at = (index + 1) * (len(body) // 52)
        body[at : at + len(value)] = value.encode()
    return bytes(body)


def escaped_text(size: int, values: list[str]) -> bytes:
    record = b'<p title="a &amp; b">it&#39;s {\\"q\\": \\"x\\u0026y\\"} at 50%25 &lt;ok&gt;</p>\n'
    body = bytearray(record * (size // len(record)))
    for index, value in enumerate(values[:50]):  # a few escaped echoes to replace
        escaped = "".join(f"&#x{ord(c):x};" if not c.isalnum() else c for c in value).encode()
        at = (index + 1) * (len(body) // 52)
        body[at : at + len(escaped)] = escaped
    return bytes(body)


def base64_text(size: int) -> bytes:
    return base64.b64encode(os.urandom(size * 3 // 4))[:size]


def best_of(runs: int, action: Callable[[], object]) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return min(times)


def stream_all(redactor: Redactor, data: bytes) -> None:
    stream = redactor.stream()
    for at in range(0, len(data), CHUNK):
        stream.feed(data[at : at + CHUNK])
    stream.flush()


def redactor_classes() -> list[tuple[str, type[Redactor]]]:
    classes: list[tuple[str, type[Redactor]]] = [("current", Redactor)]
    baseline = os.environ.get("SANDGATE_BENCH_REDACTOR")
    if baseline:
        spec = importlib.util.spec_from_file_location("baseline_redact", baseline)
        assert spec is not None and spec.loader is not None, baseline
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        classes.append(("baseline", module.Redactor))
    return classes


def redactor_rows() -> None:
    print(
        f"{'secrets':>8} {'version':>9} {'patterns':>9} {'build ms':>9} {'data':>8} "
        f"{'redact MB/s':>12} {'stream MB/s':>12}"
    )
    for count in SECRETS:
        values = [secrets.token_urlsafe(30) for _ in range(count)]
        datas = {
            "json": json_text(DATA_BYTES, values),
            "base64": base64_text(DATA_BYTES),
            "escaped": escaped_text(ESCAPED_BYTES, values),
        }
        for label, data in datas.items():
            for version, redactor_class in redactor_classes():
                build = best_of(BUILDS, lambda v=values, c=redactor_class: c(v))  # type: ignore[misc]
                redactor = redactor_class(values)
                whole = best_of(BEST_OF, lambda d=data, r=redactor: r.redact(d))  # type: ignore[misc]
                streamed = best_of(BEST_OF, lambda d=data, r=redactor: stream_all(r, d))  # type: ignore[misc]
                mb = len(data) / 1e6
                print(
                    f"{count:>8} {version:>9} {redactor.pattern_count:>9} {build * 1e3:>9.1f} {label:>8} "
                    f"{mb / whole:>12.0f} {mb / streamed:>12.0f}",
                    flush=True,
                )


def per_call_us(action: Callable[[], object], calls: int = CALLS) -> float:
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls // 5):
            action()
        samples.append((time.perf_counter() - start) / (calls // 5))
    return statistics.median(samples) * 1e6


def render_rows() -> None:
    with tempfile.TemporaryDirectory(prefix="sandgate-bench-vault-") as tmp:
        store = LocalStore(Path(tmp) / "vault.enc")
        for n in range(100):
            store.put(f"cred{n}", secrets.token_urlsafe(30))
        bearer = Binding.model_validate(
            {
                "name": "b",
                "match": {"hosts": ["api.example.com"]},
                "auth": {"type": "bearer", "credential": "cred7"},
            }
        )
        passthrough = Binding.model_validate(
            {
                "name": "p",
                "match": {"hosts": ["api.example.com"]},
                "auth": {
                    "type": "passthrough",
                    "substitutions": [
                        {"credential": "cred8", "placeholder": "PH_KEY", "in": ["query", "path"]}
                    ],
                },
            }
        )
        placeholders = render(passthrough, store.reveal).placeholders
        put_ms = best_of(BEST_OF, lambda: store.put("cred1", secrets.token_urlsafe(30))) * 1e3
        rows = [
            ("LocalStore.reveal (100 secrets, unchanged file)", per_call_us(lambda: store.reveal("cred3"))),
            ("render bearer (reveal included)", per_call_us(lambda: render(bearer, store.reveal))),
            ("render passthrough (reveal included)", per_call_us(lambda: render(passthrough, store.reveal))),
            (
                "Placeholders.target (path + query)",
                per_call_us(lambda: placeholders.target("/v1/PH_KEY?k=PH_KEY")),
            ),
        ]
        for label, micros in rows:
            print(f"{label:<50} {micros:>8.1f} us")
        print(f"{'LocalStore.put (100 secrets, fsync)':<50} {put_ms:>8.2f} ms")


def main() -> None:
    redactor_rows()
    render_rows()


if __name__ == "__main__":
    main()
