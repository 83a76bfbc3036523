"""The CLI skeleton and settings precedence (flags > env > TOML file > defaults), run for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from sandgate.lifecycle.api.auth import load_or_create_api_key
from sandgate.lifecycle.cli import main
from sandgate.lifecycle.settings import load_settings
from sandgate.proxy import ProxyConfig
from tests.support.cli import sandgate


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for key in list(os.environ):
        if key.startswith("SANDGATE_"):
            monkeypatch.delenv(key)
    return monkeypatch


def test_help_lists_every_subcommand() -> None:
    out = sandgate("--help").stdout
    for name in ("serve", "policy", "vault", "egress", "logs", "sandbox"):
        assert f"  {name} " in out, f"{name} missing from sandgate --help:\n{out}"


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).with_name("sandgate")
    out = subprocess.run([str(script), "--version"], capture_output=True, text=True, check=True).stdout
    assert "sandgate" in out and "version" in out


def test_defaults(clean_env: pytest.MonkeyPatch) -> None:
    settings = load_settings()
    assert settings.port == 8080
    assert settings.host == "127.0.0.1"
    assert settings.state_dir == Path("/var/lib/sandgate")


def test_flags_beat_env_beat_file(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "sandgate.toml"
    config.write_text('port = 7001\nhost = "127.0.0.9"\nruntime = "docker"\nstate_dir = "/srv/from-file"\n')
    clean_env.setenv("SANDGATE_PORT", "7002")
    clean_env.setenv("SANDGATE_HOST", "127.0.0.8")
    settings = load_settings(config, port=7003)
    assert settings.port == 7003  # flag
    assert settings.host == "127.0.0.8"  # env over file
    assert settings.runtime == "docker"  # file over default
    assert settings.state_dir == Path("/srv/from-file")


def test_the_kubernetes_table_from_toml_and_env(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "k8s.toml"
    config.write_text(
        'runtime = "kubernetes"\n[kubernetes]\nkubeconfig = "/etc/k.conf"\nnamespace = "agents"\n'
    )
    settings = load_settings(config)
    assert settings.runtime == "kubernetes"
    assert (settings.kubernetes.kubeconfig, settings.kubernetes.namespace) == (Path("/etc/k.conf"), "agents")
    assert settings.kubernetes.execd_image == "sandgate.example.test/execd:1"  # the default
    assert settings.kubernetes.gvisor_runtime_class == "gvisor"
    config.write_text(config.read_text() + '[secure_runtime]\ntype = "gvisor"\nk8s_runtime_class = "runsc"\n')
    assert load_settings(config).kubernetes.gvisor_runtime_class == "runsc"  # OpenSandbox's name
    clean_env.setenv("SANDGATE_KUBERNETES", json.dumps({"namespace": "from-env"}))
    assert load_settings(config).kubernetes.namespace == "from-env"
    clean_env.setenv("SANDGATE_KUBERNETES", json.dumps({"namespace": "Not_A_Name"}))
    with pytest.raises(ValueError, match="setting kubernetes"):
        load_settings(config)


PLACEMENT = """runtime = "kubernetes"
[kubernetes.node_selector]
"sandgate.example.test/sandboxes" = "true"
[[kubernetes.tolerations]]
key = "sandgate.example.test/sandboxes"
operator = "Exists"
effect = "NoSchedule"
[[kubernetes.tolerations]]
key = "node.kubernetes.io/unreachable"
effect = "NoExecute"
value = ""
toleration_seconds = 30
"""


def test_where_sandbox_pods_run_from_toml(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "placement.toml"
    config.write_text(PLACEMENT)
    options = load_settings(config).kubernetes
    assert options.node_selector == {"sandgate.example.test/sandboxes": "true"}
    assert [(t.key, t.operator, t.effect, t.toleration_seconds) for t in options.tolerations] == [
        ("sandgate.example.test/sandboxes", "Exists", "NoSchedule", None),
        ("node.kubernetes.io/unreachable", "Equal", "NoExecute", 30),
    ]


@pytest.mark.parametrize(
    ("table", "needle"),
    [
        ('[kubernetes.node_selector]\n"Bad Key" = "x"\n', "not a Kubernetes label or taint key"),
        ('[kubernetes.node_selector]\n"-x.example.test/a" = "x"\n', "not a Kubernetes label or taint key"),
        ('[kubernetes.node_selector]\npool = "a b"\n', "not a Kubernetes label or taint value"),
        (f'[kubernetes.node_selector]\npool = "{"v" * 64}"\n', "not a Kubernetes label or taint value"),
        ('[[kubernetes.tolerations]]\nkey = "a"\noperator = "Exists"\nvalue = "b"\n', "takes no value"),
        ('[[kubernetes.tolerations]]\nvalue = "b"\n', "needs operator Exists"),
        ('[[kubernetes.tolerations]]\nkey = "a"\neffect = "NoSchedule"\ntoleration_seconds = 5\n', "Execute"),
        ('[[kubernetes.tolerations]]\nkey = "a"\neffect = "NoScheduleX"\n', "NoSchedule"),
        ('[[kubernetes.tolerations]]\nkey = "a"\ntolerationSeconds = 5\n', "tolerationSeconds"),
    ],
)
def test_a_bad_placement_stops_serve_before_anything_is_made(
    clean_env: pytest.MonkeyPatch, tmp_path: Path, table: str, needle: str
) -> None:
    config = tmp_path / "bad.toml"
    state_dir = tmp_path / "state"
    config.write_text(f'runtime = "kubernetes"\nstate_dir = "{state_dir}"\n{table}')
    result = CliRunner().invoke(main, ["--config", str(config), "serve"])
    assert result.exit_code == 2, result.output
    assert "bad settings" in result.output and needle in result.output, result.output
    assert not state_dir.exists()  # no state dir, no cluster call: the settings come first


def test_env_names_config_file(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("proxy_dns_port = 5399\n")
    clean_env.setenv("SANDGATE_CONFIG", str(config))
    assert load_settings().proxy_dns_port == 5399


def test_secrets_are_hidden_when_printed(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("SANDGATE_API_KEY", "k-very-secret")
    result = CliRunner().invoke(main, ["serve", "--print-settings"])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.output)
    assert printed["api_key"] == "**********"
    assert "k-very-secret" not in result.output


def test_print_settings_shows_the_resolvers_the_proxy_will_ask(clean_env: pytest.MonkeyPatch) -> None:
    """No upstream_dns set: the system's resolvers from /etc/resolv.conf, not `[]`."""
    resolv_conf = Path("/etc/resolv.conf").read_text().splitlines()
    system = [line.split()[1] for line in resolv_conf if line.split()[:1] == ["nameserver"]]
    shown = json.loads(CliRunner().invoke(main, ["serve", "--print-settings"]).output)
    assert shown["upstream_dns"] == system and system
    assert shown["upstream_dns_source"] == "system (/etc/resolv.conf)"
    flagged = CliRunner().invoke(main, ["serve", "--upstream-dns", "192.0.2.53", "--print-settings"])
    assert json.loads(flagged.output)["upstream_dns"] == ["192.0.2.53"]
    assert json.loads(flagged.output)["upstream_dns_source"] == "settings"


