"""Every benchmark still runs to its end: `python -m bench --smoke NAME` for each bench/bench_*.py.

Rules:
1. Each module runs in its smallest bounded mode (bench/__init__.py, `sized`), as its own process,
   the way `make bench` runs it; the test fails if it exits non-zero or is skipped. The one
   module pytest may skip is kubernetes, on a machine whose cluster is not built and that does
   not ask for it (SANDGATE_TEST_KUBERNETES=1, which CI sets: it is then built first).
2. PROMISES says, in print order, every line a module promises: each row with its numbers, each
   ratio computed (a ratio printed as invalid, a row with "-" where a number belongs, or a table
   left out does not match). Lines are matched in order, so a label printed twice (one per
   runtime, per concurrency) must be there twice.
3. This asserts that the benchmarks work, never how fast anything is: no figure is compared with
   a goal. Every bench module must have its promises here (a new one fails until it does).
`make bench-smoke` runs this module alone; `make test` runs it with everything else (CI), and
`make test-fast` leaves it out (docs/benchmarks.md).
"""

from __future__ import annotations

import os
import pkgutil
import re
import resource
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

import bench
from bench import bench_audit, bench_cli, bench_proxy, bench_upstream_proxy
from tests.kubernetes.cluster import BUILD_TIMEOUT, SCRIPTS, cached_build, up_to_a_build

REPO = Path(__file__).resolve().parents[2]
N = r"-?[\d,]+(?:\.\d+)?"  # a number as the benchmarks print it (never nan, inf or "-")
ROOT = {
    "audit",
    "code",
    "docker",
    "exec_audit",
    "gateway",
    "gvisor",
    "images",
    "kubernetes",
    "process_lookup",
    "proxy",
    "sandbox_disk",
    "sandboxes",
    "upstream_proxy",
}
# the smoke sizes, whatever a developer's shell sets for full runs (SANDGATE_BENCH_SANDBOXES, ...)
SMALLEST = {key: value for key, value in os.environ.items() if not key.startswith("SANDGATE_BENCH_")}
TIMEOUT = 900  # seconds per module; the proxy's smoke run is the longest (about 3 minutes loaded)


def timing(label: str) -> str:
    """A `bench.sandbox_rig.row` line."""
    return rf"^\s+{re.escape(label)}\s+p50\s+{N} ms\s+p95\s+{N} ms$"


def compared(label: str) -> str:
    """A line of bench_gateway: direct and host figures, and their ratio."""
    figures = rf"p50\s+{N} ms p95\s+{N}"
    return rf"^\s+{re.escape(label)}\s+direct {figures} \| host {figures} \| host/direct p50 {N}x$"


def exact(text: str) -> str:
    return rf"^{re.escape(text)}$"


def load_row(name: str, concurrency: int) -> str:
    """A line of bench_proxy's load tables: the scenario, its concurrency, then numbers (or "-"
    where a tool reports no such figure, e.g. h2load's percentiles)."""
    return rf"^{re.escape(name)}\s+{concurrency}\s+{N}\s+[\d.\s-]+$"


def _proxy() -> list[str]:
    """The load tables (every scenario at each of its concurrencies, section by section), the
    downloads, the noisy-neighbour table and its goals, every ratio, idle sandboxes, the audit."""
    plan = [(s.section, s.name, c) for s in bench_proxy.SCENARIOS for c in s.concurrency]
    promised = []
    for section in dict.fromkeys(section for section, _, _ in plan):
        promised.append(exact(section))
        promised += [load_row(name, c) for s, name, c in plan if s == section]
    promised += [exact(bench_proxy.DOWNLOAD), load_row("direct", 1)]
    for name in ("sandgate intercepted", "sandgate TLS pass-through"):
        promised += [load_row(name, 1), rf"proxy RSS before {N} MiB, peak during \(VmHWM\) {N} MiB$"]
    promised.append(rf"^{re.escape(bench_proxy.NOISY_SECTION)} \(")
    variants = ("limits (defaults)", "no limits, backlog 100")
    for variant in variants:
        for who in (r"B alone", r"B while A opens \d+"):
            promised.append(rf"^{re.escape(variant)}: {who}\s+{N}\s+{N}\s+{N}\s+\d+\s+\d+\s")
    for variant in variants:
        promised.append(rf"^\s+{re.escape(variant)}: B's p95 crowded / alone {N}x, \d+ failed \[goal")
    for ratio in bench_proxy.RATIOS:
        promised.append(rf"^\s+{re.escape(ratio.what)}\s+c={ratio.concurrency}\s+throughput\s+{N}x")
    promised.append(rf"idle sandboxes: RSS {N} MiB with 0, {N} MiB with \d+ -> {N} KiB per sandbox")
    promised.append(r"sandgate wrote \d+ audit records during the load rows")
    return promised


