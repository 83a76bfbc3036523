"""A small client of sandgate's API for the `sandgate sandbox` and `sandgate egress` commands.

Connection settings follow `osb`: flags > environment (`OPEN_SANDBOX_DOMAIN`, `..._API_KEY`,
`..._PROTOCOL`) > `~/.opensandbox/config.toml` ([connection] domain, api_key, protocol) >
defaults (localhost:8080, http). Errors raise `ClientError` with the server's message.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

CONFIG_FILE = Path.home() / ".opensandbox" / "config.toml"


class ClientError(Exception):
    pass


def connection(domain: str | None, api_key: str | None, protocol: str | None) -> tuple[str, str | None]:
    """(base URL, API key) from flags, then env, then the osb config file."""
    file: dict[str, Any] = {}
    if CONFIG_FILE.is_file():
        file = tomllib.loads(CONFIG_FILE.read_text()).get("connection", {})

    def pick(flag: str | None, env: str, key: str, default: str | None) -> str | None:
        return flag or os.environ.get(env) or file.get(key) or default

    chosen_domain = pick(domain, "OPEN_SANDBOX_DOMAIN", "domain", "localhost:8080")
    chosen_protocol = pick(protocol, "OPEN_SANDBOX_PROTOCOL", "protocol", "http")
    key = pick(api_key, "OPEN_SANDBOX_API_KEY", "api_key", None)
    base = chosen_domain if "://" in str(chosen_domain) else f"{chosen_protocol}://{chosen_domain}"
    return f"{base}/v1", key


class Client:
    def __init__(self, base_url: str, api_key: str | None) -> None:
        headers = {"OPEN-SANDBOX-API-KEY": api_key} if api_key else {}
        self.http = httpx.Client(base_url=base_url, headers=headers, timeout=60, trust_env=False)

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ClientError(f"cannot reach {self.http.base_url}: {exc}") from exc
        if response.status_code >= 400:
            try:
                message = response.json().get("message", response.text)
            except ValueError:
                message = response.text
            raise ClientError(f"{method} {path}: {response.status_code} {message}")
        return response.json() if response.content else None

    def egress(self, sandbox_id: str, method: str, path: str, **kwargs: Any) -> Any:
        return self.call(method, f"/sandboxes/{sandbox_id}/egress{path}", **kwargs)

    def execd(self, sandbox_id: str) -> str:
        """The path prefix of the sandbox's execd, through the server's reverse proxy."""
        return f"/sandboxes/{sandbox_id}/proxy/44772"

    def run(self, sandbox_id: str, argv: list[str]) -> Iterator[dict[str, Any]]:
        """Run argv (exactly these words, no shell) through the server proxy to execd; yields its events."""
        path = f"{self.execd(sandbox_id)}/command"
        with self.http.stream("POST", path, json={"argv": argv}, timeout=None) as response:
            if response.status_code >= 400:
                raise ClientError(f"exec: {response.status_code} {response.read().decode(errors='replace')}")
            for line in response.iter_lines():
                line = line.removeprefix("data:").strip()
                if line:
                    yield json.loads(line)

    def download(self, sandbox_id: str, path: str) -> bytes:
        """The bytes of a file inside the sandbox."""
        response = self.http.get(f"{self.execd(sandbox_id)}/files/download", params={"path": path})
        if response.status_code >= 400:
            raise ClientError(f"download {path}: {response.status_code} {response.text}")
        return response.content

    def remove(self, sandbox_id: str, path: str) -> None:
        self.http.delete(f"{self.execd(sandbox_id)}/files", params={"path": path})
