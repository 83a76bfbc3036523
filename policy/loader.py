"""Reading policy documents: YAML or JSON text, files and API bodies, with exact error locations.

Rules of this module:
1. This is the only module of sandgate.policy that touches files.
2. Every node's line and column are kept while parsing, so every problem (syntax, unknown key,
   bad value, whole-document check) is reported as file:line:column with a hint, and every rule
   gets an id "file:line" that decisions and audit records cite.
3. All problems of a document are reported together; a document with any problem yields no Policy.
4. Empty text, `null` and `{}` mean deny-all, as in OpenSandbox.
5. `build_policy` is the one validation every policy goes through wherever it enters (file,
   API body, patch, preset include, approval): every limit is checked there, the rule limit
   (`max_rules`, presets expanded) included. A document that was validated where it entered
   (the stored form, the proxy's entry) is loaded by the same function without a limit.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from sandgate.policy.errors import HintedValueError, PolicyError, PolicyIssue, check_rule_limit
from sandgate.policy.models import (
    AwsSigV4Auth,
    Binding,
    BindingMatch,
    EgressRule,
    OAuth2Auth,
    Policy,
    Problem,
)
from sandgate.policy.presets import PRESET_KEYS, REFERENCE, Preset, Presets

NO_PRESETS = Presets()

DocPath = tuple[str | int, ...]
Locator = Callable[[DocPath], tuple[int, int]]


def load_policy(path: str | Path, presets: Presets = NO_PRESETS, max_rules: int | None = None) -> Policy:
    """Read and validate a policy file (YAML or JSON); raises PolicyError with file:line errors."""
    return parse_policy(_read(Path(path)), str(path), presets, max_rules)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError([PolicyIssue(str(path), 0, 0, f"cannot read policy file: {exc}")]) from exc


def parse_policy(
    text: str | dict[str, Any] | None,
    source: str = "<string>",
    presets: Presets = NO_PRESETS,
    max_rules: int | None = None,
) -> Policy:
    """Validate policy text (YAML or JSON, the same model); raises PolicyError.

    An already parsed document (a dict, or None) is accepted too and handled by `policy_from_dict`.
    """
    if not isinstance(text, str):
        return policy_from_dict(text, "<api>" if source == "<string>" else source, presets, max_rules)
    data, locate = _located(text, source)
    return build_policy(data, source, locate, presets, max_rules)


def _located(text: str, source: str) -> tuple[Any, Locator]:
    data, positions = _parse_with_positions(text, source)

    def locate(path: DocPath) -> tuple[int, int]:
        for end in range(len(path), -1, -1):
            if path[:end] in positions:
                return positions[path[:end]]
        return (1, 1)

    return data, locate


def policy_from_dict(
    data: Any, source: str = "<api>", presets: Presets = NO_PRESETS, max_rules: int | None = None
) -> Policy:
    """Validate a parsed document (e.g. an OpenSandbox `networkPolicy` API body); raises PolicyError."""
    return build_policy(data, source, None, presets, max_rules)


def build_policy(
    data: Any,
    source: str,
    locate: Locator | None,
    presets: Presets = NO_PRESETS,
    max_rules: int | None = None,
) -> Policy:
    """Validate `data` into a Policy and give each rule and binding its id; raises PolicyError
    (rule 5: `max_rules` given, a policy with more egress rules, presets expanded, is refused).

    Rules and bindings that already have an id (e.g. kept from their file by a patch) keep it.
    A document's `include` brings in its presets' rules after its own (policy/presets.py).
    """
    if data is None or data == {}:
        data = {}
    if not isinstance(data, dict):
        raise PolicyError(
            [_issue(source, locate, (), "a policy is a mapping", "start with `egress:` or `{`")]
        )
    included = _included(data.get("include"), source, locate, presets)
    if included:
        data = {**data, "egress": [*(data.get("egress") or []), *included]}
    if max_rules is not None and isinstance(data.get("egress"), list):
        check_rule_limit(len(data["egress"]), max_rules)
    try:
        policy = Policy.model_validate(data)
    except ValidationError as exc:
        raise PolicyError(issues_from_validation(exc, source, locate)) from None
    for index, rule in enumerate(policy.egress):
        if not rule.origin:
            rule._origin = _origin(source, locate, ("egress", index))
    for index, binding in enumerate(policy.bindings):
        if not binding.origin:
            binding._origin = _origin(source, locate, ("bindings", index))
    return policy


def _included(include: Any, source: str, locate: Locator | None, presets: Presets) -> list[EgressRule]:
    """The rules of every preset `include` names, in order (policy/presets.py rule 3)."""
    if not isinstance(include, list):
        return []  # absent; anything else not a list is the model's error to report
    rules: list[EgressRule] = []
    issues: list[PolicyIssue] = []
    for index, reference in enumerate(include):
        try:
            rules += _find_preset(presets, str(reference)).rules
        except HintedValueError as exc:
            issues.append(_issue(source, locate, ("include", index), exc.message, exc.hint))
    if issues:
        raise PolicyError(issues)
    return rules


def _find_preset(presets: Presets, reference: str) -> Preset:
    """The preset `reference` names (presets.py rule 2); HintedValueError saying what there is."""
    match = REFERENCE.match(reference)
    if match is None:
        hint = "write preset:NAME or preset:NAME@VERSION"
        raise HintedValueError(f"{reference!r} is not a preset reference", hint)
    name, version = match["name"], match["version"]
    files = [path for folder in presets.dirs if folder.is_dir() for path in sorted(folder.glob("*.yaml"))]
    found = [path for path in files if path.stem == name]
    if not found:
        raise HintedValueError(
            f"unknown preset {name!r}", presets.listing(sorted({path.stem for path in files}))
        )
    preset = load_preset(found[0])
    if version is not None and int(version) != preset.version:
        raise HintedValueError(
            f"preset {name!r} is version {preset.version}, not {version}",
            f"include preset:{name}@{preset.version}, or preset:{name} for the current one",
        )
    return preset


def load_preset(path: Path) -> Preset:
    """Read one preset file; PolicyError with its file:line for anything wrong in it."""
    source = str(path)
    data, locate = _located(_read(path), source)
    meta = data.get("preset") if isinstance(data, dict) else None
    if not isinstance(meta, dict):
        hint = "preset: {version: 1, description: what it opens, risk: what it lets out}"
        raise PolicyError([_issue(source, locate, (), "a preset file starts with a `preset:` block", hint)])
    problems = [
        _issue(source, locate, (key,), f"a preset holds only egress rules, not {key!r}", None)
        for key in sorted(set(data) - PRESET_KEYS)
    ]
    version = meta.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        problems.append(
            _issue(source, locate, ("preset", "version"), "preset version must be a whole number >= 1")
        )
    if problems or not isinstance(version, int):
        raise PolicyError(problems)
    policy = build_policy({"egress": data.get("egress") or []}, source, locate)
    for rule in policy.egress:
        rule._preset = f"preset:{path.stem}@{version}"
    description, risk = str(meta.get("description", "")), str(meta.get("risk", ""))
    return Preset(path.stem, version, description, risk, path, tuple(policy.egress))


def _origin(source: str, locate: Locator | None, path: DocPath) -> str:
    if locate is None:
        return f"{source}:{format_path(path)}"
    return f"{source}:{locate(path)[0]}"


def format_path(path: DocPath) -> str:
    """("egress", 3, "target") -> "egress[3].target"."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _issue(
    source: str, locate: Locator | None, path: DocPath, message: str, hint: str | None = None
) -> PolicyIssue:
    line, column = locate(path) if locate else (0, 0)
    return PolicyIssue(source, line, column, message, hint, format_path(path))


