"""The forms a secret value takes on the way back to a sandbox, and their generator.

Rules:
1. The closed world is every encoding a mainstream server, serialiser or template engine writes a
   value in, combined with the codings the proxy undoes before the redactor sees a body
   (compression, chunking) and the charsets it reads (UTF-8 and ASCII-compatible, UTF-16).
   It has two halves, each owned by one module:
   - per-character escapes (JSON, JavaScript, percent, HTML/XML references): any character may be
     escaped or not, so a value has exponentially many such forms. They are not enumerated: the
     redactor decodes them out of the data (`sandgate.vault.escapes`), up to ESCAPE_DEPTH levels
     (an escape of an escape: `&amp;#43;`, JSON inside a JSON string);
   - whole-value encodings, which no per-character decoder undoes, are enumerated here as the
     automaton's patterns (`normal_forms`): the value itself (always, however short); for
     `user:pass` or base64(`user:pass`) the pair and the password; `+` for space (HTML forms);
     base64 and base64url at every byte alignment of the value and of each of its serialisations
     in `SERIALISERS` (a JWT or a base64 blob of JSON carries the JSON-escaped value); a value
     that holds escape syntax itself (`0000\\%00`) also as the decoder reads it in each
     charset, each level (`_decoded_readings`: in UTF-8 `%80` is a lone byte, in UTF-16 no
     escape); each in UTF-8 and in UTF-16 LE and BE.
2. `SERIALISERS` is a table of what real writers do to a whole string (Go's encoding/json escapes
   `<>&` as `\\u003c\\u003e\\u0026`, Go's html/template writes `+` as `&#43;`, Handlebars `=` as
   `&#x3D;`...). Its rows feed the base64 forms, and `serialised_forms` (the published examples
   tests check against); the escape decoder covers every row's escapes by construction.
3. A derived form shorter than MIN_DERIVED_LENGTH is dropped (it would blank ordinary text).
4. `span_bound`: how many bytes of data a form can take once escaped (ESCAPE_DEPTH levels), so a
   stream holds back enough to see a whole escaped form.
5. Cores (`boundary_forms`): text written next to a value can make one escape with its ends,
   which the decoder then reads as one character: a sandbox has `%` reflected before `ab12...`
   (`%ab` is a byte), or `41` after a value that ends in `%`. Each text the value is matched as
   (the value, its password part, its readings) is also a pattern without each start that
   may end an escape (`escapes.is_escape_tail`: hex digits, `u0041`, `#x41;`, `amp;`, `n` ...)
   and without each end that may begin or extend one (`escapes.is_escape_head`: `%`, `\\u00`, a
   high surrogate, in UTF-16 a UTF-8 lead `%C3`), each combination of the two, in the charset
   of its reading (in UTF-16 `%01` is an escape, `%80` none); the redactor extends a core's
   match over the escape it merged into (redact.py rule 8).
"""

from __future__ import annotations

import base64
import html
import itertools
import json
import re
from collections.abc import Callable
from functools import cache
from urllib.parse import quote

from sandgate.vault.escapes import (
    LEADS,
    LONGEST_ESCAPE,
    LONGEST_ESCAPE_OF_ESCAPE_CHARACTER,
    LONGEST_ESCAPE_TAIL,
    decoded_view,
    is_escape_head,
    is_escape_tail,
    longest_escape,
)

MIN_DERIVED_LENGTH = 6
ESCAPE_DEPTH = 2
LEAD_CHARACTERS = "".join(lead.decode() for lead in LEADS)
UTF16 = ("utf-16-le", "utf-16-be")
CHARSETS = ("utf-8", *UTF16)
# Characters URL encoders commonly leave as they are: none, `/` (Python's quote default), the
# URI reserved set (a whole URL quoted at once), and JavaScript's encodeURIComponent / encodeURI.
URL_SAFE_SETS = ("", "/", ":/?#[]@!$&'()*+,;=", "!'()*", ";,/?:@&=+$#!'()*")


def _replace(table: dict[str, str]) -> Callable[[str], str]:
    translation = str.maketrans(table)
    return lambda text: text.translate(translation)


def _json(text: str, ascii_only: bool = True) -> str:
    return json.dumps(text, ensure_ascii=ascii_only)[1:-1]


_GO_JSON = _replace(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)

