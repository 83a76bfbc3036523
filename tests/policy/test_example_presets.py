"""The example presets (examples/presets/) and every policy under examples/ pass the real
`sandgate policy check`, as CI would run it on an operator's preset directory and its users: a
preset file is checked as a preset, a policy with every preset it includes. Each example preset is
included by an example policy, and `explain` names the preset's own line when it decides."""

from __future__ import annotations

from pathlib import Path

from tests.support.cli import sandgate

EXAMPLES = Path(__file__).parents[2] / "examples"
PRESETS = EXAMPLES / "presets"


def check(*args: str) -> tuple[int, list[str]]:
    ran = sandgate("policy", "check", "--preset-dir", str(PRESETS), *args)
    return ran.returncode, ran.stdout.splitlines()


def test_every_example_policy_and_preset_passes_policy_check() -> None:
    files = sorted(EXAMPLES.rglob("*.yaml"))
    presets = sorted(PRESETS.glob("*.yaml"))
    assert len(presets) >= 2 and set(presets) <= set(files)
    returncode, lines = check(*map(str, files))
    assert returncode == 0, lines
    assert [line.split()[1] for line in lines] == [str(path) for path in files]  # one ok per file
    for path in presets:
        assert f"ok {path} (preset {path.stem}@1," in "\n".join(lines)


def test_each_example_preset_is_included_and_explained_by_its_line() -> None:
    policy = EXAMPLES / "policy-with-presets.yaml"
    included = {
        "package-mirror": "https://files.mirror.example.com/packages/tool-1.0-py3-none-any.whl",
        "git-server": "https://git.example.com/acme/app.git/info/refs",
    }
    assert set(included) == {path.stem for path in PRESETS.glob("*.yaml")}
    for name, url in included.items():
        ran = sandgate("policy", "explain", "--preset-dir", str(PRESETS), str(policy), url)
        assert ran.returncode == 0 and f"rule={PRESETS / name}.yaml:" in ran.stdout, ran.stdout
    pushed = sandgate(
        "policy",
        "explain",
        "--preset-dir",
        str(PRESETS),
        str(policy),
        "https://git.example.com/other/app.git/info/refs",
    )
    assert pushed.returncode == 1 and pushed.stdout.startswith("deny "), pushed.stdout  # another organisation


def test_a_broken_preset_fails_the_check_at_its_lines(tmp_path: Path) -> None:
    broken = tmp_path / "mirror.yaml"
    broken.write_text(
        "preset:\n  version: 0\n  description: d\n  risk: r\n"
        "egress: [{action: allow, target: pypi.mirror.example.com}]\n"
        "bindings: []\n"
    )
    returncode, lines = check(str(PRESETS / "git-server.yaml"), str(broken))
    assert returncode == 2
    assert lines[1:] == [
        f"{broken}:6:1: a preset holds only egress rules, not 'bindings'",
        f"{broken}:2:3: preset version must be a whole number >= 1",
    ]
