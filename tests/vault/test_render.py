"""Renderers for every auth style and passthrough substitution, with sandgate.policy's real models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_args
from urllib.parse import parse_qs, unquote

import pytest

from sandgate.policy import Auth, Binding
from sandgate.vault import (
    RENDERERS,
    LocalStore,
    SecretNotFound,
    VaultError,
    render,
    render_headers,
    reveal_via,
)

VALUES = {
    "token": "tok-Secret_123",
    "basic": "dXNlcjpwYXNzd29yZA==",
    "key": "key-Secret_456",
    "tenant": "acme corp/eu&x=1",
    "quoted": 'sec"ret\\with\nnewline',
}


def binding(auth: dict[str, Any], name: str = "b") -> Binding:
    return Binding.model_validate({"name": name, "match": {"hosts": ["api.example.com"]}, "auth": auth})


def reveal(name: str) -> str:
    if name not in VALUES:
        raise SecretNotFound(name, "the test values")
    return VALUES[name]


def passthrough(*subs: dict[str, Any]) -> Any:
    return render(binding({"type": "passthrough", "substitutions": list(subs)}), reveal).placeholders


def test_every_policy_auth_type_has_a_renderer() -> None:
    union, _field = get_args(Auth)
    types = {get_args(model.model_fields["type"].annotation)[0] for model in get_args(union)}
    assert set(RENDERERS) == types
    assert types >= {"bearer", "basic", "apiKey", "customHeaders", "passthrough", "awsSigV4", "oauth2"}


def test_bearer() -> None:
    auth = binding({"type": "bearer", "credential": "token"}).auth
    assert render_headers(auth, reveal) == [("Authorization", "Bearer tok-Secret_123")]


def test_basic_sends_the_stored_base64_as_is() -> None:
    auth = binding({"type": "basic", "credential": "basic"}).auth
    assert render_headers(auth, reveal) == [("Authorization", "Basic dXNlcjpwYXNzd29yZA==")]


def test_api_key() -> None:
    auth = binding({"type": "apiKey", "name": "X-Api-Key", "credential": "key"}).auth
    assert render_headers(auth, reveal) == [("X-Api-Key", "key-Secret_456")]


def test_custom_headers() -> None:
    auth = binding(
        {
            "type": "customHeaders",
            "headers": [{"name": "X-Token", "credential": "token"}, {"name": "X-Key", "credential": "key"}],
        }
    ).auth
    assert render_headers(auth, reveal) == [("X-Token", "tok-Secret_123"), ("X-Key", "key-Secret_456")]


def test_render_names_the_binding_and_repr_hides_values() -> None:
    injection = render(binding({"type": "bearer", "credential": "token"}, name="github"), reveal)
    assert injection.binding == "github"
    assert "tok-Secret" not in repr(injection) and "Authorization" in repr(injection)
    placeholders = passthrough({"credential": "token", "placeholder": "PH_TOKEN"})
    assert "tok-Secret" not in repr(placeholders) and "PH_TOKEN" in repr(placeholders)


def test_a_value_with_a_line_break_never_goes_into_a_header() -> None:
    with pytest.raises(VaultError, match="'quoted' contains a line break"):
        render(binding({"type": "bearer", "credential": "quoted"}), reveal)
    with pytest.raises(VaultError, match="line break"):
        passthrough({"credential": "quoted", "placeholder": "PH", "in": ["header"]})


def test_missing_credential_is_a_clear_error() -> None:
    with pytest.raises(SecretNotFound, match="no secret named 'nope'"):
        render(binding({"type": "bearer", "credential": "nope"}), reveal)


def test_reveal_via_maps_binding_names_to_vault_names() -> None:
    lookup = reveal_via(reveal, {"gh": "token"})
    auth = binding({"type": "apiKey", "name": "X-A", "credential": "gh"}).auth
    assert render_headers(auth, lookup) == [("X-A", "tok-Secret_123")]
    assert lookup("key") == "key-Secret_456"  # unmapped names are used as they are


def test_rotation_is_seen_by_the_next_render(tmp_path: Path) -> None:
    writer = LocalStore(tmp_path / "vault.enc")
    proxy_side = LocalStore(tmp_path / "vault.enc")
    auth = binding({"type": "bearer", "credential": "api"}).auth
    writer.put("api", "first-value-1")
    assert render_headers(auth, proxy_side.reveal) == [("Authorization", "Bearer first-value-1")]
    writer.put("api", "second-value-2")
    assert render_headers(auth, proxy_side.reveal) == [("Authorization", "Bearer second-value-2")]


# -- passthrough ------------------------------------------------------------------------------


def test_passthrough_defaults_to_header_and_query() -> None:
    placeholders = passthrough({"credential": "tenant", "placeholder": "PH_T"})
    assert placeholders.header("Token PH_T") == "Token acme corp/eu&x=1"
    assert placeholders.query("a=1&t=PH_T") == "a=1&t=acme%20corp%2Feu%26x%3D1"
    assert placeholders.path("/v1/PH_T") == "/v1/PH_T"
    result = placeholders.body(b'{"t": "PH_T"}', "application/json")
    assert result.body == b'{"t": "PH_T"}' and result.replaced == 0 and result.skipped is None


def test_passthrough_query_and_path_are_url_encoded() -> None:
    placeholders = passthrough({"credential": "tenant", "placeholder": "PH_T", "in": ["path", "query"]})
    target = placeholders.target("/tenants/PH_T/items?owner=PH_T&x=PH_T2")
    path, query = target.split("?")
    assert path == "/tenants/acme%20corp%2Feu%26x%3D1/items"
    assert unquote(path.split("/")[2]) == VALUES["tenant"]
    assert parse_qs(query)["owner"] == [VALUES["tenant"]]
    assert parse_qs(query)["x"] == [
        VALUES["tenant"] + "2"
    ]  # a literal placeholder is replaced wherever it is


def test_passthrough_body_json_is_escaped() -> None:
    placeholders = passthrough({"credential": "quoted", "placeholder": "PH_Q", "in": ["body"]})
    result = placeholders.body(b'{"secret": "PH_Q", "n": 1}', "application/json; charset=utf-8")
    assert result.replaced == 1 and result.skipped is None
    assert json.loads(result.body) == {"secret": VALUES["quoted"], "n": 1}
    vendor = placeholders.body(b'["PH_Q"]', "application/vnd.api+json")
    assert json.loads(vendor.body) == [VALUES["quoted"]]


def test_passthrough_body_form_and_text() -> None:
    placeholders = passthrough({"credential": "tenant", "placeholder": "PH_T", "in": ["body"]})
    form = placeholders.body(b"client_secret=PH_T&a=b", "application/x-www-form-urlencoded")
    assert parse_qs(form.body.decode())["client_secret"] == [VALUES["tenant"]]
    text = placeholders.body(b"secret is PH_T.", "text/plain")
    assert text.body == b"secret is acme corp/eu&x=1."


def test_passthrough_body_skips_multipart_and_compressed_with_a_reason() -> None:
    placeholders = passthrough({"credential": "token", "placeholder": "PH_TOKEN", "in": ["body"]})
    body = b'--xyz\r\nContent-Disposition: form-data; name="a"\r\n\r\nPH_TOKEN\r\n--xyz--\r\n'
    multipart = placeholders.body(body, "multipart/form-data; boundary=xyz")
    assert multipart.body == body and multipart.replaced == 0
    assert multipart.skipped and "multipart" in multipart.skipped
    gzipped = placeholders.body(b"PH_TOKEN", "application/json", content_encoding="gzip")
    assert gzipped.body == b"PH_TOKEN" and gzipped.skipped and "gzip" in gzipped.skipped
    identity = placeholders.body(b'"PH_TOKEN"', "application/json", content_encoding="identity")
    assert identity.body == b'"tok-Secret_123"'


def test_passthrough_longest_placeholder_wins_and_values_are_not_rescanned() -> None:
    placeholders = passthrough(
        {"credential": "token", "placeholder": "PH_1"},
        {"credential": "key", "placeholder": "PH_10"},
    )
    assert placeholders.header("PH_10 PH_1") == "key-Secret_456 tok-Secret_123"
    echo = {"self": "PH_SELF-and-PH_SELF"}
    tricky = render(
        binding({"type": "passthrough", "substitutions": [{"credential": "self", "placeholder": "PH_SELF"}]}),
        echo.__getitem__,
    ).placeholders
    assert tricky.header("PH_SELF") == "PH_SELF-and-PH_SELF"


def test_passthrough_body_keeps_non_utf8_bytes() -> None:
    placeholders = passthrough({"credential": "token", "placeholder": "PH_TOKEN", "in": ["body"]})
    result = placeholders.body(b"\xff\xfe PH_TOKEN \x00\x80", "application/octet-stream")
    assert result.body == b"\xff\xfe tok-Secret_123 \x00\x80"


def test_no_placeholders_means_no_change() -> None:
    injection = render(binding({"type": "bearer", "credential": "token"}), reveal)
    assert not injection.placeholders
    assert injection.placeholders.target("/a?b=PH") == "/a?b=PH"
    assert injection.placeholders.body(b"x", "text/plain").body == b"x"