SERIALISERS: dict[str, Callable[[str], str]] = {
    "JSON, ASCII only (Python json, Java Jackson with ASCII escaping)": _json,
    "JSON, UTF-8 (JavaScript JSON.stringify, Python ensure_ascii=False)": lambda t: _json(t, False),
    "JSON with `\\/` (PHP json_encode)": lambda t: _json(t).replace("/", "\\/"),
    "Go encoding/json (`<>&` and U+2028/9 as \\u escapes)": lambda t: _GO_JSON(_json(t, False)),
    "HTML, Python html.escape": html.escape,
    "HTML, Jinja2/MarkupSafe": _replace({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&#34;", "'": "&#39;"}),
    "HTML, Go html/template": _replace(
        {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&#34;", "'": "&#39;", "+": "&#43;", "\0": "\ufffd"}
    ),
    "HTML, Handlebars/lodash/OWASP": _replace(
        {
            "&": "&amp;",
            "<": "&lt;",
            ">": "&gt;",
            '"': "&quot;",
            "'": "&#x27;",
            "`": "&#x60;",
            "=": "&#x3D;",
            "/": "&#x2F;",
        }
    ),
    "XML (ElementTree, lxml)": _replace({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}),
    "HTML form (`+` for space)": lambda t: t.replace(" ", "+"),
    **{
        f"URL, safe {safe or 'none'!r}, {case} hex": (
            lambda t, safe=safe, case=case: _percent(t, safe, case)  # type: ignore[misc]
        )
        for safe in URL_SAFE_SETS
        for case in ("upper", "lower")
    },
}


def _percent(text: str, safe: str, case: str) -> str:
    encoded = quote(text, safe=safe)
    return re.sub("%[0-9A-F]{2}", lambda m: m.group().lower(), encoded) if case == "lower" else encoded


def normal_forms(value: str) -> dict[bytes, str]:
    """The automaton's patterns for `value` (rule 1's second half) -> the charset of each."""
    if not value:
        return {}
    raw = value.encode()
    texts = {value, *_password_parts(value)}
    utf8 = {raw} | {text.replace(" ", "+").encode() for text in texts}
    serialised = {serialise(text) for text in texts for serialise in SERIALISERS.values()} | texts
    for text in serialised:  # most serialisers leave a token as it is: each distinct text once
        utf8 |= _base64_cores(text.encode())
    forms = {form.decode().encode(utf16, "surrogatepass"): utf16 for form in utf8 for utf16 in UTF16}
    forms.update(dict.fromkeys(utf8, "utf-8"))
    forms.update(
        {encoded(text, charset): charset for one in texts for text, charset in _decoded_readings(one)}
    )
    return {form: cs for form, cs in forms.items() if form == raw or len(form) >= MIN_DERIVED_LENGTH}


def _decoded_readings(text: str) -> set[tuple[str, str]]:
    """A value that holds escape syntax itself (`0000\\%00`, `a&amp;b`) as the redactor's decoder
    reads it, in each charset, each level: (text, charset). The data around an escaped copy is
    decoded, `%00` in the value too, so only the decoded value can match there. In UTF-8 `%80`
    is a lone byte (kept as its surrogate escape); in UTF-16 it is no escape, but `%01` is one."""
    if not any(lead in text for lead in LEAD_CHARACTERS):
        return set()
    found: set[tuple[str, str]] = set()
    for charset in CHARSETS:
        data = encoded(text, charset)
        for _ in range(ESCAPE_DEPTH):
            decoded = decoded_view(data)
            if decoded is None:
                break
            data = decoded[0]
            found.add((form_text(data, charset), charset))
    return found


def encoded(text: str, charset: str) -> bytes:
    """`text` in `charset`; in UTF-8 a surrogate escape is the lone byte it stands for."""
    return text.encode(charset, "surrogateescape" if charset == "utf-8" else "surrogatepass")


def form_text(form: bytes, charset: str) -> str:
    """A form's characters: a lone byte of a UTF-8 form (a decoded `%80`) as its surrogate escape."""
    return form.decode(charset, "surrogateescape" if charset == "utf-8" else "surrogatepass")


def boundary_forms(value: str) -> dict[bytes, tuple[str, bool, bool]]:
    """The cores of `value` (rule 5) -> (charset, cut at the start, cut at the end)."""
    texts = {value, *_password_parts(value)}
    readings = {(text, charset) for text in texts for charset in CHARSETS}
    readings |= {reading for text in texts for reading in _decoded_readings(text)}
    forms: dict[bytes, tuple[str, bool, bool]] = {}
    for text, charset in readings:
        for start, end in _cuts(text):
            if end - start >= MIN_DERIVED_LENGTH:
                forms[encoded(text[start:end], charset)] = (charset, start > 0, end < len(text))
    return forms


def _cuts(text: str) -> list[tuple[int, int]]:
    """Where `text` may be cut for its cores: after each start that may end an escape begun
    before it, before each end that may begin one; every pair but the whole text."""
    longest = min(len(text) - 1, LONGEST_ESCAPE_TAIL)
    starts = [0, *(i for i in range(1, longest + 1) if is_escape_tail(_ascii(text[:i])))]
    ends = [len(text)]
    ends += [j for j, c in enumerate(text) if c in LEAD_CHARACTERS and is_escape_head(_ascii(text[j:]))]
    return [(start, end) for start, end in itertools.product(starts, ends) if (start, end) != (0, len(text))]


def _ascii(piece: str) -> bytes:
    """`piece` as the escape patterns read it (they match ASCII only; anything else stays other)."""
    return piece.encode("utf-8", "surrogatepass")


def serialised_forms(value: str) -> set[bytes]:
    """What each serialiser of `SERIALISERS` writes `value` as, in each charset, and the
    automaton's own forms: the published examples of the closed world (tests check them)."""
    texts = {value, *(serialise(value) for serialise in SERIALISERS.values())}
    out = {text.encode(charset, "surrogatepass") for text in texts for charset in CHARSETS}
    return out | set(normal_forms(value))


def span_bound(form: bytes, charset: str, cuts: int = 0) -> int:
    """The most bytes `form` can take in data once its characters are escaped ESCAPE_DEPTH levels,
    with the escape each of its `cuts` (a core's, rule 5) may take beside it."""
    width = 2 if charset in UTF16 else 1
    merged = width * LONGEST_ESCAPE * LONGEST_ESCAPE_OF_ESCAPE_CHARACTER ** (ESCAPE_DEPTH - 1)
    return sum(_character_bound(c, charset, ESCAPE_DEPTH) for c in form_text(form, charset)) + cuts * merged


@cache
def _character_bound(character: str, charset: str, depth: int) -> int:
    width = 2 if charset in UTF16 else 1
    per_level = LONGEST_ESCAPE_OF_ESCAPE_CHARACTER ** max(0, depth - 1)
    return max(len(character.encode(charset, "surrogatepass")), width * longest_escape(character) * per_level)


def _base64_cores(data: bytes) -> set[bytes]:
    """The base64 characters that encode only `data`, at each of the three byte alignments.

    At alignment k the value starts k bytes into a 3-byte group; a base64 character covers
    6 bits, and those that fall wholly inside the value's bits do not depend on its
    neighbours. Alignment 0 also yields the complete, padded encoding.
    """
    cores = {base64.b64encode(data), base64.urlsafe_b64encode(data)}
    for k in range(3):
        encoded = base64.b64encode(bytes(k) + data)
        first = -(-8 * k // 6)  # first character whose bits start inside the value
        last = (8 * (k + len(data))) // 6  # characters before this end inside the value
        core = encoded[first:last]
        cores |= {core, core.translate(_URLSAFE)}
    return cores


_URLSAFE = bytes.maketrans(b"+/", b"-_")


def _password_parts(value: str) -> set[str]:
    """For `user:pass` and base64(`user:pass`) values, also the decoded pair and the password."""
    parts: set[str] = set()
    candidates = [value]
    decoded = _decode_basic(value)
    if decoded is not None:
        parts.add(decoded)
        candidates.append(decoded)
    for candidate in candidates:
        _, colon, password = candidate.partition(":")
        if colon and len(password) >= MIN_DERIVED_LENGTH:
            parts.add(password)
    return parts


def _decode_basic(value: str) -> str | None:
    """`user:pass` if `value` is base64 of a printable `user:pass`, else None."""
    try:
        text = base64.b64decode(value, validate=True).decode()
    except ValueError:
        return None
    return text if ":" in text and text.isprintable() else None
