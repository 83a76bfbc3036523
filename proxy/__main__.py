"""`python -m sandgate.proxy --config FILE.json`: the egress proxy child process."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from pydantic import ValidationError

from sandgate.proxy.config import ProxyConfig
from sandgate.proxy.frontdoor import ListenError
from sandgate.proxy.server import run_proxy
from sandgate.proxy.workers import PoolStartError, WorkerSlot, die_with_pool, run_pool, worker_count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandgate.proxy", description=__doc__)
    parser.add_argument("--config", type=Path, required=True, help="ProxyConfig as JSON")
    parser.add_argument("--log-level", default="WARNING")
    parser.add_argument("--worker", help="I/N: run as worker I of the pool's N (the pool starts workers)")
    parser.add_argument("--fds", help="the worker's inherited descriptors: transparent,explicit,audit")
    parser.add_argument("--pool", type=int, help="the worker's pool (its parent) PID")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        config = ProxyConfig.model_validate_json(args.config.read_text())
    except (OSError, ValidationError) as exc:
        print(f"sandgate proxy: cannot use config {args.config}: {exc}", file=sys.stderr)
        return 2
    try:
        if args.worker:
            die_with_pool(args.pool)
            run_proxy(config, WorkerSlot.parse(args.worker, args.fds, args.pool))
        elif worker_count(config) > 1:
            run_pool(config, args.config, args.log_level)
        else:
            run_proxy(config)
    except (ListenError, PoolStartError) as exc:
        print(f"sandgate proxy: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
