"""Scrubbing as a closed world (issue 15): a hostile origin reflects the sandbox's credential
through every channel it has, and nothing of it reaches the sandbox.

The origin is `reflector.py` in a namespace of this module's own (192.0.2.20, reached over a
veth; names `reflect.example.com` and `leak.example.com`). The victim sandbox is created through
the API like the attacker (conftest), with its own credential bound to `reflect.example.com`
(so the reflector echoes what the proxy injected) and `leak.example.com` intercepted but not
bound (the reflector echoes a value it "got elsewhere", the secret file the test writes).
Each case is proven from the reflector's log (what the proxy sent upstream: the credential
injected, Range gone, identity asked) and from `scrub_client.py`'s output inside the sandbox
(everything the client got, decoded as a real client decodes it), checked by `leaks`, which
knows the forms independently of the redactor.
"""

from __future__ import annotations

import base64
import html
import json
import re
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus, unquote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opensandbox import SandboxSync
from opensandbox.models.execd import RunCommandOpts
from opensandbox.models.sandboxes import CredentialProxyConfig, NetworkPolicy, NetworkRule

from tests.adversarial.conftest import (
    SANDBOX_IMAGE,
    SANDBOX_LIFETIME,
    SANDBOX_PYTHON,
    ZONE,
    connection,
    reach_from_the_node,
)
from tests.adversarial.reflector import CHARSETS, FORMS
from tests.support.internet import Internet
from tests.support.netns import Netns, ip, unique
from tests.support.server import SANDGATE, SandgateServer

pytestmark = pytest.mark.root

REFLECT_HOST = "reflect.example.com"  # credential bound: the proxy injects, the origin echoes it
LEAK_HOST = "leak.example.com"  # intercepted, nothing injected: the origin leaks a value it has
REFLECTOR_V4 = "192.0.2.20"
SECRET = f"sk/scrub+{secrets.token_hex(10)}="  # `/`, `+`, `=`: URL and JSON forms differ from raw
GLOBAL_NAME = "scrub-global"  # a deployment vault entry (`sandgate vault put`), bound by the policy
CLIENT = Path(__file__).with_name("scrub_client.py")
REFLECTOR = Path(__file__).with_name("reflector.py")
IN_SANDBOX_CLIENT = "/workspace/scrub_client.py"
REDACTED = "[REDACTED]"


def unescaped(text: str) -> str:
    """`text` read as a client reads it, twice over: HTML references (html.unescape), JSON and
    JavaScript \\u escapes, `\\/`, percent-encoding (urllib's unquote). Independent of the vault's
    decoder; what it finds in a scrubbed answer is a leak."""
    for _ in range(2):
        text = text.replace("\\\\", "\\").replace('\\"', '"')  # JSON's own (and `everything`'s)
        text = html.unescape(text)
        text = re.sub(r"\\u([0-9a-fA-F]{4})", lambda m: chr(int(m.group(1), 16)), text).replace("\\/", "/")
        text = unquote(text)
    return text


def leaks(secret: str, received: str | bytes) -> str | None:
    """The form of `secret` found in what a client received, or None. Independent of the
    redactor: raw, JSON (with `\\/`), URL-encoded with any common safe set, base64 of `user:`
    + secret at its stable middle, a long middle slice, each in UTF-8 and UTF-16 LE/BE; and the
    secret in the received text once its escapes are undone (`unescaped`, for each charset)."""
    data = received.encode("latin-1") if isinstance(received, str) else received
    for charset in ("utf-8", "utf-16-le", "utf-16-be"):
        if secret in unescaped(data.decode(charset, "replace")) or secret in unescaped(
            data[1:].decode(charset, "replace")
        ):
            return f"{secret!r} once its escapes are undone, in {charset}"
    texts = {secret, json.dumps(secret)[1:-1], json.dumps(secret)[1:-1].replace("/", "\\/"), secret[3:-3]}
    for safe in ("", "/", ":/?#[]@!$&'()*+,;="):
        texts |= {quote(secret, safe=safe), quote_plus(secret, safe=safe)}
    for pad in range(3):
        encoded = base64.b64encode(b"\0" * pad + secret.encode()).decode()
        texts.add(encoded[4 : len(encoded) - 4])
    for form in sorted(texts):
        for charset in ("utf-8", "utf-16-le", "utf-16-be"):
            if form.encode(charset) in data:
                return f"{form!r} in {charset}"
    return None


