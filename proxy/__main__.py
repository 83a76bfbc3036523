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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandgate.proxy", description=__doc__)
    parser.add_argument("--config", type=Path, required=True, help="ProxyConfig as JSON")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        config = ProxyConfig.model_validate_json(args.config.read_text())
    except (OSError, ValidationError) as exc:
        print(f"sandgate proxy: cannot use config {args.config}: {exc}", file=sys.stderr)
        return 2
    try:
        run_proxy(config)
    except ListenError as exc:
        print(f"sandgate proxy: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
