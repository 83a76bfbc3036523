"""The two ways `decoded_view` decodes a body agree: the `re.split` path it takes for bodies
without a zero byte (vault/escapes.py `_decoded_view_utf8`, the fast one) and the match loop it
takes for the others (`_decoded_view_loop`, which reads UTF-16 escapes too), on the same bodies,
byte for byte and offset for offset, with the full pattern and with a redactor's restricted one."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from sandgate.vault import escapes
from tests.support.tiers import examples

# Escapes of every syntax, ones that decode to nothing (a lone surrogate, an unknown name, a code
# point past U+10FFFF), and near-misses that are no escape (no `;`, too few digits).
ESCAPE_LIKE = [
    "&amp;",
    "&AMP;",
    "&sol;",
    "&plus;",
    "&#x41;",
    "&#X0000002f;",
    "&#65;",
    "&#0000043;",
    "&#xD800;",
    "&#55296;",
    "&#x110000;",
    "&nosuchname;",
    "&amp",
    "&#65",
    "\\u0041",
    "\\u00e9",
    "\\ud83d\\ude00",
    "\\ud83d",
    "\\u{1F600}",
    "\\u{110000}",
    "\\x41",
    "\\n",
    "\\\\",
    '\\"',
    "\\/",
    "\\u12",
    "%41",
    "%2f",
    "%u0041",
    "%uD800",
    "%C3%A9",
    "%4",
    "&#x26;amp;",
    "\\u0026amp;",
    "%25%34%31",
]
TEXT = st.characters(codec="utf-8", exclude_characters="\0")
PIECES = st.one_of(
    st.sampled_from(ESCAPE_LIKE).map(str.encode),
    st.text(TEXT, max_size=8).map(str.encode),
    st.binary(max_size=6).map(lambda raw: raw.replace(b"\0", b"")),
)
BODIES = st.lists(PIECES, max_size=24).map(b"".join)
RESTRICTED = st.frozensets(st.sampled_from(sorted("&#;%\\uxAaé/+\"'\n")), max_size=6).map(escapes.pattern_for)


@settings(max_examples=examples(2000), deadline=None)
@given(body=BODIES, pattern=st.none() | RESTRICTED)
def test_the_split_path_and_the_loop_decode_alike(body: bytes, pattern: re.Pattern[bytes] | None) -> None:
    chosen = pattern or escapes._PATTERN
    assert escapes._decoded_view_utf8(body, chosen) == escapes._decoded_view_loop(body, 0, chosen)