def everything(result: dict[str, Any]) -> str:
    """Every string a result holds (heads, trailers, raw bytes, bodies, messages), as latin-1."""
    return json.dumps(result, ensure_ascii=False)


# ------------------------------------------------------------------------------ the reflector


@dataclass
class Reflector:
    workdir: Path
    process: subprocess.Popen[bytes]

    def leak(self, value: str) -> None:
        """What the origin reflects when the proxy injected nothing."""
        (self.workdir / "secret.txt").write_text(value)

    def requests(self) -> list[dict[str, Any]]:
        path = self.workdir / "requests.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def reflector(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, internet: Internet
) -> Iterator[Reflector]:
    workdir = tmp_path_factory.mktemp("reflector")
    for name in ("leaf.pem", "leaf-key.pem"):
        shutil.copy(internet.workdir / name, workdir / name)
    (workdir / "secret.txt").write_text("nothing yet")
    ns = Netns("sgr")
    host_if = unique("tvr")
    process = None
    try:
        ip("link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns.name)
        ip("addr", "add", "192.0.2.1/24", "dev", host_if)
        ip("link", "set", host_if, "up")
        ip("addr", "add", f"{REFLECTOR_V4}/24", "dev", "eth0", netns=ns.name)
        ip("link", "set", "eth0", "up", netns=ns.name)
        reach_from_the_node(request, ns.name, "192.0.2.1", REFLECTOR_V4)
        log = (workdir / "reflector.log").open("wb")
        process = ns.popen(
            [sys.executable, str(REFLECTOR), str(workdir), REFLECTOR_V4], stdout=log, stderr=log
        )
        deadline = time.monotonic() + 15
        while not (workdir / "ready").exists():
            assert process.poll() is None and time.monotonic() < deadline, (
                workdir / "reflector.log"
            ).read_text()
            time.sleep(0.05)
        internet.set_names({**ZONE, REFLECT_HOST: [REFLECTOR_V4], LEAK_HOST: [REFLECTOR_V4]})
        yield Reflector(workdir, process)
    finally:
        internet.set_names(ZONE)
        if process is not None:
            process.kill()
            process.wait(5)
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
        ns.delete()


# ------------------------------------------------------------------------------ the victim


@dataclass
class Victim:
    sandbox: SandboxSync
    server: SandgateServer

    def fetch(self, *requests: dict[str, Any]) -> list[dict[str, Any]]:
        """Run the requests inside the sandbox; fails on any form of SECRET in what it printed."""
        args = json.dumps(list(requests)).replace("'", "'\\''")
        execution = self.sandbox.commands.run(
            f"{SANDBOX_PYTHON} {IN_SANDBOX_CLIENT} '{args}'",
            opts=RunCommandOpts(timeout=timedelta(seconds=90)),
        )
        stdout = "".join(m.text for m in execution.logs.stdout)
        stderr = "".join(m.text for m in execution.logs.stderr)
        assert execution.exit_code == 0, stderr
        results: list[dict[str, Any]] = json.loads(stdout.strip().splitlines()[-1])
        for result in results:
            leak = leaks(SECRET, everything(result))
            assert leak is None, f"the credential ({leak}) reached the sandbox: {result}"
        return results

    def audit_text(self, *needles: str, timeout: float = 15.0) -> str:
        """The server's audit files, once they hold every one of `needles` (bounded): a node's
        records arrive through the shipper, a poll after the node wrote them."""
        deadline = time.monotonic() + timeout
        while True:
            text = "".join(p.read_text() for p in sorted(self.server.state_dir.glob("audit.jsonl*")))
            if all(needle in text for needle in needles) or time.monotonic() > deadline:
                return text
            time.sleep(0.1)


@pytest.fixture(scope="module")
def victim(server: SandgateServer, reflector: Reflector) -> Iterator[Victim]:
    sandbox = SandboxSync.create(
        SANDBOX_IMAGE,
        entrypoint=["sleep", "infinity"],
        network_policy=NetworkPolicy(
            defaultAction="deny",
            egress=[NetworkRule(action="allow", target=host) for host in (REFLECT_HOST, LEAK_HOST)],
        ),
        credential_proxy=CredentialProxyConfig(enabled=True),
        connection_config=connection(server),
        timeout=SANDBOX_LIFETIME,
        ready_timeout=timedelta(seconds=30),
    )
    try:
        sandbox.credential_vault.create(
            credentials=[{"name": "reflected", "source": {"type": "inline", "value": SECRET}}],
            bindings=[
                {
                    "name": "reflect",
                    "match": {"hosts": [REFLECT_HOST]},
                    "auth": {"type": "bearer", "credential": "reflected"},
                }
            ],
        )
        policy = {
            "version": 1,
            "defaultAction": "deny",
            "egress": [
                {"action": "allow", "target": REFLECT_HOST},
                {"action": "allow", "target": LEAK_HOST, "inspect": "always"},
            ],
            "bindings": [  # names the deployment vault entry; matches no request of these tests
                {
                    "name": "global",
                    "credential": GLOBAL_NAME,
                    "match": {"hosts": [LEAK_HOST], "paths": ["/never"]},
                    "auth": {"type": "bearer"},
                }
            ],
        }
        with server.client() as client:
            answer = client.put(f"/v1/sandboxes/{sandbox.id}/egress/sandgate-policy", json={"policy": policy})
            assert answer.status_code == 200, answer.text
        sandbox.files.write_file(IN_SANDBOX_CLIENT, CLIENT.read_text())
        yield Victim(sandbox, server)
    finally:
        sandbox.kill()
        sandbox.close()


def h1(host: str, path: str, **extra: Any) -> dict[str, Any]:
    return {"kind": "h1", "host": host, "path": path, **extra}


def h2(host: str, path: str, **extra: Any) -> dict[str, Any]:
    return {"kind": "h2", "host": host, "path": path, **extra}


# ------------------------------------------------------------------------------ bodies


CODINGS = ["identity", "gzip", "deflate", "br", "zstd", "gzip,br"]


@pytest.mark.parametrize("kind", ["h1", "h2"])
def test_every_content_coding_is_decoded_scrubbed_and_sent_decoded(
    victim: Victim, reflector: Reflector, kind: str
) -> None:
    mark = len(reflector.requests())
    requests = [{"kind": kind, "host": REFLECT_HOST, "path": f"/body?coding={coding}"} for coding in CODINGS]
    results = victim.fetch(*requests)
    for coding, result in zip(CODINGS, results, strict=True):
        assert result.get("status") == 200, result
        assert json.loads(result["body"])["echo"] == REDACTED, result  # whole, decoded, scrubbed
        names = {name.lower() for name, _ in result["headers"]}
        assert "content-encoding" not in names, (coding, result["headers"])
    seen = reflector.requests()[mark:]
    assert len(seen) == len(CODINGS)
    for request in seen:  # positive control: injected; and the proxy asked for identity
        assert request["source"] == "injected" and request["headers"]["authorization"] == f"Bearer {SECRET}"
        assert request["headers"]["accept-encoding"] == "identity"


@pytest.mark.parametrize("kind", ["h1", "h2"])
def test_forms_and_utf16_bodies_are_scrubbed(victim: Victim, kind: str) -> None:
    cases = [(form, charset) for form in FORMS for charset in ("utf-8",)]
    cases += [(form, charset) for form in ("raw", "json", "jsonslash") for charset in CHARSETS[1:]]
    requests = [
        {
            "kind": kind,
            "host": REFLECT_HOST,
            "path": f"/body?form={form}&charset={charset}&ctype=text/plain&declare=1",
        }
        for form, charset in cases
    ]
    for (form, charset), result in zip(cases, victim.fetch(*requests), strict=True):
        assert result.get("status") == 200, result
        body = result["body"].encode("latin-1").decode(charset)
        assert REDACTED in body and FORMS[form](SECRET) not in body, (form, charset, body)


@pytest.mark.parametrize("kind", ["h1", "h2"])
def test_a_coding_or_charset_the_proxy_cannot_read_is_refused_with_its_own_502(
    victim: Victim, kind: str
) -> None:
    results = victim.fetch(
        {"kind": kind, "host": REFLECT_HOST, "path": "/body?coding=compress"},
        {"kind": kind, "host": REFLECT_HOST, "path": "/body?charset=utf-32&declare=1&ctype=text/plain"},
    )
    for result in results:
        assert result.get("status") == 502, result
        assert json.loads(result["body"])["reason"] == "response-refused", result
    needles = ("response-refused: content-encoding compress", "charset 'utf-32'")
    audit = victim.audit_text(*needles)
    assert all(needle in audit for needle in needles)


@pytest.mark.parametrize("kind", ["h1", "h2"])
def test_range_requests_never_reassemble_a_secret(victim: Victim, reflector: Reflector, kind: str) -> None:
    """Six 12-byte pieces, each shorter than the secret: the proxy strips Range, the origin
    answers whole, and the whole answer is scrubbed."""
    mark = len(reflector.requests())
    pieces = [f"{start}-{start + 11}" for start in range(0, 72, 12)]
    results = victim.fetch(
        *({"kind": kind, "host": REFLECT_HOST, "path": "/range", "range": p} for p in pieces)
    )
    for result in results:
        assert result.get("status") == 200 and REDACTED in result["body"], result
    assert leaks(SECRET, "".join(r["body"] for r in results)) is None
    seen = reflector.requests()[mark:]
    assert len(seen) == 6 and not any("range" in r["headers"] or "if-range" in r["headers"] for r in seen)


def assert_replaced(form: str, text: str) -> None:
    """The echo was replaced where it stood (a JWT keeps the base64 of its own bytes around it)."""
    assert REDACTED in text and FORMS[form](SECRET) not in text, (form, text)
    if form != "jwt":
        assert f"{REDACTED} rejected" in text or text == REDACTED, (form, text)


ECHO_FORMS = ["gojson", "gohtml", "handlebars", "htmldecimal", "jsonu", "jsonofhtml", "jwt"]


@pytest.mark.parametrize("kind", ["h1", "h2"])
def test_what_real_servers_and_template_engines_write_is_scrubbed(
    victim: Victim, reflector: Reflector, kind: str
) -> None:
    """Issue 27: the injected credential echoed as Go's encoding/json, Go's html/template,
    Handlebars, decimal references, all-\\u JSON, JSON of HTML and a JWT-style base64url of JSON
    write it, in a UTF-8 and a UTF-16 body and in a 401's WWW-Authenticate header: none of it
    reaches the sandbox (`fetch` checks every result with `leaks`, which undoes the escapes with
    the standard library's own decoders), and each echo was replaced where it stood."""
    mark = len(reflector.requests())
    requests = [
        *(h1(REFLECT_HOST, f"/body?form={form}&ctype=text/html") | {"kind": kind} for form in ECHO_FORMS),
        *(
            h1(REFLECT_HOST, f"/body?form={form}&charset=utf-16-le&declare=1&ctype=text/plain")
            | {"kind": kind}
            for form in ECHO_FORMS
        ),
        *(h1(REFLECT_HOST, f"/wwwauth?form={form}") | {"kind": kind} for form in ECHO_FORMS),
    ]
    results = victim.fetch(*requests)
    count = len(ECHO_FORMS)
    for form, result in zip(ECHO_FORMS, results[:count], strict=True):
        assert result.get("status") == 200, (form, result)
        assert_replaced(form, json.loads(result["body"])["echo"])
    for form, result in zip(ECHO_FORMS, results[count : 2 * count], strict=True):
        assert_replaced(form, json.loads(result["body"].encode("latin-1").decode("utf-16-le"))["echo"])
    for form, result in zip(ECHO_FORMS, results[2 * count :], strict=True):
        [challenge] = [v for k, v in result["headers"] if k.lower() == "www-authenticate"]
        assert result.get("status") == 401 and challenge.startswith('Bearer realm="api"'), (form, result)
        assert_replaced(form, challenge)
    seen = reflector.requests()[mark:]  # positive control: every one was injected and echoed it
    assert len(seen) == len(requests) and all(r["source"] == "injected" for r in seen)


# ------------------------------------------------------------------------------ heads


@pytest.mark.parametrize("kind", ["h1", "h2"])
def test_reason_phrase_header_names_and_trailers(victim: Victim, kind: str) -> None:
    reason, hname, trailer = victim.fetch(
        {"kind": kind, "host": REFLECT_HOST, "path": "/reason"},
        {"kind": kind, "host": REFLECT_HOST, "path": "/hname"},
        {"kind": kind, "host": REFLECT_HOST, "path": "/trailer"},
    )
    assert reason["status"] == 200 and reason["body"] == "ok\n", reason
    if kind == "h1":
        assert reason["reason"] == REDACTED, reason
    assert hname["status"] == 200 and ["x-ok", "yes"] in [[k.lower(), v] for k, v in hname["headers"]], hname
    assert trailer["status"] == 200 and trailer["body"] == "ok\n", trailer
    sent = [value for name, value in trailer["trailers"] if name.lower() == "x-t"]
    assert sent in ([], [REDACTED]), trailer  # scrubbed, or not forwarded at all


@pytest.mark.parametrize("kind", ["h1", "h2"])
@pytest.mark.parametrize("path", ["/badstatus", "/truncated"])
def test_proxy_made_error_pages_never_quote_upstream_bytes(victim: Victim, kind: str, path: str) -> None:
    before = len(victim.audit_text())
    [result] = victim.fetch({"kind": kind, "host": REFLECT_HOST, "path": path})
    assert result.get("status") == 502, result
    assert json.loads(result["body"]) == {
        "error": "upstream failed",
        "status": 502,
        "reason": "upstream-error",
    }
    deadline = time.monotonic() + 5
    field = f'"path":"{path}"'  # the proxy's request record (the command that asked names it too)
    while field not in victim.audit_text()[before:] and time.monotonic() < deadline:
        time.sleep(0.05)
    written = victim.audit_text()[before:]
    assert field in written and leaks(SECRET, written) is None  # the record's detail is redacted


def test_server_sent_events_stay_prompt_and_scrubbed(victim: Victim) -> None:
    [result] = victim.fetch(h1(REFLECT_HOST, "/sse?n=3&gap=0.8"))
    assert result["body"].count(f"data: {REDACTED}") == 3, result
    assert result["first_event"] is not None and result["first_event"] < 1.0, result  # not held to the end


# ------------------------------------------------------------------------------ WebSocket


@pytest.mark.parametrize("deflate", [False, True])
def test_websocket_messages_pings_and_close_reasons_are_scrubbed(
    victim: Victim, reflector: Reflector, deflate: bool
) -> None:
    mark = len(reflector.requests())
    [result] = victim.fetch({"kind": "ws", "host": REFLECT_HOST, "path": "/ws", "deflate": deflate})
    assert result["accepted"], result
    assert result["extensions"] == (["permessage-deflate"] if deflate else []), result
    assert result["messages"] == [f"text {REDACTED}", f"binary {REDACTED}", f"frag {REDACTED} end"], result
    assert result["pings"] == [f"p{REDACTED}"], result
    assert result["close"] == {"code": 1000, "reason": f"bye {REDACTED}"}, result
    [upgrade] = reflector.requests()[mark:]  # positive control: the upgrade was injected
    assert upgrade["source"] == "injected" and upgrade["headers"]["authorization"] == f"Bearer {SECRET}"


# ------------------------------------------------------------------------------ stored, not used


def test_a_value_is_scrubbed_right_after_vault_put(victim: Victim, reflector: Reflector) -> None:
    """`sandgate vault put` of an entry a binding names: another host reflecting the new value is
    scrubbed at once, before any request was ever injected with it."""
    value = f"gv-{secrets.token_hex(12)}"
    put = subprocess.run(
        [*SANDGATE, "vault", "put", GLOBAL_NAME], input=value, capture_output=True, text=True,
        env=victim.server.server_env(), timeout=60,
    )  # fmt: skip
    assert put.returncode == 0 and "warning" not in put.stderr, put.stderr
    reflector.leak(value)
    [result] = victim.fetch(h1(LEAK_HOST, "/body?form=raw"))
    assert result.get("status") == 200 and json.loads(result["body"])["echo"] == REDACTED, result
    assert leaks(value, everything(result)) is None


def set_fresh(victim: Victim, value: str) -> None:
    """Store (or rotate) the credential `fresh` through the credential-vault API; it is bound to a
    path no request here uses, so the proxy never injects it: it knows it only from the store."""
    vault = victim.sandbox.credential_vault
    credential = {"name": "fresh", "source": {"type": "inline", "value": value}}
    if any(c.name == "fresh" for c in vault.list_credentials()):
        vault.patch(credentials={"replace": [credential]})
        return
    binding = {
        "name": "fresh",
        "match": {"hosts": [LEAK_HOST], "paths": ["/never-fresh"]},
        "auth": {"type": "bearer", "credential": "fresh"},
    }
    vault.patch(credentials={"add": [credential]}, bindings={"add": [binding]})


def test_a_value_is_scrubbed_right_after_the_credential_vault_api_stores_it(
    victim: Victim, reflector: Reflector
) -> None:
    value = f"fresh-{secrets.token_hex(12)}"
    set_fresh(victim, value)
    reflector.leak(value)
    [result] = victim.fetch(h2(LEAK_HOST, "/body?form=json"))
    assert result.get("status") == 200 and json.loads(result["body"])["echo"] == REDACTED, result
    assert leaks(value, everything(result)) is None


@pytest.mark.parametrize("kind", ["h1", "h2"])
def test_text_written_beside_a_secret_cannot_make_an_escape_with_its_ends(
    victim: Victim, reflector: Reflector, kind: str
) -> None:
    """Issue 27, security case 83: the sandbox has the origin write `%` before a secret that starts
    with two hex digits (`%ab` is one escape, a byte, and `12/...` no form of the secret), or `41`
    after one that ends in `%`, by a writer that escapes another of its characters (PHP's `\\/`,
    Go html/template's `&#43;`). The whole merged text is replaced, and no decoder's reading of
    what the sandbox got shows the secret."""
    value = f"ab12/{secrets.token_hex(8)}+scrub%"
    set_fresh(victim, value)
    reflector.leak(value)
    cases = [("jsonslash", "%", ""), ("gohtml", "%", ""), ("jsonslash", "", "41"), ("gohtml", "%", "41")]
    mark = len(reflector.requests())
    results = victim.fetch(
        *(
            {
                "kind": kind,
                "host": LEAK_HOST,
                "path": f"/body?form={form}&before={quote(before)}&after={after}",
            }
            for form, before, after in cases
        )
    )
    for case, result in zip(cases, results, strict=True):
        assert result.get("status") == 200 and json.loads(result["body"])["echo"] == REDACTED, (case, result)
        assert leaks(value, everything(result)) is None, (case, result)
    seen = reflector.requests()[mark:]  # positive control: the origin wrote each of them
    assert [unquote(r["path"]).split("&before=")[1] for r in seen] == [
        f"{before}&after={after}" for _, before, after in cases
    ]


# ------------------------------------------------------------------------------ property


CHANNELS = st.one_of(
    st.builds(
        lambda form, charset, coding: f"/body?form={form}&charset={charset}&coding={coding}&ctype=text/plain",
        st.sampled_from(sorted(FORMS)),
        st.sampled_from(CHARSETS),
        st.sampled_from(CODINGS),
    ),
    st.builds(lambda form: f"/wwwauth?form={form}", st.sampled_from(sorted(FORMS))),
    st.sampled_from(
        ["/range", "/reason", "/hname", "/trailer", "/sse?n=2&gap=0.05", "/badstatus", "/truncated"]
    ),
)
RANDOM_SECRETS = st.text(
    alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789/+=-_.~!*'()&<>",
    min_size=14,
    max_size=40,
)


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    secret=RANDOM_SECRETS,
    requests=st.lists(st.tuples(st.sampled_from(["h1", "h2", "ws"]), CHANNELS), min_size=3, max_size=6),
)
def test_random_reflections_of_random_secrets_never_reach_the_sandbox(
    victim: Victim, reflector: Reflector, secret: str, requests: list[tuple[str, str]]
) -> None:
    """A fresh random secret is stored through the API (never injected), the origin reflects it
    through random channels (WWW-Authenticate too), forms (the serialisers and template engines
    of issue 27 too), charsets and codings, over HTTP/1.1, HTTP/2 and WebSocket."""
    set_fresh(victim, secret)
    reflector.leak(secret)
    batch = [
        {"kind": "ws", "host": LEAK_HOST, "path": "/ws", "deflate": "gzip" in path}
        if kind == "ws"
        else {"kind": kind, "host": LEAK_HOST, "path": path}
        for kind, path in requests
    ]
    for result in victim.fetch(*batch):
        assert "error" not in result or "Timeout" not in result["error"], result
        leak = leaks(secret, everything(result))
        assert leak is None, f"{secret!r} reached the sandbox ({leak}): {result}"
