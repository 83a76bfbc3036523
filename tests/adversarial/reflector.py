"""A hostile origin for the scrubbing cases: it reflects a secret through every channel an HTTP/1.1
origin has. Run in the test internet's namespace: `python reflector.py WORKDIR ADDRESS`.

Rules:
1. The secret it reflects is the bearer token the request carries (the proxy injected it), else
   the one in WORKDIR/secret.txt (a value the origin "got elsewhere"), read per request.
2. Every request is one line in WORKDIR/requests.jsonl (path, headers, where the secret came
   from), so a test proves from here what the proxy sent upstream (Range stripped, credential
   injected, ...).
3. The channel is the path: /body (form, charset, coding from the query), /range (honours
   Range: 206 pieces), /reason, /hname, /trailer, /wwwauth (a 401 whose WWW-Authenticate
   error_description holds the form of the query), /badstatus, /truncated, /sse, /ws (wsproto:
   text, binary, fragmented and permessage-deflate messages, ping payload, close reason).
The encodings are functions of this module, so a test computes exactly what went on the wire.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import ssl
import sys
import zlib
from pathlib import Path
from urllib.parse import parse_qs, quote, urlsplit


def go_json(s: str) -> str:
    """Go's encoding/json (HTMLEscape on by default): `<`, `>`, `&` as \\u003c \\u003e \\u0026."""
    out = json.dumps(s, ensure_ascii=False)[1:-1]
    return out.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def go_html(s: str) -> str:
    """Go's html/template text escaper: `&<>"'` and `+` (as `&#43;`)."""
    table = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&#34;", "'": "&#39;", "+": "&#43;"}
    return "".join(table.get(c, c) for c in s)


def handlebars(s: str) -> str:
    """Handlebars/lodash escapeExpression: `&<>"'`, the backtick, `=` and `/` (OWASP's list)."""
    table = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#x27;", "`": "&#x60;",
             "=": "&#x3D;", "/": "&#x2F;"}  # fmt: skip
    return "".join(table.get(c, c) for c in s)


FORMS = {
    "raw": lambda s: s,
    "json": lambda s: json.dumps(s)[1:-1],
    "jsonslash": lambda s: json.dumps(s)[1:-1].replace("/", "\\/"),
    "url": lambda s: quote(s, safe="/"),
    "urlreserved": lambda s: quote(s, safe=":/?#[]@!$&'()*+,;="),
    "basic": lambda s: base64.b64encode(f"user:{s}".encode()).decode(),
    # issue 27: what real servers and template engines write
    "gojson": go_json,
    "gohtml": go_html,
    "handlebars": handlebars,
    "htmldecimal": lambda s: "".join(c if c.isalnum() else f"&#{ord(c)};" for c in s),
    "jsonu": lambda s: "".join(f"\\u{ord(c):04x}" for c in s),
    "jsonofhtml": lambda s: go_json(go_html(s)),
    "jwt": lambda s: base64.urlsafe_b64encode(f'{{"sub":"{go_json(s)}"}}'.encode()).decode().rstrip("="),
}
CHARSETS = ("utf-8", "utf-16-le", "utf-16-be", "utf-16")  # utf-16: with a BOM


def _brotli(data: bytes) -> bytes:
    import brotli

    return bytes(brotli.compress(data))


def _zstd(data: bytes) -> bytes:
    try:
        from compression import zstd  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        from backports import zstd  # type: ignore[no-redef,import-not-found,unused-ignore]
    return bytes(zstd.compress(data))


CODINGS = {
    "identity": lambda d: d,
    "gzip": gzip.compress,
    "deflate": zlib.compress,
    "br": _brotli,
    "zstd": _zstd,
}


def body_text(secret: str, form: str, before: str = "", after: str = "") -> str:
    """The echo: what the writer `form` makes of the secret and the text a client had put beside it."""
    return f'{{"echo": "{FORMS[form](before + secret + after)}", "note": "reflected"}}\n'