def test_serve_flags_override_env_in_the_real_cli(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env = {"SANDGATE_PORT": "7100", "SANDGATE_STATE_DIR": str(tmp_path)}
    done = sandgate("serve", "--port", "7200", "--print-settings", env=env)
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed["port"] == 7200
    assert printed["state_dir"] == str(tmp_path)


@pytest.mark.parametrize(
    ("toml", "needle"),
    [
        ('port = "not-a-port"\n', "port"),
        ("no_such_setting = 1\n", "no_such_setting"),
        ("port = [\n", "config"),
    ],
)
def test_bad_config_is_a_clear_error(
    clean_env: pytest.MonkeyPatch, tmp_path: Path, toml: str, needle: str
) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(toml)
    result = CliRunner().invoke(main, ["--config", str(config), "serve", "--print-settings"])
    assert result.exit_code == 2
    assert "bad settings" in result.output and needle in result.output


def test_missing_config_file_is_named(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["--config", str(tmp_path / "nope.toml"), "serve", "--print-settings"])
    assert result.exit_code == 2
    assert "nope.toml" in result.output


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        ("198.18.0.2:53", "198.18.0.2"),
        ("198.18.0.2", "198.18.0.2"),
        ("192.0.2.53:5353", "192.0.2.53:5353"),
        ("2001:db8::53", "2001:db8::53"),
        ("[2001:db8::53]:5353", "[2001:db8::53]:5353"),
        ("[2001:db8::53]", "2001:db8::53"),
    ],
)
def test_resolver_addresses_in_every_form(clean_env: pytest.MonkeyPatch, given: str, kept: str) -> None:
    result = CliRunner().invoke(main, ["serve", "--upstream-dns", given, "--print-settings"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["upstream_dns"] == [kept]
    assert ProxyConfig(state_dir=Path("/x"), upstream_dns=[given]).upstream_dns == [kept]


@pytest.mark.parametrize("given", ["198.18.0.2:99999", "198.18.0.2:", "dns.example.com", "[::1]53", "1.2.3"])
def test_a_bad_resolver_address_is_one_line_naming_the_setting(
    clean_env: pytest.MonkeyPatch, given: str
) -> None:
    """Before anything starts (it used to pass settings and kill the proxy at start with
    mitmproxy_rs' "invalid IP address syntax")."""
    result = CliRunner().invoke(main, ["serve", "--upstream-dns", given, "--print-settings"])
    assert result.exit_code == 2
    [error] = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert "setting upstream_dns:" in error and repr(given) in error and "192.0.2.53:5353" in error
    clean_env.setenv("SANDGATE_UPSTREAM_DNS", json.dumps([given]))
    with pytest.raises(ValueError, match="setting upstream_dns: "):
        load_settings()
    with pytest.raises(ValueError, match=r"resolver address|valid port"):
        ProxyConfig(state_dir=Path("/x"), upstream_dns=[given])


def test_a_generated_api_key_is_never_read_as_an_option(tmp_path: Path) -> None:
    """`osb --api-key KEY`, `opensandbox-mcp --api-key KEY`: argparse takes a key that starts
    with '-' for an option (a plain token_urlsafe key does one time in 64)."""
    keys = [load_or_create_api_key(tmp_path / str(n))[0] for n in range(200)]
    assert all(key.startswith("sg-") and len(key) > 40 for key in keys) and len(set(keys)) == 200
    assert load_or_create_api_key(tmp_path / "0") == (keys[0], False)