PROMISES: dict[str, list[str]] = {
    "audit": [
        rf"^generated {N} records in {N} s",
        rf"^index build \(sandgate logs\): {N} s",
        *(rf"^{re.escape(name)}\s+{N}ms\s+{N}ms\s+\d+$" for name in bench_audit.CASES),
        *(rf"^{re.escape(name)}\s+{N}ms$" for name in bench_audit.SUMMARIES),
        rf"^worst filtered page: {N} ms",
    ],
    "cli": [rf"^{re.escape(name)}\s+{N}\s+{N}\s+<\d+ (ok|over)$" for name in bench_cli.COMMANDS],
    "code": [
        *(
            timing(f"create {language}, {spare}")
            for language in ("python", "bash")
            for spare in ("no spare", "spare")
        ),
        timing("cell `1 + 1` round trip"),
    ],
    "docker": [
        r"^local runtime \(sandgate/host\), \d+ sandboxes",
        timing("create-to-ready"),
        timing("teardown"),
        rf"^\(images ready in the private dockerd after {N} s",
        r"^docker runtime \(sandgate/base\), \d+ sandboxes",
        timing("create-to-ready"),
        timing("teardown"),
    ],
    "kubernetes": [
        rf"^\(cluster up and the execd image imported after {N} s",
        r"^kubernetes runtime \(sandgate.example.test/busybox:1\), \d+ sandboxes",
        timing("create-to-ready"),
        timing("teardown"),
        r"^one node with its agent held \d+ sandboxes \(sandgate.example.test/busybox:1\), stopped by ",
        timing("create-to-ready (agent)"),
        rf"^  node agent RSS {N} MiB at 0, {N} MiB at \d+: {N} MiB per sandbox$",
        rf"^  Pods' memory {N} MiB per sandbox \(cgroup usage\)$",
    ],
    "execd": [
        rf"^start-up to first /ping 200 .*: wall p50 {N} ms, max {N} ms; CPU used p50 {N} ms$",
        rf"^command round trip `true` \(\d+ runs\): p50 {N} ms, p95 {N} ms$",
        rf"^upload \d+ MiB: {N} MiB/s, RSS idle {N} MiB, peak {N} MiB$",
        rf"^download \d+ MiB: {N} MiB/s, peak {N} MiB$",
    ],
    "exec_audit": [
        rf"^exec audit trail: {N} x {N} command round trips per setting, {N} execs per sandbox$",
        *(
            rf"^\s+exec_audit={setting}\s+command round trip p50\s+{N} ms p95\s+{N} ms \({N}x off\) \| "
            rf"serve CPU/command\s+{N} ms \| serve CPU per exec in the sandbox\s+{N} us \| audit lines {N}$"
            for setting in ("off", "execd", "processes")
        ),
    ],
    "gateway": [
        compared("GET /ping (the hop alone)"),
        rf"serve's CPU per proxied /ping: {N} us$",
        compared("command round trip `true`"),
        compared("first SSE event of a running command"),
        rf"^\s+download \d+ MiB\s+direct {N} MiB/s \| host {N} MiB/s, serve RSS growth at most {N} MiB",
    ],
    "gvisor": [
        *(
            line
            for isolation in ("standard", "gvisor")
            for line in (
                rf"^{isolation} \(load average {N} after its figures\):$",
                timing("create-to-ready (1)"),
                timing("command round trip (3)"),
                timing("download 4 MiB (1)"),
                rf"^\s+idle CPU \(one sandbox\)\s+{N} % of a core$",
            )
        ),
        *(
            rf"^\s+gvisor/standard {label}\s+p50\s+{N}x"
            for label in ("create-to-ready", "round trip", "download")
        ),
        rf"^\s+download speed: standard {N} MiB/s, gvisor {N} MiB/s$",
    ],
    "images": [
        timing("pull + verify + unpack + start"),
        rf"^\s+state dir grew by {N} MiB",
        timing("python:3.12"),
        timing("sandgate/host"),
    ],
    "policy": [
        *(rf"^\s+{size}(\s+{N}){{4}}$" for size in (10, 1000)),
        *(
            line
            for table in ("uncached", "cached")
            for line in (rf"^decide, {table} ", *(rf"^\s+{size}(\s+{N}){{5}}$" for size in (10, 1000)))
        ),
        rf"^check_address at 1,000 rules: {N} us uncached, {N} cached$",
        rf"^\s+identity(\s+{N}){{4}}$",
        rf"^\s+identity \+ decision(\s+{N}){{4}}$",
        rf"^decision loops: wall/CPU time {N} ",
    ],
    "proxy": _proxy(),
    "process_lookup": [
        rf"^process lookup: {N} lookups per row, {N} processes on the machine$",
        timing("4 connections open"),
        timing("400 connections open"),
    ],
    "proxy_start": [
        rf"^one proxy process\s+{N}\s+-\s+{N}\s+{N}$",
        rf"^pool of \d+ workers\s+{N}\s+{N}\s+{N}\s+{N}$",
    ],
    "sandbox_disk": [
        *(
            timing(f"{verb}, {disk}")
            for disk in ("own filesystem (2 GiB)", "no filesystem of its own")
            for verb in ("create", "delete")
        ),
        *(
            rf"^\s+{re.escape(where)}\s+{N} MB/s$"
            for where in (
                "own filesystem (2 GiB)",
                "no filesystem of its own",
                "host, straight into the state dir",
            )
        ),
    ],
    "sandboxes": [
        timing("create-to-ready"),
        timing("teardown"),
        rf"^\s+execd CPU to first /ping\s+p50\s+{N} ms\s+max\s+{N} ms$",
        rf"^\d+ alive at once \(64 MiB disks\): all ready after {N} s",
        timing("create-to-ready under load"),
        rf"^\s+memory \(cgroup usage\) {N} MiB per sandbox$",
        rf"^\s+teardown of all \d+: {N} s$",
        timing("create-to-ready, warm pool"),
        timing("teardown"),
        timing("pool refill (background)"),
    ],
    "upstream_proxy": [
        r"^squid served [1-9]\d* CONNECTs",
        *(
            rf"^{re.escape(case.name)}\s+{case.c}\s+\|\s+{N}\s+{N}\s+\|\s+{N}\s+{N}\s+\|\s+\+?{N}\s+{N}/{N}$"
            for case in bench_upstream_proxy.CASES
        ),
    ],
    "vault": [
        *(
            rf"^\s+{count}\s+current\s+\d+\s+{N}\s+{data}\s+{N}\s+{N}$"
            for count in (10, 100)
            for data in ("json", "base64", "escaped")
        ),
        *(
            rf"^{re.escape(label)}\s+{N} us$"
            for label in (
                "LocalStore.reveal (100 secrets, unchanged file)",
                "render bearer (reveal included)",
                "render passthrough (reveal included)",
                "Placeholders.target (path + query)",
            )
        ),
        rf"^LocalStore.put \(100 secrets, fsync\)\s+{N} ms$",
    ],
    "write_ahead": [
        rf"^\s+{re.escape(label + fsync)}\s+{N} us CPU/record\s+p50\s+{N} us$"
        for fsync in ("", " + fsync")
        for label in (
            "one process, write",
            "one process, write_ahead",
            "worker, write (send only)",
            "worker, write_ahead, c=1",
            "worker, write_ahead, c=32",
        )
    ],
}


