"""Echo forms (issue 27): every way a mainstream server, serialiser or template engine writes a
secret back is redacted, escaped per character in any mix, two levels deep, in UTF-8 and UTF-16,
whole or streamed in any chunking.

The forms here are made independently of the redactor: by the standard library's and
MarkupSafe's real escapers, and by a per-character escaper written from the specifications
(JSON, ECMAScript, RFC 3986, HTML5 character references), not from `sandgate.vault.escapes`.
"""

from __future__ import annotations

import base64
import html
import html.entities
import itertools
import json
from collections.abc import Callable
from urllib.parse import quote, unquote
from xml.sax.saxutils import escape as xml_escape

import markupsafe
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sandgate.vault import REDACTED, Redactor
from sandgate.vault.forms import SERIALISERS
from tests.support.tiers import examples

# -- a per-character escaper, from the specifications ------------------------------------------

NAMES: dict[str, list[str]] = {}
for _name, _value in html.entities.html5.items():
    if len(_value) == 1 and _name.endswith(";"):
        NAMES.setdefault(_value, []).append(_name)


def _utf16_units(c: str) -> list[int]:
    data = c.encode("utf-16-be")
    return [int.from_bytes(data[i : i + 2]) for i in range(0, len(data), 2)]


ESCAPERS: dict[str, Callable[[str, int], str | None]] = {
    "json \\u": lambda c, n: "".join(f"\\u{u:04x}" if n % 2 else f"\\u{u:04X}" for u in _utf16_units(c)),
    "json short": lambda c, n: {"/": "\\/", '"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t"}.get(c),
    "js \\x": lambda c, n: f"\\x{ord(c):02x}" if ord(c) < 256 else None,
    "js \\u{}": lambda c, n: f"\\u{{{ord(c):0{1 + n % 6}X}}}",
    "percent": lambda c, n: "".join(f"%{b:02x}" if n % 2 else f"%{b:02X}" for b in c.encode()),
    "percent-u": lambda c, n: f"%u{ord(c):04X}" if ord(c) <= 0xFFFF else None,
    "html decimal": lambda c, n: f"&#{ord(c):0{1 + n % 7}d};",
    "html hex": lambda c, n: f"&#{'xX'[n % 2]}{ord(c):0{1 + n % 6}x};",
    "html named": lambda c, n: "&" + NAMES[c][n % len(NAMES[c])] if c in NAMES else None,
}


# A writer uses one family per level, and always escapes its own escape character (a JSON writer
# `\\`, an HTML writer `&`, a URL encoder `%`); which other characters it escapes varies.
FAMILIES = {
    "json": (("json \\u", "json short", "js \\x", "js \\u{}"), "\\"),
    "url": (("percent", "percent-u"), "%"),
    "html": (("html decimal", "html hex", "html named"), "&"),
}


def escape_some(text: str, picks: list[tuple[int, int]]) -> str:
    """`text` as one family's writer may write it: each character raw or escaped, as `picks`
    says (cycled; the first pick names the family)."""
    names, lead = list(FAMILIES.values())[picks[0][0] % len(FAMILIES)]
    out = []
    for c, (which, n) in zip(text, itertools.cycle(picks), strict=False):
        choices = [ESCAPERS[name] for name in names[which % len(names) :] + names]
        escaped = (
            None if which % 3 == 0 and c != lead else next(filter(None, (e(c, n) for e in choices)), None)
        )
        out.append(escaped if escaped is not None else c)
    return "".join(out)


SECRETS = st.text(
    alphabet=st.sampled_from(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789/+=&<>\"'-_.~ é€"
    ),
    min_size=8,
    max_size=32,
).filter(lambda s: s.strip() == s and len(set(s)) > 3)
PICKS = st.lists(st.tuples(st.integers(0, 20), st.integers(0, 40)), min_size=1, max_size=12)
SURROUNDINGS = st.text(alphabet='ab {}":,<>/\n', max_size=12)


def chunked(r: Redactor, data: bytes, cuts: list[int]) -> bytes:
    stream = r.stream()
    bounds = [0, *sorted({c for c in cuts if c <= len(data)}), len(data)]
    return b"".join(stream.feed(data[a:b]) for a, b in itertools.pairwise(bounds)) + stream.flush()


@settings(max_examples=examples(300), deadline=None)
@given(
    secret=SECRETS,
    picks=PICKS,
    second=st.none() | PICKS,
    charset=st.sampled_from(["utf-8", "utf-16-le", "utf-16-be"]),
    before=SURROUNDINGS,
    after=SURROUNDINGS,
    cuts=st.lists(st.integers(0, 3000), max_size=6),
)
def test_any_mix_of_per_character_escapes_two_levels_deep(
    secret: str,
    picks: list[tuple[int, int]],
    second: list[tuple[int, int]] | None,
    charset: str,
    before: str,
    after: str,
    cuts: list[int],
) -> None:
    form = escape_some(secret, picks)
    if second is not None:  # an escape of the escapes: a template writing JSON, JSON in JSON
        form = escape_some(form, second)
    data = f"{before}{form}{after}".encode(charset)
    r = Redactor([secret])
    out = r.redact(data)
    assert form.encode(charset) not in out and REDACTED.decode().encode(charset) in out, (secret, form, out)
    assert len(form.encode(charset)) <= r.hold  # a stream holds back enough to see all of it
    assert chunked(r, data, cuts) == out


# -- what real escapers write ------------------------------------------------------------------


def go_json(text: str) -> str:
    """Go's encoding/json: `<`, `>`, `&`, U+2028, U+2029 as \\u escapes (HTMLEscape is the default)."""
    out = json.dumps(text, ensure_ascii=False)[1:-1]
    for c in "<>&\u2028\u2029":
        out = out.replace(c, f"\\u{ord(c):04x}")
    return out


REAL_WRITERS: dict[str, Callable[[str], str]] = {
    "Python json": lambda s: json.dumps(s)[1:-1],
    "Go encoding/json": go_json,
    "PHP json_encode": lambda s: json.dumps(s)[1:-1].replace("/", "\\/"),
    "html.escape": html.escape,
    "MarkupSafe (Jinja2, Flask)": lambda s: str(markupsafe.escape(s)),
    "xml.sax.saxutils": lambda s: xml_escape(s, {'"': "&quot;"}),
    "xmlcharrefreplace": lambda s: s.encode("ascii", "xmlcharrefreplace").decode(),
    "every character a decimal reference": lambda s: "".join(f"&#{ord(c)};" for c in s),
    "every character a hex reference": lambda s: "".join(f"&#x{ord(c):X};" for c in s),
    "encodeURIComponent": lambda s: quote(s, safe="!'()*-._~"),
    "JSON of HTML (a template in a JSON API)": lambda s: go_json(html.escape(s)),
    "HTML of JSON (JSON in an attribute)": lambda s: html.escape(json.dumps(s)[1:-1]),
    "JSON in a JSON string": lambda s: json.dumps(json.dumps(s)[1:-1])[1:-1],
    "URL of HTML": lambda s: quote(html.escape(s), safe=""),
}
TWO_LEVELS = {
    "JSON of HTML (a template in a JSON API)",
    "HTML of JSON (JSON in an attribute)",
    "JSON in a JSON string",
    "URL of HTML",
}
TOKENS = ["ghp_R3dact0r+Test/Value=42", "tok<en>&'\"é€-0123456789", "c2stbGl2ZS0xMjM0NTY3ODkw+/=="]


@pytest.mark.parametrize("writer", sorted(REAL_WRITERS))
@pytest.mark.parametrize("charset", ["utf-8", "utf-16-le", "utf-16-be"])
def test_what_real_escapers_write(writer: str, charset: str) -> None:
    for token in TOKENS:
        form = REAL_WRITERS[writer](token)
        body = f'{{"error": "invalid token {form}", "n": 1}}'.encode(charset)
        out = Redactor([token]).redact(body)
        assert out == f'{{"error": "invalid token {REDACTED.decode()}", "n": 1}}'.encode(charset), (form, out)


@pytest.mark.parametrize("serialiser", sorted(SERIALISERS))
def test_base64_of_each_serialised_form_at_every_alignment(serialiser: str) -> None:
    """A JWT or a base64 blob of JSON or HTML carries the serialised value: found at any offset."""
    for token in TOKENS:
        for prefix in ("", "x", "xy"):
            payload = f'{prefix}{{"sub": "{SERIALISERS[serialiser](token)}"}}'.encode()
            for encode in (base64.b64encode, base64.urlsafe_b64encode):
                blob = encode(payload).rstrip(b"=")
                out = Redactor([token]).redact(b"eyJhbGciOi." + blob + b".sig")
                assert REDACTED in out and blob not in out, (serialiser, token, prefix)


def test_an_escaped_secret_in_a_www_authenticate_header() -> None:
    token = "sk/live+A1b2C3d4="
    r = Redactor([token])
    for form in (html.escape(token), go_json(token), "".join(f"&#x{ord(c):x};" for c in token)):
        value = f'Bearer realm="api", error="invalid_token", error_description="bad {form}"'
        assert (
            r.redact_text(value)
            == 'Bearer realm="api", error="invalid_token", error_description="bad [REDACTED]"'
        )


# -- early release (rule 7): prompt for ordinary text, never before a form could be complete ----


def test_text_ending_in_a_complete_escape_is_released_at_once() -> None:
    r = Redactor(["sk-live-5e2f9a0c7d1b"])
    for event in (b'data: {"delta": "line\\n"}\n\n', b"<p>a &amp; b</p>\n", b"q=a%20b\n"):
        assert r.stream().feed(event) == event, event


@pytest.mark.parametrize(
    "tail", [b"sk-", b"x &#", b"x &#x7", b"x \\u00", b"x %2", b"x &amp", b"x \\", b"x sk&#x2D;li"]
)
def test_text_ending_where_a_form_or_an_escape_may_begin_is_held(tail: bytes) -> None:
    r = Redactor(["sk-live-5e2f9a0c7d1b"])
    stream = r.stream()
    assert stream.feed(b"data: " + tail) == b""
    assert stream.flush() == b"data: " + tail  # the end: nothing lost


@settings(max_examples=examples(300), deadline=None)
@given(
    secret=SECRETS,
    picks=PICKS,
    before=st.binary(max_size=30),
    cut=st.integers(0, 400),
    charset=st.sampled_from(["utf-8", "utf-16-le", "utf-16-be"]),
)
def test_no_byte_of_an_escaped_form_is_released_before_the_form_is_complete(
    secret: str, picks: list[tuple[int, int]], before: bytes, cut: int, charset: str
) -> None:
    """Fed up to any point inside an escaped form, the stream releases nothing of the form.
    (A UTF-16 body has its characters at even offsets: what comes before is too.)"""
    form = escape_some(secret, picks).encode(charset)
    if charset != "utf-8":
        before = before[: len(before) // 2 * 2]
    r = Redactor([secret])
    cut = min(cut, len(form) - 1)
    released = r.stream().feed(before + form[:cut])
    assert len(released) <= len(before)


# -- text beside the secret that completes an escape with it -------------------------------------

# What a sandbox can have an origin write next to the secret (a reflected query parameter): the
# pieces escapes are made of, so that its end and the secret's start read as one escape
# (`%` + `ab12...` is `\xab` + `12...`), or the secret's end and its start (`...%` + `41`).
BESIDE = st.text(alphabet="%&#;\\xXuU{}0123456789abcdefABCDEF: ", max_size=10)
TOKEN_LIKE = st.text(
    alphabet=st.sampled_from("0123456789abcdefABCDEFghijkxyzGHXYZ/+=-_.~é%&\\;}"), min_size=10, max_size=32
).filter(lambda s: len(set(s)) > 4)


def decoded_views(text: str) -> list[str]:
    """`text` and each level of it as a reader would unescape it (the standard library's own
    decoders, one family at a time and each level of any two)."""
    readers = [
        lambda t: t,
        lambda t: json.loads(f'"{t}"') if _json_string(t) else t,
        lambda t: html.unescape(t),
        lambda t: unquote(t),
    ]
    return list({second(first(text)) for first, second in itertools.product(readers, repeat=2)})


def _json_string(text: str) -> bool:
    try:
        json.loads(f'"{text}"')
    except ValueError:
        return False
    return True


@settings(max_examples=examples(500), deadline=None)
@given(
    secret=TOKEN_LIKE,
    writer=st.sampled_from(sorted(REAL_WRITERS)),
    charset=st.sampled_from(["utf-8", "utf-16-le", "utf-16-be"]),
    before=BESIDE,
    after=BESIDE,
    cuts=st.lists(st.integers(0, 1200), max_size=4),
)
def test_text_beside_the_secret_cannot_merge_with_it_into_an_escape(
    secret: str, writer: str, charset: str, before: str, after: str, cuts: list[int]
) -> None:
    """A real writer writes what a sandbox chose around the secret, and the secret: whatever ends
    or starts next to it, no reader's unescaping of the output shows the secret's middle (its
    ends may be taken into the escape they merged with, and are redacted with it)."""
    middle = secret[3:-3]
    assume(not any(middle in view for view in decoded_views(f"{before}\n{after}")))  # not the writer's
    # Two levels of escaping, a writer's two, or one and the secret's own (docs/vault.md's limits)
    assume(writer not in TWO_LEVELS or decoded_views(secret) == [secret])
    data = REAL_WRITERS[writer](before + secret + after).encode(charset)
    r = Redactor([secret])
    out = r.redact(data)
    for view in decoded_views(out.decode(charset, "surrogateescape" if charset == "utf-8" else "strict")):
        assert middle not in view, (data, out, view)
    assert chunked(r, data, cuts) == out


@pytest.mark.parametrize(
    ("secret", "written", "redacted"),
    [
        # PHP's json_encode writes `/` as `\/`: `%ab` is one escape, and no reading shows `ab12/...`
        ("ab12/cd34+efgh5678", '{"q": "%ab12\\/cd34+efgh5678"}', '{"q": "[REDACTED]"}'),
        # Go's html/template writes `+` as `&#43;`
        ("ab12/cd34+efgh5678", "<p>%ab12/cd34&#43;efgh5678</p>", "<p>[REDACTED]</p>"),
        # a secret that ends in `%`, written with `\u002d` for `-`, and `41` after it
        ("sk-live-abc%", '{"a": "sk\\u002dlive\\u002dabc%41"}', '{"a": "[REDACTED]"}'),
        # `&#x` before a secret that starts `41;`
        ("41;token-é-value", '{"a": "&#x41;token-\\u00e9-value"}', '{"a": "[REDACTED]"}'),
        # `\u{41` before a secret that starts `}`, in HTML (where `\` is not escaped)
        ("}ab+cdef-0123", "<p>\\u{41}ab&#43;cdef-0123</p>", "<p>[REDACTED]</p>"),
    ],
)
def test_an_escape_begun_beside_the_secret_is_redacted_with_it(
    secret: str, written: str, redacted: str
) -> None:
    r = Redactor([secret])
    assert r.redact(written.encode()) == redacted.encode()
    in_utf16 = r.redact(written.encode("utf-16-le")).decode("utf-16-le")  # `%ab` is no character there
    assert "[REDACTED]" in in_utf16 and secret[3:-3] not in html.unescape(unquote(in_utf16))
    assert chunked(r, written.encode(), list(range(len(written)))) == redacted.encode()


@pytest.mark.parametrize("charset", ["utf-16-le", "utf-16-be"])
def test_a_utf8_lead_at_the_end_of_a_secret_merges_with_what_follows_in_utf16(charset: str) -> None:
    """In UTF-16 `%C3` alone is no escape, but `%C3%A9` is `é`: a secret that ends in `%C3`, with
    `%A9` written after it, reads as `...é` there."""
    written = "<p>tok&#43;en-1234%C3%A9</p>"
    out = Redactor(["tok+en-1234%C3"]).redact(written.encode(charset))
    assert out.decode(charset) == "<p>[REDACTED]</p>"
