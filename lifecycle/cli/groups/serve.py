"""`sandgate serve`: run the control plane and the egress proxy.

Start order (each step must succeed before the next): state dir (0700) -> API key -> CA ->
vault -> nft table -> proxy child (supervised) -> re-adopt surviving sandboxes and re-push
their entries -> expiry reaper -> the HTTP API starts accepting. Shutdown stops the API first,
then the proxy; sandboxes keep running and are re-adopted by the next start.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from sandgate.lifecycle import statelock
from sandgate.lifecycle.cli import Refused
from sandgate.lifecycle.database import DatabaseError
from sandgate.lifecycle.settings import Settings
from sandgate.lifecycle.statelock import StateLock

log = logging.getLogger("sandgate.serve")
REAP_INTERVAL = 1.0
# How long the API keeps an idle keep-alive connection open. It must outlast every client's and
# every proxy's own idle time, or a request sent as the server closes is lost (httpx does not
# retry a POST): uvicorn's default, 5 s, is httpx's default too. Longest common defaults: the
# OpenSandbox Python SDK 30 s, Go's net/http 90 s, nginx upstream and AWS ALB 60 s, OkHttp
# 300 s, Google Cloud load balancers 600 s (fixed: Google asks backends for more). An idle
# connection costs one socket (docs/operations.md, "What clients rely on").
IDLE_KEEP_ALIVE = 620


@click.command("serve")
@click.option("--host", help="Listen address of the API (default 127.0.0.1).")
@click.option("--port", type=int, help="Listen port of the API (default 8080).")
@click.option("--runtime", type=click.Choice(["local", "docker", "kubernetes"]), help="Sandbox runtime.")
@click.option("--upstream-dns", multiple=True, help="Resolver the proxy asks (repeatable).")
@click.option("--upstream-ca", type=click.Path(exists=True, dir_okay=False), help="Extra upstream CA bundle.")
@click.option(
    "--print-settings", is_flag=True, help="Print the effective settings (secrets hidden) and exit."
)
@click.option("--log-level", default="info", type=click.Choice(["debug", "info", "warning", "error"]))
@click.pass_obj
def command(
    obj: Any,
    host: str | None,
    port: int | None,
    runtime: str | None,
    upstream_dns: tuple[str, ...],
    upstream_ca: str | None,
    print_settings: bool,
    log_level: str,
) -> None:
    """Run the control-plane API and the egress proxy."""
    settings = obj.settings(
        host=host,
        port=port,
        runtime=runtime,
        upstream_dns=list(upstream_dns) or None,
        upstream_ca=upstream_ca,
    )
    if print_settings:
        click.echo(json.dumps(effective_settings(settings), indent=2))
        return
    import uvicorn

    from sandgate.lifecycle.api.access_log import redact_access_queries

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with running_control_plane(settings) as app:
        server = uvicorn.Server(api_server_config(app, settings.host, settings.port, log_level))
        redact_access_queries()  # after uvicorn.Config, which configures its loggers
        base = f"http://{settings.host}:{settings.port}"
        click.echo(f"sandgate: API on {base} (state in {settings.state_dir})")
        click.echo(f"sandgate: console on {base}/console (log in with the API key)")
        signal.signal(signal.SIGTERM, exit_cleanly)
        server.run()


def api_server_config(app: Any, host: str, port: int, log_level: str = "info") -> Any:
    """uvicorn's configuration of the API (the console and the execd host endpoint are on it)."""
    import uvicorn

    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        ws="websockets-sansio",
        timeout_keep_alive=IDLE_KEEP_ALIVE,
        # the app adds Date where a response has none (api.app.DateHeader); uvicorn's own would
        # double a proxied answer's Date, and Server would be added to it
        server_header=False,
        date_header=False,
    )


