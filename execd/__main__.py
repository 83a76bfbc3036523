"""`python -m sandgate.execd --host H --port P [--token T] [--root DIR]` (also `sandgate-execd`)."""

from __future__ import annotations

import argparse
import os

import uvicorn

from .app import ExecdConfig, create_app


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sandgate-execd", description="OpenSandbox-compatible execd")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=44772, help="port to listen on (default 44772)")
    parser.add_argument(
        "--token",
        default=os.environ.get("EXECD_ACCESS_TOKEN"),
        help="require this X-EXECD-ACCESS-TOKEN on every route but /ping (default: $EXECD_ACCESS_TOKEN)",
    )
    parser.add_argument("--root", help="resolve every file path under DIR; paths may never leave it")
    parser.add_argument("--log-level", default="warning", help="uvicorn log level (default warning)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.root and not os.path.isdir(args.root):
        raise SystemExit(f"sandgate-execd: --root {args.root!r} is not a directory")
    app = create_app(ExecdConfig(token=args.token or None, root=args.root))
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,
        http="h11",
        loop="asyncio",
        ws="none",
        lifespan="on",
        timeout_graceful_shutdown=3,
    )


if __name__ == "__main__":
    main()
