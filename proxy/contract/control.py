"""The control API's routes and `ProxyControl`, the client lifecycle uses (mitmproxy-free).

Rules: only lifecycle talks to the control socket (it lives in the state dir, which sandboxes
never see). `ROUTES` is the one route table: the proxy's control app, the worker pool's app (which
fans a change out to every worker) and this client all name routes from it, so the three cannot
drift apart. What each route does is documented in docs/proxy.md ("Control API").

    PUT    /sandboxes/{address}   body: SandboxEntry        -> 200 {"sandbox_id", "address", "rules"}
    DELETE /sandboxes/{address}                             -> 204 (404 if unknown)
    GET    /sandboxes                                       -> 200 [SandboxEntry, ...]
    GET    /sandboxes/{address}                             -> 200 SandboxEntry (404 if unknown)
    GET    /health                                          -> 200 {"status": "ok", "sandboxes": n}
    GET    /metrics                                         -> 200 Prometheus text
    POST   /vault/changed   body: {"names": [...]} or {}    -> 200 {"refreshed": n}
    PUT    /vault/values    body: VaultValues               -> 200 {"stored": n, "removed": n}
                                                               (409 unless the vault is `memory`)
    GET    /approvals                                       -> 200 [held request, ...]
    POST   /approvals/{approval_id}  body: ApprovalAnswer    -> 200 {"answered": id} (404 if not held)

A worker of the pool has its own socket, which only the pool talks to, with one more route
(`WORKER_ROUTES`): `POST /serve` (start accepting). The pool's socket, which serves DNS, adds
`POOL_ROUTES`: `GET /names/{sandbox_address}/{address}`, which workers ask.
"""

from __future__ import annotations

import builtins
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from sandgate.proxy.contract.config import SandboxEntry


@dataclass(frozen=True)
class Route:
    method: str
    path: str  # a FastAPI path template

    def at(self, **params: str) -> str:
        """The path with its parameters filled in."""
        return self.path.format(**params)


@dataclass(frozen=True)
class Routes:
    put_sandbox: Route = Route("PUT", "/sandboxes/{address}")
    drop_sandbox: Route = Route("DELETE", "/sandboxes/{address}")
    list_sandboxes: Route = Route("GET", "/sandboxes")
    get_sandbox: Route = Route("GET", "/sandboxes/{address}")
    health: Route = Route("GET", "/health")
    metrics: Route = Route("GET", "/metrics")
    vault_changed: Route = Route("POST", "/vault/changed")
    put_values: Route = Route("PUT", "/vault/values")
    list_approvals: Route = Route("GET", "/approvals")
    answer_approval: Route = Route("POST", "/approvals/{approval_id}")


@dataclass(frozen=True)
class WorkerRoutes:
    serve: Route = Route("POST", "/serve")


@dataclass(frozen=True)
class PoolRoutes:
    name_for: Route = Route("GET", "/names/{sandbox_address}/{address}")


ROUTES = Routes()
JSON = {"content-type": "application/json"}
WORKER_ROUTES = WorkerRoutes()
POOL_ROUTES = PoolRoutes()


class VaultChange(BaseModel):
    """Vault entries that were stored, rotated or removed; None means "maybe all of them"."""

    names: list[str] | None = None


class VaultValues(BaseModel):
    """Values for a `memory` vault (a node proxy's: vault/memory.py), stored and removed by name.
    The values never appear in a validation error or a repr."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    values: dict[str, SecretStr] = Field(default_factory=dict)
    removed: list[str] = Field(default_factory=list)

    def revealed_json(self) -> str:
        """The body as sent: the values themselves (`model_dump_json` would write asterisks)."""
        plain = {name: value.get_secret_value() for name, value in self.values.items()}
        return json.dumps({"values": plain, "removed": self.removed})


class ApprovalAnswer(BaseModel):
    """A reviewer's answer to a held request (proxy/approvals.py); `by` is who, for the audit."""

    allow: bool
    by: str = Field(min_length=1, max_length=200)


class ProxyControlError(RuntimeError):
    """The proxy refused a control request; the message says why and what to fix."""


class ProxyControl:
    """Sync client of the control API: `ProxyControl(names.control_socket(state_dir))`."""

    def __init__(self, socket_path: Path | str, timeout: float = 5.0) -> None:
        self.socket_path = Path(socket_path)
        self._client = httpx.Client(
            transport=httpx.HTTPTransport(uds=str(socket_path)), base_url="http://proxy", timeout=timeout
        )

    def put_sandbox(self, entry: SandboxEntry) -> dict[str, Any]:
        route, path = ROUTES.put_sandbox, ROUTES.put_sandbox.at(address=entry.address)
        return self._call(route.method, path, content=entry.model_dump_json(), headers=JSON).json()

    def drop_sandbox(self, address: str) -> bool:
        """True if it was there; dropping an unknown address is not an error."""
        route = ROUTES.drop_sandbox
        response = self._client.request(route.method, route.at(address=address))
        if response.status_code == 404:
            return False
        self._ok(response)
        return True

    def vault_changed(self, names: list[str] | None = None) -> int:
        """Tell the proxy these vault entries changed (None: any); how many it re-read."""
        route = ROUTES.vault_changed
        return int(self._call(route.method, route.path, json={"names": names}).json()["refreshed"])

    def put_values(self, values: VaultValues) -> dict[str, int]:
        """Store and remove values of the proxy's `memory` vault (a node proxy's)."""
        route = ROUTES.put_values
        return self._call(route.method, route.path, content=values.revealed_json(), headers=JSON).json()

    def list(self) -> list[SandboxEntry]:
        route = ROUTES.list_sandboxes
        return [SandboxEntry.model_validate(item) for item in self._call(route.method, route.path).json()]

    def approvals(self) -> builtins.list[dict[str, Any]]:
        """The requests held for a reviewer (proxy/approvals.py)."""
        route = ROUTES.list_approvals
        return list(self._call(route.method, route.path).json())

    def answer_approval(self, approval_id: str, allow: bool, by: str) -> bool:
        """Answer a held request; False if it is not held (answered, timed out, sandbox gone)."""
        route, body = ROUTES.answer_approval, ApprovalAnswer(allow=allow, by=by).model_dump_json()
        path = route.at(approval_id=approval_id)
        response = self._client.request(route.method, path, content=body, headers=JSON)
        if response.status_code == 404:
            return False
        self._ok(response)
        return True

    def health(self) -> dict[str, Any]:
        return self._call(ROUTES.health.method, ROUTES.health.path).json()

    def metrics(self) -> str:
        return self._call(ROUTES.metrics.method, ROUTES.metrics.path).text

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> ProxyControl:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self._ok(self._client.request(method, path, **kwargs))

    def _ok(self, response: httpx.Response) -> httpx.Response:
        if response.is_success:
            return response
        try:
            body = response.json()
        except ValueError:
            body = response.text
        request = response.request
        where = f"{request.method} {request.url.path}"
        raise ProxyControlError(f"proxy control {where} -> {response.status_code}: {body}")