def issues_from_validation(
    exc: ValidationError, source: str, locate: Locator | None, prefix: DocPath = ()
) -> list[PolicyIssue]:
    """One PolicyIssue per pydantic error, located by document path (`prefix` + pydantic's loc)."""
    issues: list[PolicyIssue] = []
    for error in exc.errors():
        path = prefix + _document_path(error["loc"])
        cause = (error.get("ctx") or {}).get("error")
        if isinstance(cause, Problem):
            issues.extend(_issue(source, locate, path + sub, msg, hint) for sub, msg, hint in cause.problems)
        elif isinstance(cause, HintedValueError):
            issues.append(_issue(source, locate, path, cause.message, cause.hint))
        else:
            message, hint = _describe(error, path)
            issues.append(_issue(source, locate, path, message, hint))
    return sorted(issues, key=lambda issue: (issue.line, issue.column))


def _document_path(loc: tuple[Any, ...]) -> DocPath:
    """Pydantic's location without union tags (e.g. the `bearer` in bindings.0.auth.bearer.x)."""
    tags = {
        "bearer",
        "basic",
        "apiKey",
        "customHeaders",
        "passthrough",
        "awsSigV4",
        "function-after",
        "function-before",
    }
    path: list[str | int] = []
    for part in loc:
        if isinstance(part, str) and (part in tags or part.startswith("function-")):
            continue
        path.append("in" if part == "in_" else part)
    return tuple(path)


