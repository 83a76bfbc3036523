"""`python -m sandgate.proxy --config FILE.json [--secrets-fd N]`: the egress proxy child process.

The vault's secrets (`StoreSecrets` JSON) are read from descriptor N, a pipe the control plane
wrote and closed, so they are in no file and on no command line."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from pydantic import ValidationError

from sandgate.proxy.contract.config import ProxyConfig
from sandgate.proxy.frontdoor import ListenError
from sandgate.proxy.server import run_proxy
from sandgate.proxy.template import WorkerSlot
from sandgate.proxy.workers import PoolStartError, run_pool, worker_count
from sandgate.vault import StoreSecrets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandgate.proxy", description=__doc__)
    parser.add_argument("--config", type=Path, required=True, help="ProxyConfig as JSON")
    parser.add_argument(
        "--secrets-fd", type=int, help="a pipe carrying the vault's secrets (StoreSecrets JSON)"
    )
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        config = ProxyConfig.model_validate_json(args.config.read_text())
        if args.secrets_fd is not None:
            config.vault_secrets = read_secrets(args.secrets_fd)
    except (OSError, ValueError) as exc:
        print(f"sandgate proxy: cannot use config {args.config}: {exc}", file=sys.stderr)
        return 2
    try:
        if worker_count(config) > 1:
            run_pool(config, lambda slot: run_worker(config, slot))
        else:
            run_proxy(config)
    except (ListenError, PoolStartError) as exc:
        print(f"sandgate proxy: {exc}", file=sys.stderr)
        return 1
    return 0


def read_secrets(fd: int) -> StoreSecrets:
    """The vault's secrets from the pipe; an error names no value (pydantic's would quote it)."""
    with os.fdopen(fd, "rb") as pipe:
        data = pipe.read()
    try:
        return StoreSecrets.model_validate_json(data)
    except ValidationError:
        raise ValueError(f"descriptor {fd} did not carry the vault's secrets as StoreSecrets JSON") from None


def run_worker(config: ProxyConfig, slot: WorkerSlot) -> None:
    """A forked worker's life (proxy/template.py): as the one proxy, with the pool's descriptors."""
    try:
        run_proxy(config, slot)
    except ListenError as exc:
        print(f"sandgate proxy worker {slot.name}: {exc}", file=sys.stderr)
        raise SystemExit(1) from exc


if __name__ == "__main__":
    sys.exit(main())