def encode_body(
    secret: str, form: str, charset: str, coding: str, before: str = "", after: str = ""
) -> bytes:
    """The body /body sends; `coding` may be a chain ("gzip,br") or one the proxy cannot decode."""
    data = body_text(secret, form, before, after).encode(charset)
    for name in filter(None, coding.split(",")):
        data = CODINGS[name](data) if name in CODINGS else data  # an unknown coding: bytes as they are
    return data


def _head(status: str, headers: list[tuple[str, str]]) -> bytes:
    lines = [f"HTTP/1.1 {status}", *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class Reflector:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir

    def secret_for(self, headers: dict[str, str]) -> tuple[str, str]:
        auth = headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:], "injected"
        return (self.workdir / "secret.txt").read_text(), "file"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            writer.close()
            return
        request_line, *lines = head.decode("latin-1").split("\r\n")
        method, target, _ = request_line.split(" ", 2)
        headers = {
            k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines if line)
        }
        secret, source = self.secret_for(headers)
        url = urlsplit(target)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        with (self.workdir / "requests.jsonl").open("a") as log:
            log.write(
                json.dumps({"method": method, "path": target, "headers": headers, "source": source}) + "\n"
            )
        try:
            await getattr(self, "_" + url.path.strip("/"))(secret, query, headers, reader, writer)
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def _body(
        self, secret: str, q: dict[str, str], h: dict[str, str], r: object, w: asyncio.StreamWriter
    ) -> None:
        charset, coding = q.get("charset", "utf-8"), q.get("coding", "identity")
        body = encode_body(
            secret, q.get("form", "raw"), charset, coding, q.get("before", ""), q.get("after", "")
        )
        ctype = q.get("ctype", "application/json") + (f"; charset={charset}" if q.get("declare") else "")
        fields = [("Content-Type", ctype), ("Content-Length", str(len(body)))]
        if coding != "identity":
            fields.append(("Content-Encoding", coding.replace(",", ", ")))
        w.write(_head("200 OK", fields) + body)
        await w.drain()

    async def _range(
        self, secret: str, q: dict[str, str], h: dict[str, str], r: object, w: asyncio.StreamWriter
    ) -> None:
        body = body_text(secret, "raw").encode()
        spec = h.get("range", "")
        if spec.startswith("bytes="):
            start_text, _, end_text = spec[6:].partition("-")
            start = int(start_text)
            end = min(int(end_text) if end_text else len(body) - 1, len(body) - 1)
            piece = body[start : end + 1]
            fields = [
                ("Content-Range", f"bytes {start}-{end}/{len(body)}"),
                ("Content-Length", str(len(piece))),
            ]
            w.write(_head("206 Partial Content", [("Content-Type", "text/plain"), *fields]) + piece)
        else:
            w.write(
                _head("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))]) + body
            )
        await w.drain()

    async def _reason(
        self, secret: str, q: dict[str, str], h: dict[str, str], r: object, w: asyncio.StreamWriter
    ) -> None:
        w.write(_head(f"200 {secret}", [("Content-Length", "3")]) + b"ok\n")
        await w.drain()

    async def _hname(
        self, secret: str, q: dict[str, str], h: dict[str, str], r: object, w: asyncio.StreamWriter
    ) -> None:
        name = "X-" + quote(secret, safe="")  # URL-encoded: every character a valid header-name one
        w.write(_head("200 OK", [(name, "1"), ("X-Ok", "yes"), ("Content-Length", "3")]) + b"ok\n")
        await w.drain()

    async def _wwwauth(
        self, secret: str, q: dict[str, str], h: dict[str, str], r: object, w: asyncio.StreamWriter
    ) -> None:
        echo = FORMS[q.get("form", "raw")](secret)
        challenge = f'Bearer realm="api", error="invalid_token", error_description="token {echo} rejected"'
        w.write(
            _head("401 Unauthorized", [("WWW-Authenticate", challenge), ("Content-Length", "3")]) + b"no\n"
        )
        await w.drain()

    async def _trailer(
        self, secret: str, q: dict[str, str], h: dict[str, str], r: object, w: asyncio.StreamWriter
    ) -> None:
        head = _head(
            "200 OK", [("Content-Type", "text/plain"), ("Transfer-Encoding", "chunked"), ("Trailer", "X-T")]
        )
        w.write(head + b"3\r\nok\n\r\n0\r\n" + f"X-T: {secret}\r\n\r\n".encode())
        await w.drain()

    async def _badstatus(
        self, secret: str, q: dict[str, str], h: dict[str, str], r: object, w: asyncio.StreamWriter
    ) -> None:
        w.write(f"HTTP/1.1 2OO {secret}\r\nX-Leak: {secret}\r\n\r\n".encode())
        await w.drain()

    async def _truncated(
        self, secret: str, q: dict[str, str], h: dict[str, str], r: object, w: asyncio.StreamWriter
    ) -> None:
        w.write(f"HTTP/1.1 200 OK\r\nX-Leak: {secret}\r\nX-Cut".encode())
        await w.drain()

    async def _sse(
        self, secret: str, q: dict[str, str], h: dict[str, str], r: object, w: asyncio.StreamWriter
    ) -> None:
        w.write(_head("200 OK", [("Content-Type", "text/event-stream"), ("Transfer-Encoding", "chunked")]))
        for n in range(int(q.get("n", "3"))):
            event = f"id: {n}\ndata: {secret}\n\n".encode()
            w.write(b"%x\r\n%s\r\n" % (len(event), event))
            await w.drain()
            await asyncio.sleep(float(q.get("gap", "0.4")))
        w.write(b"0\r\n\r\n")
        await w.drain()

    async def _ws(
        self,
        secret: str,
        q: dict[str, str],
        h: dict[str, str],
        r: asyncio.StreamReader,
        w: asyncio.StreamWriter,
    ) -> None:
        import wsproto
        import wsproto.events as ev
        from wsproto.extensions import PerMessageDeflate

        head = "\r\n".join(f"{k}: {v}" for k, v in h.items())
        conn = wsproto.WSConnection(wsproto.ConnectionType.SERVER)
        conn.receive_data(f"GET /ws HTTP/1.1\r\n{head}\r\n\r\n".encode("latin-1"))
        request = next(e for e in conn.events() if isinstance(e, ev.Request))
        offered = [str(e).split(";")[0].strip() for e in request.extensions]
        deflate = [PerMessageDeflate()] if "permessage-deflate" in offered else []
        out = conn.send(ev.AcceptConnection(extensions=deflate))
        out += conn.send(ev.TextMessage(f"text {secret}"))
        out += conn.send(ev.BytesMessage(f"binary {secret}".encode()))
        half = len(secret) // 2
        out += conn.send(ev.TextMessage(f"frag {secret[:half]}", message_finished=False))
        out += conn.send(ev.TextMessage(f"{secret[half:]} end"))
        out += conn.send(ev.Ping(f"p{secret}".encode()[:125]))
        w.write(out)
        await w.drain()
        await asyncio.sleep(0.5)
        w.write(conn.send(ev.CloseConnection(1000, f"bye {secret}"[:120])))
        await w.drain()
        await asyncio.sleep(0.3)


async def main(workdir: Path, address: str) -> None:
    reflector = Reflector(workdir)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(workdir / "leaf.pem", workdir / "leaf-key.pem")
    servers = [
        await asyncio.start_server(reflector.handle, address, 443, ssl=tls),
        await asyncio.start_server(reflector.handle, address, 80),
    ]
    (workdir / "ready").write_text("ok")
    await asyncio.gather(*(server.serve_forever() for server in servers))


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2]))
