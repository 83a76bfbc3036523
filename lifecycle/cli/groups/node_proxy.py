"""`sandgate node-proxy`: the node agent of the Kubernetes runtime (see lifecycle/node.py)."""

from __future__ import annotations

from ipaddress import IPv4Network
from pathlib import Path

import click

from sandgate.lifecycle.cli import Refused

FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


@click.command("node-proxy")
@click.option(
    "--state-dir",
    "state_dir",
    type=click.Path(path_type=Path),
    default=Path("/var/lib/sandgate-node"),
    show_default=True,
    help="The node's proxy state: config, control socket, audit file.",
)
@click.option("--listen", required=True, help="Control API address: the node's InternalIP:port.")
@click.option("--tls-cert", type=FILE, required=True, help="The control API's certificate (PEM).")
@click.option("--tls-key", type=FILE, required=True, help="Its private key (PEM).")
@click.option("--token-file", type=FILE, required=True, help="The bearer token the server sends (mode 0600).")
@click.option(
    "--pod-bridge", default="cni0", show_default=True, help="The CNI bridge the node's Pods hang on."
)
@click.option("--pod-cidr", default="10.232.0.0/24", show_default=True, help="The node's Pod range.")
@click.option(
    "--upstream-dns", multiple=True, help="Resolver the proxy asks (repeat); default /etc/resolv.conf."
)
@click.option("--upstream-ca", type=FILE, help="Extra PEM bundle the proxy trusts upstream.")
def command(
    state_dir: Path,
    listen: str,
    tls_cert: Path,
    tls_key: Path,
    token_file: Path,
    pod_bridge: str,
    pod_cidr: str,
    upstream_dns: tuple[str, ...],
    upstream_ca: Path | None,
) -> None:
    """Run a Kubernetes node's egress proxy agent (as root).

    Makes the egress proxy every Pod's only way out on this node and serves the sandgate server
    (TLS, bearer token): sandbox entries and their secrets in, audit records out. Run as root in
    the node's network namespace (a DaemonSet with hostNetwork). The nft table stays when the
    agent stops: Pods then have no egress until it is back (docs/kubernetes.md).
    """
    from sandgate.lifecycle.node import NodeAgentConfig, NodeError, PodNetwork, run_agent

    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise click.BadParameter(f"{listen!r}: give it as ADDRESS:PORT", param_hint="--listen")
    try:
        pods = PodNetwork(bridge=pod_bridge, cidr=IPv4Network(pod_cidr))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--pod-cidr") from None
    config = NodeAgentConfig(
        state_dir=state_dir,
        listen=(host.strip("[]"), int(port)),
        tls_cert=tls_cert,
        tls_key=tls_key,
        token_file=token_file,
        pods=pods,
        upstream_dns=upstream_dns,
        upstream_ca=upstream_ca,
    )
    try:
        run_agent(config)
    except NodeError as exc:
        raise Refused(str(exc)) from None
