"""The response scrubber alone: streamed output equals whole-body redaction for any chunking,
text that cannot begin a secret is released at once, and headers are scrubbed in place."""

from __future__ import annotations

import base64
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st
from mitmproxy.http import Headers

from sandgate.proxy.scrubbing import Scrubber
from sandgate.vault import secret_forms

SECRET = "sk-live-5e2f9a0c7d1b"
SCRUBBER = Scrubber([SECRET, "user:pa55word-xyz"])
SECRET_FORMS = [SECRET.encode(), base64.b64encode(SECRET.encode()), b"pa55word-xyz"]


def streamed(chunks: list[bytes]) -> tuple[bytes, list[bytes]]:
    body = SCRUBBER.body()
    outputs = [b"".join(body(chunk)) for chunk in chunks]
    return b"".join(outputs) + b"".join(body(b"")), outputs


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(
        st.one_of(
            st.sampled_from(SECRET_FORMS), st.binary(max_size=12), st.sampled_from([b"sk-", b"c2st", b"\n"])
        ),
        max_size=12,
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8),
)
def test_any_chunking_gives_the_whole_body_redaction(parts: list[bytes], cuts: list[int]) -> None:
    whole = b"".join(parts)
    bounds = sorted({0, len(whole), *(min(c, len(whole)) for c in cuts)})
    chunks = [whole[a:b] for a, b in itertools.pairwise(bounds)]
    out, _ = streamed(chunks)
    assert out == SCRUBBER.redactor.redact(whole)
    for form in SECRET_FORMS:
        assert form not in out


def test_text_that_cannot_begin_a_secret_is_released_at_once() -> None:
    event = b"id: 0\ndata: event 0\n\n"
    _, outputs = streamed([event, b"data: tail sk-", b"live-5e2f9a0c7d1b done\n"])
    assert outputs[0] == event  # nothing held back: an SSE event ends in bytes no secret starts with
    assert outputs[1] == b""  # "sk-" may be the start of the secret: held back
    assert outputs[2] == b"data: tail [REDACTED] done\n"  # released as soon as it cannot be


def test_empty_output_is_no_chunk_at_all() -> None:
    body = SCRUBBER.body()
    assert body(b"sk-li") == []  # an empty chunk would end an HTTP/1 chunked body early


def test_headers_are_scrubbed_in_place() -> None:
    headers = Headers(x_reflected=f"Bearer {SECRET}", server="origin")
    headers.add("set-cookie", f"t={SECRET}")
    headers.add("set-cookie", "other=1")
    SCRUBBER.headers(headers)
    assert headers["x-reflected"] == "Bearer [REDACTED]" and headers["server"] == "origin"
    assert headers.get_all("set-cookie") == ["t=[REDACTED]", "other=1"]


def test_early_release_knows_exactly_the_redactors_forms() -> None:
    # Early release is sound only for the forms the vault's redactor looks for (see scrubbing.py).
    assert SCRUBBER.may_continue(b"\n\n") is False
    assert SCRUBBER.redactor.pattern_count == len(
        {form for value in (SECRET, "user:pa55word-xyz") for form in secret_forms(value)}
    )