def unmet(promises: list[str], output: str) -> list[str]:
    """The promises no line fulfils, matching in order (each after the previous one's line)."""
    lines = output.splitlines()
    at, missing = 0, []
    for promise in promises:
        found = next((i for i in range(at, len(lines)) if re.search(promise, lines[i])), None)
        if found is None:
            missing.append(promise)
        else:
            at = found + 1
    return missing


def test_every_benchmark_has_its_promises() -> None:
    modules = pkgutil.iter_modules(bench.__path__)
    names = {m.name.removeprefix("bench_") for m in modules if m.name.startswith("bench_")}
    assert names == set(PROMISES), f"without promises: {names - set(PROMISES)}; gone: {set(PROMISES) - names}"


def test_unmet_finds_a_row_left_out_and_a_ratio_not_computed() -> None:
    """The matcher itself: what the smoke tests rely on to fail."""
    promised = [timing("create-to-ready"), timing("teardown")]
    good = (
        "  create-to-ready              p50   755.8 ms   p95  1099.0 ms\n  teardown   p50 1.0 ms   p95 2.0 ms"
    )
    assert unmet(promised, good) == []
    assert unmet(promised, good.splitlines()[1]) == [promised[0]]
    assert unmet(promised, "\n".join(reversed(good.splitlines()))) == [promised[1]]
    ratio = [rf"^\s+pass-through\s+c=8\s+throughput\s+{N}x"]
    assert unmet(ratio, "  pass-through  c=8   invalid: squid had 3 failed requests per round") == ratio
    assert unmet([timing("x")], "  x   p50     nan ms   p95     nan ms") == [timing("x")]


