"""Prometheus counters and a latency histogram, rendered as the text exposition format.

Rules: the proxy is one single-threaded event loop, so plain dicts are enough; label values
come from the proxy's own vocabulary (actions, reasons, binding names), never from request data
a sandbox controls, so the series count stays bounded.
"""

from __future__ import annotations

from collections import Counter

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    def __init__(self) -> None:
        self.decisions: Counter[tuple[str, str, str]] = Counter()  # (kind, action, reason)
        self.injections: Counter[str] = Counter()  # binding name
        self.upstream_errors: Counter[str] = Counter()  # error class
        self.security_events: Counter[str] = Counter()
        self.revoked: Counter[str] = Counter()  # connections closed by a policy change, by reason
        self.budgeted: Counter[tuple[str, str]] = Counter()  # (sandbox id, outcome): requests under a budget
        self.budget_bytes: Counter[tuple[str, str]] = (
            Counter()
        )  # (sandbox id, "in"|"out"): bytes under a budget
        self.spliced_total = 0  # pass-through connections relayed in the kernel (front door)
        self.spliced_open = 0
        self._latency_counts = [0] * len(LATENCY_BUCKETS)
        self._latency_sum = 0.0
        self._latency_total = 0

    def decision(self, kind: str, action: str, reason: str) -> None:
        self.decisions[(kind, action, reason)] += 1

    def latency(self, seconds: float) -> None:
        self._latency_sum += seconds
        self._latency_total += 1
        for i, bound in enumerate(LATENCY_BUCKETS):
            if seconds <= bound:
                self._latency_counts[i] += 1
                break

    def render(self) -> str:
        lines = [
            "# HELP sandgate_proxy_decisions_total Egress decisions by record kind, action and reason.",
            "# TYPE sandgate_proxy_decisions_total counter",
        ]
        for (kind, action, reason), n in sorted(self.decisions.items()):
            lines.append(
                f'sandgate_proxy_decisions_total{{kind="{_esc(kind)}",action="{_esc(action)}",'
                f'reason="{_esc(reason)}"}} {n}'
            )
        lines += _counter(
            "sandgate_proxy_injections_total", "Credentials injected, by binding.", "binding", self.injections
        )
        lines += _counter(
            "sandgate_proxy_upstream_errors_total",
            "Failed upstream connections or exchanges.",
            "error",
            self.upstream_errors,
        )
        lines += _counter(
            "sandgate_proxy_security_events_total",
            "Security events, by event.",
            "event",
            self.security_events,
        )
        lines += _counter(
            "sandgate_proxy_revoked_connections_total",
            "Open connections closed because a policy change no longer allowed them, by reason.",
            "reason",
            self.revoked,
        )
        lines += _per_sandbox(
            "sandgate_proxy_budget_requests_total",
            "Requests under a budget, by sandbox and outcome.",
            "outcome",
            self.budgeted,
        )
        lines += _per_sandbox(
            "sandgate_proxy_budget_bytes_total",
            "Bytes under a budget, by sandbox and direction.",
            "direction",
            self.budget_bytes,
        )
        lines += [
            "# HELP sandgate_proxy_spliced_connections_total Pass-through connections relayed by splice.",
            "# TYPE sandgate_proxy_spliced_connections_total counter",
            f"sandgate_proxy_spliced_connections_total {self.spliced_total}",
            "# HELP sandgate_proxy_spliced_connections_open Pass-through connections being spliced now.",
            "# TYPE sandgate_proxy_spliced_connections_open gauge",
            f"sandgate_proxy_spliced_connections_open {self.spliced_open}",
        ]
        lines += [
            "# HELP sandgate_proxy_request_duration_seconds Time from request headers to response end.",
            "# TYPE sandgate_proxy_request_duration_seconds histogram",
        ]
        cumulative = 0
        for bound, n in zip(LATENCY_BUCKETS, self._latency_counts, strict=True):
            cumulative += n
            lines.append(f'sandgate_proxy_request_duration_seconds_bucket{{le="{bound}"}} {cumulative}')
        lines.append(f'sandgate_proxy_request_duration_seconds_bucket{{le="+Inf"}} {self._latency_total}')
        lines.append(f"sandgate_proxy_request_duration_seconds_sum {self._latency_sum:.6f}")
        lines.append(f"sandgate_proxy_request_duration_seconds_count {self._latency_total}")
        return "\n".join(lines) + "\n"


def _counter(name: str, help_text: str, label: str, values: Counter[str]) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
    lines += [f'{name}{{{label}="{_esc(key)}"}} {n}' for key, n in sorted(values.items())]
    return lines


def _per_sandbox(name: str, help_text: str, label: str, values: Counter[tuple[str, str]]) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
    for (sandbox, other), n in sorted(values.items()):
        lines.append(f'{name}{{sandbox="{_esc(sandbox)}",{label}="{_esc(other)}"}} {n}')
    return lines


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def summed(expositions: list[str]) -> str:
    """Several processes' `render()` output as one (the worker pool's `GET /metrics`): every
    sample (counters, gauges, histogram buckets) added up by series, each family's samples kept
    together under its HELP/TYPE lines, in the order they first appear."""
    families: dict[str, tuple[list[str], dict[str, float]]] = {}
    for text in expositions:
        family = ""
        for line in text.splitlines():
            if line.startswith(("# HELP ", "# TYPE ")):
                family = line.split()[2]
                comments = families.setdefault(family, ([], {}))[0]
                if line not in comments:
                    comments.append(line)
            elif line:
                series, _, value = line.rpartition(" ")
                samples = families.setdefault(family, ([], {}))[1]
                samples[series] = samples.get(series, 0.0) + float(value)
    lines: list[str] = []
    for comments, samples in families.values():
        lines += comments
        lines += [f"{series} {_number(value)}" for series, value in samples.items()]
    return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    return str(int(value)) if value.is_integer() else f"{value:.6f}"
