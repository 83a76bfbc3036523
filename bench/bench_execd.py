"""execd benchmark: start-up to first /ping 200, command round trip, upload/download MB/s and RSS.

Everything runs on 127.0.0.1 against real `python -m sandgate.execd` processes with `--root` a
temp dir. Start-up is wall time from spawning the process to the first 200 on /ping (polling
every 5 ms). A command round trip is POST /command `true` up to the last event. Transfers move a
100 MiB file up (multipart, streamed) and down (streamed), with the execd's RSS sampled every
10 ms; flat memory means the peak barely moves above the idle RSS.
"""

from __future__ import annotations

import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from bench import sized

STARTS = sized(10, 2)
ROUND_TRIPS = sized(200, 5)
SIZE_MIB = sized(100, 4)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _cpu_ms(pid: int) -> float:
    """User + system CPU the process has used (load-independent, unlike wall time)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def _start(root: Path) -> tuple[subprocess.Popen[bytes], str, float]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    began = time.perf_counter()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sandgate.execd",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--root",
            str(root),
        ]
    )
    deadline = began + 10
    while time.perf_counter() < deadline:
        try:
            if httpx.get(f"{url}/ping", timeout=1).status_code == 200:
                return process, url, time.perf_counter() - began
        except httpx.TransportError:
            time.sleep(0.005)
    _stop(process)
    raise RuntimeError("execd did not answer /ping within 10 s")


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _peak_rss(pid: int, stop: threading.Event, peak: list[int]) -> None:
    while not stop.is_set():
        peak[0] = max(peak[0], _rss_kib(pid))
        time.sleep(0.01)


def _multipart(path: Path, boundary: str) -> Iterator[bytes]:
    yield (
        f'--{boundary}\r\nContent-Disposition: form-data; name="metadata"; filename="metadata"\r\n'
        f'Content-Type: application/json\r\n\r\n{{"path": "/big.bin", "mode": 644}}\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="big.bin"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            yield chunk
    yield f"\r\n--{boundary}--\r\n".encode()


def _measure(label: str, pid: int, action: object) -> tuple[float, int]:
    stop, peak = threading.Event(), [_rss_kib(pid)]
    sampler = threading.Thread(target=_peak_rss, args=(pid, stop, peak), daemon=True)
    sampler.start()
    began = time.perf_counter()
    action()  # type: ignore[operator]
    elapsed = time.perf_counter() - began
    stop.set()
    sampler.join()
    return elapsed, peak[0]


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-execd-") as temp:
        root = Path(temp) / "root"
        root.mkdir()
        starts, cpu = [], []
        for _ in range(STARTS):
            process, _, took = _start(root)
            starts.append(took * 1000)
            cpu.append(_cpu_ms(process.pid))
            _stop(process)
        print(
            f"start-up to first /ping 200 ({STARTS} runs, load average {os.getloadavg()[0]:.1f}): "
            f"wall p50 {statistics.median(starts):.0f} ms, max {max(starts):.0f} ms; "
            f"CPU used p50 {statistics.median(cpu):.0f} ms"
        )

        process, url, _ = _start(root)
        try:
            with httpx.Client(base_url=url, timeout=60) as client:
                for _ in range(5):
                    client.post("/command", json={"command": "true"}).raise_for_status()
                times = []
                for _ in range(ROUND_TRIPS):
                    began = time.perf_counter()
                    client.post("/command", json={"command": "true"}).raise_for_status()
                    times.append((time.perf_counter() - began) * 1000)
                times.sort()
                print(
                    f"command round trip `true` ({ROUND_TRIPS} runs): p50 {times[len(times) // 2]:.1f} ms, "
                    f"p95 {times[int(len(times) * 0.95)]:.1f} ms"
                )

                source = Path(temp) / "source.bin"
                with source.open("wb") as handle:
                    for _ in range(SIZE_MIB):
                        handle.write(os.urandom(1 << 20))
                idle = _rss_kib(process.pid)
                boundary = "bench-boundary"

                def upload() -> None:
                    client.post(
                        "/files/upload",
                        content=_multipart(source, boundary),
                        headers={"content-type": f"multipart/form-data; boundary={boundary}"},
                    ).raise_for_status()

                def download() -> None:
                    with client.stream("GET", "/files/download", params={"path": "/big.bin"}) as response:
                        for _ in response.iter_bytes(1 << 20):
                            pass

                up_s, up_peak = _measure("upload", process.pid, upload)
                down_s, down_peak = _measure("download", process.pid, download)
                print(
                    f"upload {SIZE_MIB} MiB: {SIZE_MIB / up_s:.0f} MiB/s, RSS idle {idle // 1024} MiB, "
                    f"peak {up_peak // 1024} MiB"
                )
                print(f"download {SIZE_MIB} MiB: {SIZE_MIB / down_s:.0f} MiB/s, peak {down_peak // 1024} MiB")
        finally:
            _stop(process)


if __name__ == "__main__":
    main()
