"""`sandgate serve`: run the control plane and the egress proxy."""

from __future__ import annotations

import click


@click.command("serve")
@click.option("--host", help="Listen address of the API (default 127.0.0.1).")
@click.option("--port", type=int, help="Listen port of the API (default 8080).")
@click.option("--runtime", type=click.Choice(["local", "docker"]), help="Sandbox runtime.")
@click.option("--upstream-dns", multiple=True, help="Resolver the proxy asks (repeatable).")
@click.option("--upstream-ca", type=click.Path(exists=True, dir_okay=False), help="Extra upstream CA bundle.")
@click.option(
    "--print-settings", is_flag=True, help="Print the effective settings (secrets hidden) and exit."
)
@click.pass_obj
def command(obj, host, port, runtime, upstream_dns, upstream_ca, print_settings) -> None:
    """Run the control-plane API and the egress proxy."""
    settings = obj.settings(
        host=host,
        port=port,
        runtime=runtime,
        upstream_dns=list(upstream_dns) or None,
        upstream_ca=upstream_ca,
    )
    if print_settings:
        click.echo(settings.model_dump_json(indent=2))
        return
    raise click.ClickException("serve is not implemented yet (issue 7)")
