"""Checks an OCSF event against the OCSF schema of the version its `metadata.version` names.

The schema is the OCSF project's own export of that version, shipped in the `ocsf-json-schema`
package, which also turns a class (with the profiles an event declares) into a JSON Schema
(draft 2020-12: required attributes, no attribute the class does not define, types, enums, the
patterns of `ip_t`, `hostname_t`..., `at_least_one` constraints); `jsonschema` checks it. On top,
what JSON Schema cannot say and the OCSF validator checks: `type_uid` is `class_uid * 100 +
activity_id`, the class's and category's names and uids are the schema's, and each enum's
caption (`activity_name`, `severity`, `status`, `direction`...) is its id's, unless the id is
99 Other (the caption is then the source's own word).
"""

from __future__ import annotations

import functools
from typing import Any

import jsonschema
from ocsf_json_schema import OcsfJsonSchemaEmbedded, get_ocsf_schema

OTHER = "99"


@functools.cache
def _schema(version: str) -> dict[str, Any]:
    return get_ocsf_schema(version=version)


@functools.cache
def _validator(version: str, class_uid: int, profiles: tuple[str, ...]) -> jsonschema.Draft202012Validator:
    embedded = OcsfJsonSchemaEmbedded(_schema(version))
    name = embedded.lookup_class_name_from_uid(class_uid)
    return jsonschema.Draft202012Validator(embedded.get_class_schema(name, list(profiles)))


def ocsf_errors(event: dict[str, Any]) -> list[str]:
    """Every way `event` breaks the OCSF schema of its version (empty: valid)."""
    version = event["metadata"]["version"]
    profiles = tuple(event["metadata"].get("profiles") or ())
    errors = [
        f"{'.'.join(map(str, error.absolute_path)) or '(event)'}: {error.message}"
        for error in _validator(version, event["class_uid"], profiles).iter_errors(event)
    ]
    schema = _schema(version)
    klass = next(c for c in schema["classes"].values() if c["uid"] == event["class_uid"])
    expected = {
        "type_uid": event["class_uid"] * 100 + event["activity_id"],
        "class_name": klass["caption"],
        "category_name": klass.get("category_name"),  # none for the Base Event (0)
        "category_uid": klass["attributes"]["category_uid"].get("enum", {}),
    }
    for name, value in expected.items():
        if name == "category_uid":
            if str(event[name]) not in value:
                errors.append(f"category_uid {event[name]} is not the class's ({sorted(value)})")
        elif event.get(name) != value:
            errors.append(f"{name} is {event.get(name)!r}, the schema's is {value!r}")
    errors += _caption_errors(schema, klass["attributes"], event, "")
    return errors


def _caption_errors(
    schema: dict[str, Any], attributes: dict[str, Any], value: dict[str, Any], at: str
) -> list[str]:
    """Enum captions (`sibling` attributes) of `value` and of every object in it."""
    errors = []
    for name, item in value.items():
        spec = attributes.get(name, {})
        sibling = spec.get("sibling")
        if spec.get("enum") and sibling and sibling in value and str(item) != OTHER:
            caption = spec["enum"].get(str(item), {}).get("caption")
            if value[sibling] != caption:
                errors.append(f"{at}{sibling} is {value[sibling]!r}; {at}{name} {item} is {caption!r}")
        if spec.get("type") == "object_t":
            inner = schema["objects"][spec["object_type"]]["attributes"]
            for element in item if isinstance(item, list) else [item]:
                if isinstance(element, dict):
                    errors += _caption_errors(schema, inner, element, f"{at}{name}.")
    return errors