def effective_settings(settings: Settings) -> dict[str, Any]:
    """The settings as JSON values (secrets hidden), with the resolvers the proxy will really
    ask: with no `upstream_dns` set, the system's (/etc/resolv.conf), and where they came from."""
    from sandgate.proxy import system_servers

    shown: dict[str, Any] = json.loads(settings.model_dump_json())
    shown["upstream_dns_source"] = "settings"
    if not settings.upstream_dns:
        try:
            shown["upstream_dns"] = system_servers()
            shown["upstream_dns_source"] = "system (/etc/resolv.conf)"
        except RuntimeError as exc:
            shown["upstream_dns_source"] = str(exc)
    return shown


def exit_cleanly(signum: int, frame: object) -> None:
    """uvicorn re-raises the signal that stopped it once it has shut down; SIGTERM's default
    action would then end the process before the proxy child, the audit indexer and the database
    are closed (an orphaned proxy would keep the ports). Unwind like Ctrl-C instead."""
    sys.exit(0)


def prepare_state_dir(state_dir: Path) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    state_dir.chmod(0o700)


def api_key_for(settings: Settings) -> str:
    from sandgate.lifecycle.api import load_or_create_api_key

    if settings.api_key is not None:
        return settings.api_key.get_secret_value()
    key, created = load_or_create_api_key(settings.state_dir)
    if created:  # never printed: serve's output is a log (journal, terminal scroll-back)
        path = settings.state_dir / "api_key"
        click.echo(
            f"sandgate: generated an API key into {path} (mode 0600); clients send it as "
            f"OPEN-SANDBOX-API-KEY, e.g. export OPEN_SANDBOX_API_KEY=$(cat {path})"
        )
    return key


@contextmanager
def running_control_plane(settings: Settings) -> Iterator[Any]:
    """Everything but the HTTP listener, started in order; stopped in reverse on exit."""
    from sandgate.lifecycle.api import create_app
    from sandgate.lifecycle.api.sandboxes import HostVolumes
    from sandgate.lifecycle.proxy_supervisor import ProxyStartError, stop_proxies
    from sandgate.lifecycle.wiring import build_components

    prepare_state_dir(settings.state_dir)
    lock = hold_state_dir(settings.state_dir)
    try:
        for pid in stop_proxies(settings.state_dir):
            click.echo(
                f"sandgate: stopped proxy pid {pid}, left running by a server of this state dir that died"
            )
        api_key = api_key_for(settings)
        parts = build_components(settings, api_key)
    except (ValueError, DatabaseError) as exc:  # a setting refused (a bind), a database unopened: one line
        lock.release()
        raise click.ClickException(str(exc)) from None
    except BaseException:
        lock.release()
        raise
    try:
        try:
            parts.supervisor.start()
        except ProxyStartError as exc:
            raise click.ClickException(str(exc)) from None
        click.echo(f"sandgate: proxy pid {parts.supervisor.pid} (supervised, restarted if it dies)")
        parts.service.start()
        stop_reaper = start_reaper(parts.service.reap_expired)
        try:
            yield create_app(
                parts.service,
                api_key=api_key,
                audit_path=settings.audit_log,
                extra_routers=parts.extra_routers,
                open_prefixes=parts.open_prefixes,
                execd_endpoint=settings.execd_endpoint,
                exec_audit=settings.exec_audit != "off",
                host_volumes=HostVolumes(
                    tuple(settings.volume_host_prefixes), (settings.state_dir,), claims=settings.pvc_volumes
                ),
                renew_interval=settings.renew_on_access_interval,
                gate=parts.gate,
            )
        finally:
            stop_reaper()
    finally:
        parts.close()
        lock.release()


def hold_state_dir(state_dir: Path) -> StateLock:
    """The state dir's lock, or a one-line refusal that has touched nothing of the holder's."""
    try:
        return statelock.acquire(state_dir)
    except statelock.AlreadyRunning as exc:
        raise Refused(str(exc)) from None


def start_reaper(reap: Any) -> Any:
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(REAP_INTERVAL):
            try:
                for sandbox_id in reap():
                    log.info("sandbox %s expired and was deleted", sandbox_id)
            except Exception:
                log.exception("expiry reaper failed; retrying")

    thread = threading.Thread(target=loop, name="expiry-reaper", daemon=True)
    thread.start()

    def halt() -> None:
        stop.set()
        thread.join(5)

    return halt