KNOWN_KEYS = sorted(
    {
        *Policy.model_fields,
        *EgressRule.model_fields,
        *Binding.model_fields,
        *BindingMatch.model_fields,
        "type",
        "credential",
        "name",
        "headers",
        "substitutions",
        "placeholder",
        "in",
        *AwsSigV4Auth.model_fields,
        *OAuth2Auth.model_fields,
    }
)
_AUTH_TYPES = "bearer, basic, apiKey, customHeaders, passthrough, awsSigV4, oauth2"
_HINTS = {
    "extra_forbidden": "remove it or check its spelling",
    "missing": None,
    "union_tag_invalid": f"auth.type is one of {_AUTH_TYPES}",
    "union_tag_not_found": f"add `type:` ({_AUTH_TYPES})",
}


def _describe(error: Any, path: DocPath) -> tuple[str, str | None]:
    kind = error["type"]
    field = str(path[-1]) if path else "document"
    if kind == "extra_forbidden":
        close = difflib.get_close_matches(str(path[-1]), KNOWN_KEYS, n=1)
        return f"unknown key {path[-1]!r}", f"did you mean {close[0]!r}?" if close else _HINTS[kind]
    if kind == "missing":
        return f"missing required key {path[-1]!r}", None
    if kind == "literal_error":
        return f"{field}: {error['msg'].lower()}", None
    if kind in _HINTS:
        return f"{field}: {error['msg']}", _HINTS[kind]
    return f"{field}: {error['msg']}", None


def _parse_with_positions(text: str, source: str) -> tuple[Any, dict[DocPath, tuple[int, int]]]:
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        positions: dict[DocPath, tuple[int, int]] = {}
        data = None if node is None else _to_python(loader, node, (), positions, source)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        raise PolicyError(
            [
                PolicyIssue(
                    source,
                    line,
                    column,
                    f"syntax error: {exc.problem or exc}",
                    "check indentation and quoting",
                )
            ]
        ) from None
    except yaml.YAMLError as exc:
        raise PolicyError([PolicyIssue(source, 0, 0, f"syntax error: {exc}")]) from None
    finally:
        loader.dispose()
    return data, positions


def _to_python(
    loader: yaml.SafeLoader,
    node: yaml.Node,
    path: DocPath,
    positions: dict[DocPath, tuple[int, int]],
    source: str,
) -> Any:
    positions.setdefault(path, (node.start_mark.line + 1, node.start_mark.column + 1))
    if isinstance(node, yaml.MappingNode):
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if key in result:
                line, column = key_node.start_mark.line + 1, key_node.start_mark.column + 1
                raise PolicyError(
                    [
                        PolicyIssue(
                            source,
                            line,
                            column,
                            f"duplicate key {key!r}",
                            "each key may appear once per mapping",
                        )
                    ]
                )
            positions[(*path, key)] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            result[key] = _to_python(loader, value_node, (*path, key), positions, source)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_to_python(loader, item, (*path, i), positions, source) for i, item in enumerate(node.value)]
    return loader.construct_object(node, deep=True)