def _marks(name: str) -> list[pytest.MarkDecorator]:
    """root where the module needs it; the kubernetes module, whose cluster is built once per
    version (a cold build takes longer than TIMEOUT), runs where the build is cached or
    SANDGATE_TEST_KUBERNETES=1 asks for it (CI: the same rule as tests/kubernetes), else skips."""
    marks = [pytest.mark.root] if name in ROOT else []
    if name != "kubernetes":
        return [*marks, pytest.mark.timeout(TIMEOUT + 60)]
    if not (asks_for_the_cluster(os.environ) or cached_build()):
        marks.append(pytest.mark.skip(reason="the cluster's programs are not built: `make cluster-build`"))
    return [*marks, up_to_a_build]


def asks_for_the_cluster(environ: Mapping[str, str]) -> bool:
    return environ.get("SANDGATE_TEST_KUBERNETES") == "1"


def test_ci_never_skips_the_kubernetes_benchmark() -> None:
    """CI sets SANDGATE_TEST_KUBERNETES=1 (.ci/run): the kubernetes module is then built and run,
    never skipped, even on a fresh machine where the cluster is not built yet (here: a build
    check that finds nothing cached)."""
    ci = (REPO / ".ci" / "run").read_text()
    assert "SANDGATE_TEST_KUBERNETES=1 make test" in ci
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys.modules[__name__], "cached_build", lambda: False)
        patch.delenv("SANDGATE_TEST_KUBERNETES", raising=False)
        assert any(mark.name == "skip" for mark in _marks("kubernetes"))
        patch.setenv("SANDGATE_TEST_KUBERNETES", "1")
        assert not any(mark.name == "skip" for mark in _marks("kubernetes"))
    assert up_to_a_build in _marks("kubernetes")  # time for the cold build (tests/kubernetes's)


@pytest.mark.parametrize(
    "name",
    [pytest.param(name, marks=_marks(name)) for name in sorted(PROMISES)],
)
def test_benchmark_runs_to_its_end(name: str) -> None:
    """`python -m bench --smoke NAME` exits 0 and prints every line PROMISES[name] lists."""
    if name == "kubernetes" and not cached_build():  # SANDGATE_TEST_KUBERNETES=1 on a fresh machine
        built = subprocess.run(
            ["bash", str(SCRIPTS / "build.sh")], capture_output=True, text=True, timeout=BUILD_TIMEOUT
        )
        assert built.returncode == 0, f"scripts/cluster/build.sh failed:\n{built.stderr[-6000:]}"
    started, cpu = time.monotonic(), _children_cpu()
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", name],
        cwd=REPO,
        env={**SMALLEST, bench.SMOKE_FLAG: "1"},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    took = f"{time.monotonic() - started:.0f} s wall, {_children_cpu() - cpu:.0f} s CPU"
    output = f"--- stdout ({took}):\n{done.stdout[-6000:]}\n--- stderr:\n{done.stderr[-4000:]}"
    assert done.returncode == 0, output
    assert "skipped" not in done.stdout, output
    missing = unmet(PROMISES[name], done.stdout)
    assert not missing, f"not printed: {missing}\n{output}"
    print(f"bench_{name}: {took}")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
