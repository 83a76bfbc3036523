"""The policy document: pydantic models, normalised on the way in.

Rules of this module:
1. A superset of OpenSandbox's `networkPolicy` ({defaultAction, egress:[{action, target}]}) and
   credential-vault bindings: every OpenSandbox policy parses here with the same meaning.
2. Models normalise (targets to canonical form, methods upper case, binding credential moved into
   `auth`), so two spellings of one policy compare equal and dump identically.
3. Every check that needs the whole document (unique binding names, binding hosts covered by an
   allow rule) is here too, in `Policy`'s validator, so any way of building a Policy (file, API
   body, patch) is checked the same way. Problems carry a document path; the loader turns paths
   into file:line:column.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)

from sandgate.policy.canonical import AmbiguousTarget, canonical_pattern
from sandgate.policy.errors import HintedValueError
from sandgate.policy.names import WILDCARD_HINT, Target, canonical_target, parse_target, to_ascii_name

Action = Literal["allow", "deny", "ask"]  # ask: a reviewer decides each request (docs/policy.md)
ASK_TIMEOUT_MAX = 3600
Scheme = Literal["http", "https"]
Surface = Literal["header", "query", "path", "body"]

DEFAULT_BINDING_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
SCHEME_PORTS = {"https": 443, "http": 80}

# Headers a credential may never be written into (OpenSandbox vault.go's list).
RESERVED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "content-type",
        "transfer-encoding",
        "connection",
        "upgrade",
        "te",
        "trailer",
        "proxy-authorization",
        "proxy-authenticate",
        "forwarded",
        "x-forwarded-for",
        "x-forwarded-host",
        "x-forwarded-proto",
    }
)
_TOKEN = re.compile(r"^[A-Za-z0-9!#$%&'*+\-.^_`|~]+$")
_BINDING_LABEL = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
_CREDENTIAL_NAME = re.compile(r"^[^\s\x00-\x1f\x7f]+$")


class Problem(ValueError):
    """Whole-document problems found by a model validator, each at a path inside the model."""

    def __init__(self, problems: list[tuple[tuple[str | int, ...], str, str | None]]) -> None:
        super().__init__("; ".join(message for _, message, _ in problems))
        self.problems = problems


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    def __eq__(self, other: object) -> bool:
        """Equal content is equal policy, wherever it came from (rule ids are not content)."""
        if type(self) is not type(other) or not isinstance(other, BaseModel):
            return NotImplemented
        return self.model_dump() == other.model_dump()

    def __hash__(self) -> int:
        return hash(repr(self.model_dump()))


def _private(model: BaseModel) -> dict[str, Any]:
    """A model's private attributes, read directly: pydantic's `__getattr__` route for them costs
    microseconds per access, which add up at 100,000 rules."""
    private = model.__pydantic_private__
    assert private is not None, "only models that declare private attributes have them"
    return private


def _lower(value: Any) -> Any:
    return value.strip().lower() if isinstance(value, str) else value


def _nonempty(values: list[Any] | None, what: str) -> None:
    if values is not None and not values:
        raise HintedValueError(
            f"empty {what} list matches nothing", f"omit `{what}` to match any {what[:-1]}"
        )


def _check_ports(ports: list[int] | None) -> list[int] | None:
    _nonempty(ports, "ports")
    for port in ports or ():
        if not 1 <= port <= 65535:
            raise HintedValueError(f"port {port} is out of range", "ports are 1-65535")
    if ports and len(set(ports)) != len(ports):
        raise HintedValueError("duplicate port", "list each port once")
    return ports


def _check_methods(methods: list[str] | None) -> list[str] | None:
    if methods is None:
        return None
    _nonempty(methods, "methods")
    out = [method.strip().upper() for method in methods]
    for method in out:
        if not _TOKEN.match(method):
            raise HintedValueError(f"{method!r} is not an HTTP method", "e.g. GET, POST, PUT, PATCH, DELETE")
    return list(dict.fromkeys(out))


def _check_paths(paths: list[str] | None) -> list[str] | None:
    if paths is None:
        return None
    _nonempty(paths, "paths")
    for path in paths:
        if not path.startswith("/"):
            raise HintedValueError(f"path pattern {path!r} must start with '/'", "e.g. /repos/acme/*")
        if "*" in path[:-1] or "?" in path:
            raise HintedValueError(
                f"path pattern {path!r} is not supported",
                "only a trailing '*' (prefix match) is allowed and patterns never include a query",
            )
        try:
            canonical_pattern(path)
        except AmbiguousTarget as exc:
            raise HintedValueError(
                f"path pattern {path!r} can never match: {exc}",
                "write the path as it is served: no '.', '..' or empty segments, ';', '\\' or %2F",
            ) from None
    return list(dict.fromkeys(paths))


BYTE_UNITS = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
}


def _byte_count(value: Any) -> Any:
    """`1048576`, `"1Mi"`, `"500k"` -> bytes; anything else is left for the int check to refuse."""
    if isinstance(value, str):
        text = value.strip()
        for suffix in sorted(BYTE_UNITS, key=len, reverse=True):
            if text.endswith(suffix) and text[: -len(suffix)].strip().isdigit():
                return int(text[: -len(suffix)]) * BYTE_UNITS[suffix]
        if text.isdigit():
            return int(text)
        raise HintedValueError(
            f"{value!r} is not a byte count", "e.g. 1048576, '512Ki', '10Mi', '1Gi', '500k'"
        )
    return value


ByteCount = Annotated[int, BeforeValidator(_byte_count), Field(ge=1)]


class Directions(_Model):
    """A byte count each way: `in` (upstream to the sandbox) and `out` (the sandbox to upstream)."""

    in_: ByteCount | None = Field(None, alias="in")
    out: ByteCount | None = None


class Budget(_Model):
    """What may go: for the whole sandbox (the policy's `budgets`) or for each host a rule matches
    (the rule's). `requestsPerSecond` is a token bucket (`burst` at once, default one second's
    worth) over the requests the proxy sees (plain HTTP and intercepted TLS); `bytesPerSecond` and
    `totalBytes` count the bytes each way of those requests' bodies and of passed-through
    connections. Over a budget, a request is answered 429 with reason `budget`; a pass-through
    connection is slowed to `bytesPerSecond`, and a new one closed once a total is spent."""

    requestsPerSecond: float | None = Field(None, gt=0, le=100_000)
    burst: int | None = Field(None, ge=1, le=1_000_000)
    bytesPerSecond: Directions | None = None
    totalBytes: Directions | None = None

    @model_validator(mode="after")
    def _limits_something(self) -> Budget:
        if self.requestsPerSecond is None and self.bytesPerSecond is None and self.totalBytes is None:
            raise HintedValueError(
                "a budget without requestsPerSecond, bytesPerSecond or totalBytes limits nothing",
                "e.g. {requestsPerSecond: 5} or {totalBytes: {in: 1Gi}}",
            )
        if self.burst is not None and self.requestsPerSecond is None:
            raise HintedValueError("burst needs requestsPerSecond", "e.g. {requestsPerSecond: 5, burst: 20}")
        return self

    @property
    def capacity(self) -> float:
        rate = self.requestsPerSecond or 1.0
        return float(self.burst) if self.burst is not None else max(1.0, rate)


class EgressRule(_Model):
    """One egress rule; the first rule whose every condition matches decides."""

    action: Action
    target: str
    ports: list[int] | None = None
    schemes: list[Scheme] | None = None
    methods: list[str] | None = None
    paths: list[str] | None = None
    inspect: Literal["auto", "always"] = "auto"
    budgets: Budget | None = None  # per host this rule matches
    _origin: str | None = PrivateAttr(default=None)
    _preset: str | None = PrivateAttr(default=None)  # "preset:NAME@V" for a rule a preset brought in

    _action = field_validator("action", mode="before")(_lower)
    _ports = field_validator("ports")(_check_ports)
    _methods = field_validator("methods")(_check_methods)
    _paths = field_validator("paths")(_check_paths)

    @field_validator("schemes", mode="before")
    @classmethod
    def _schemes(cls, value: Any) -> Any:
        if isinstance(value, list):
            _nonempty(value, "schemes")
            return list(dict.fromkeys(_lower(item) for item in value))
        return value

    @field_validator("target")
    @classmethod
    def _target(cls, value: str) -> str:
        return parse_target(value).text

    @model_validator(mode="after")
    def _budget_on_allow(self) -> EgressRule:
        if self.budgets is not None and self.action != "allow":
            raise HintedValueError(
                f"budgets on a {self.action} rule limit nothing",
                "give budgets to allow rules, or remove them",
            )
        return self

    @property
    def parsed_target(self) -> Target:
        """The target's kind (and network); `target` is canonical, so this needs no validation."""
        return canonical_target(self.target)

    @property
    def conditional(self) -> bool:
        """Whether deciding this rule needs the request (method or path), not just the connection."""
        return self.methods is not None or self.paths is not None

    @property
    def origin(self) -> str | None:
        """Where the rule came from: "file:line", or e.g. "<api>:egress[3]"."""
        origin: str | None = _private(self)["_origin"]
        return origin

    @property
    def preset(self) -> str | None:
        """The preset that brought the rule in ("preset:NAME@V"), None for the policy's own."""
        preset: str | None = _private(self)["_preset"]
        return preset


def _binding_host(raw: str) -> str:
    """Binding hosts are FQDNs or `*.fqdn` (never IPs), as OpenSandbox's vault requires."""
    text = raw.strip()
    if "://" in text or "/" in text:
        raise HintedValueError(
            f"binding host {raw!r} must not include a scheme or path", "e.g. api.example.com"
        )
    wildcard = text.startswith("*.")
    body = text[2:] if wildcard else text
    if "*" in body:
        raise HintedValueError(f"misplaced wildcard in binding host {raw!r}", WILDCARD_HINT)
    name = to_ascii_name(body)
    labels = name.split(".")
    if len(labels) < 2 or not all(_BINDING_LABEL.match(label) for label in labels) or labels[-1].isdigit():
        raise HintedValueError(
            f"binding host {raw!r} must be a fully qualified domain name",
            "IP addresses and single-label names cannot carry credentials",
        )
    return "*." + name if wildcard else name


class BindingMatch(_Model):
    """Which requests a binding's credential may go to (defaults as OpenSandbox's CredentialMatch)."""

    hosts: list[str] = Field(min_length=1)
    schemes: list[Scheme] = ["https"]
    ports: list[int] = [443]
    methods: list[str] = list(DEFAULT_BINDING_METHODS)
    paths: list[str] = ["/*"]

    @model_validator(mode="before")
    @classmethod
    def _derive_ports(cls, data: Any) -> Any:
        """Ports default to the schemes' ports (https 443, http 80), as OpenSandbox derives them."""
        if isinstance(data, dict) and data.get("ports") is None:
            schemes = data.get("schemes") or ["https"]
            if isinstance(schemes, list) and all(_lower(s) in SCHEME_PORTS for s in schemes):
                data = {**data, "ports": sorted({SCHEME_PORTS[_lower(s)] for s in schemes})}
        return data

    @field_validator("schemes", mode="before")
    @classmethod
    def _schemes(cls, value: Any) -> Any:
        return [_lower(item) for item in value] if isinstance(value, list) else value

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, hosts: list[str]) -> list[str]:
        return list(dict.fromkeys(_binding_host(host) for host in hosts))

    _ports = field_validator("ports")(_check_ports)

    @field_validator("methods")
    @classmethod
    def _methods(cls, methods: list[str]) -> list[str]:
        return _check_methods(methods) or []

    @field_validator("paths")
    @classmethod
    def _paths(cls, paths: list[str]) -> list[str]:
        return _check_paths(paths) or []


def _credential_name(value: str) -> str:
    value = value.strip()
    if not value or not _CREDENTIAL_NAME.match(value):
        raise HintedValueError(
            f"credential name {value!r} is not valid",
            "a credential is the NAME of a vault entry (no spaces), never a secret value",
        )
    return value


def _header_name(value: str) -> str:
    value = value.strip()
    if not _TOKEN.match(value):
        raise HintedValueError(f"{value!r} is not a valid header name", "e.g. X-Api-Key")
    if value.lower() in RESERVED_HEADERS:
        raise HintedValueError(
            f"header {value!r} is reserved and cannot carry a credential",
            "reserved: " + ", ".join(sorted(RESERVED_HEADERS)),
        )
    return value


class BearerAuth(_Model):
    """`Authorization: Bearer <credential>`."""

    type: Literal["bearer"]
    credential: str
    _credential = field_validator("credential")(_credential_name)


class BasicAuth(_Model):
    """`Authorization: Basic <credential>`; the credential is already base64(user:pass)."""

    type: Literal["basic"]
    credential: str
    _credential = field_validator("credential")(_credential_name)


class ApiKeyAuth(_Model):
    """`<name>: <credential>`."""

    type: Literal["apiKey"]
    name: str
    credential: str
    _name = field_validator("name")(_header_name)
    _credential = field_validator("credential")(_credential_name)


class HeaderCredential(_Model):
    name: str
    credential: str
    _name = field_validator("name")(_header_name)
    _credential = field_validator("credential")(_credential_name)


class CustomHeadersAuth(_Model):
    """Several headers, each from its own credential."""

    type: Literal["customHeaders"]
    headers: list[HeaderCredential] = Field(min_length=1)

    @field_validator("headers")
    @classmethod
    def _unique(cls, headers: list[HeaderCredential]) -> list[HeaderCredential]:
        names = [header.name.lower() for header in headers]
        if len(set(names)) != len(names):
            raise HintedValueError("duplicate custom header name", "header names are case-insensitive")
        return headers


class Substitution(_Model):
    """Replace the literal `placeholder` the workload sends with the credential's value."""

    credential: str
    placeholder: str = Field(min_length=1)
    in_: list[Surface] = Field(default=["header", "query"], alias="in", min_length=1)
    _credential = field_validator("credential")(_credential_name)

    @field_validator("in_", mode="before")
    @classmethod
    def _surfaces(cls, value: Any) -> Any:
        return list(dict.fromkeys(_lower(item) for item in value)) if isinstance(value, list) else value


class PassthroughAuth(_Model):
    """Placeholder substitution in header, query, path or body (OpenSandbox 1.1.1)."""

    type: Literal["passthrough"]
    substitutions: list[Substitution] = Field(min_length=1)


def _aws_names(values: list[str]) -> list[str]:
    for value in values:
        if not _AWS_NAME.match(value):
            raise HintedValueError(f"{value!r} is not an AWS service or region name", "e.g. s3 or us-east-1")
    return list(dict.fromkeys(values))


def _optional_credential_name(value: str | None) -> str | None:
    return None if value is None else _credential_name(value)


class AwsSigV4Auth(_Model):
    """AWS SigV4: the sandbox signs with `placeholderAccessKeyId`; the proxy re-signs with the
    real key (vault credentials) for the bound services and regions."""

    type: Literal["awsSigV4"]
    accessKeyId: str
    secretAccessKey: str
    sessionToken: str | None = None
    placeholderAccessKeyId: str
    services: list[str] = Field(min_length=1)
    regions: list[str] = Field(min_length=1)

    _credentials = field_validator("accessKeyId", "secretAccessKey")(_credential_name)
    _token = field_validator("sessionToken")(_optional_credential_name)
    _scopes = field_validator("services", "regions")(_aws_names)

    @field_validator("placeholderAccessKeyId")
    @classmethod
    def _placeholder(cls, value: str) -> str:
        if not _AWS_PLACEHOLDER_KEY.match(value):
            raise HintedValueError(
                f"placeholderAccessKeyId {value!r} is not an access key id",
                "16 to 128 upper-case letters and digits, e.g. AKIASANDGATEPLACEHOLDER",
            )
        return value

    def credential_names(self) -> list[str]:
        return [self.accessKeyId, self.secretAccessKey, *([self.sessionToken] if self.sessionToken else [])]


GRANT_NEEDS: dict[str, tuple[str, ...]] = {  # what each grant needs besides tokenUrl
    "client_credentials": ("clientId", "clientSecret"),
    "refresh_token": ("clientId", "refreshToken"),
    "jwt_bearer": ("issuer", "privateKey"),
    "github_app": ("issuer", "privateKey"),
}


class OAuth2Auth(_Model):
    """A token minted by the proxy from long-lived vault secrets, sent as `Authorization: Bearer`:
    OAuth2 client-credentials, refresh-token and JWT-bearer (RFC 7523) grants, and GitHub App
    installation tokens (`tokenUrl` is the installation's access_tokens URL)."""

    type: Literal["oauth2"]
    grant: Literal["client_credentials", "refresh_token", "jwt_bearer", "github_app"]
    tokenUrl: str
    clientId: str | None = None  # not a secret: the client's public id
    clientSecret: str | None = None  # vault credential names from here on
    refreshToken: str | None = None
    privateKey: str | None = None  # PEM (RSA), signs the JWT assertion
    issuer: str | None = None  # jwt_bearer: iss (a service account's email); github_app: the App id
    subject: str | None = None
    audience: str | None = None  # jwt_bearer: aud, default tokenUrl
    scopes: list[str] = []
    timeout: float = Field(10.0, gt=0, le=60)

    _credentials = field_validator("clientSecret", "refreshToken", "privateKey")(_optional_credential_name)

    @field_validator("tokenUrl")
    @classmethod
    def _token_url(cls, value: str) -> str:
        scheme, _, rest = value.partition("://")
        host = rest.split("/", 1)[0].rsplit(":", 1)[0]
        if scheme.lower() != "https" or not host or "@" in rest.split("/", 1)[0]:
            raise HintedValueError(
                f"tokenUrl {value!r} must be an https URL", "e.g. https://auth.example.com/oauth2/token"
            )
        _binding_host(host)  # a name, never an address
        return value

    @model_validator(mode="after")
    def _grant_fields(self) -> OAuth2Auth:
        missing = [name for name in GRANT_NEEDS[self.grant] if getattr(self, name) is None]
        if missing:
            raise HintedValueError(
                f"grant {self.grant!r} needs {', '.join(missing)}",
                "see docs/vault.md, 'Minted tokens', for each grant's fields",
            )
        return self

    def credential_names(self) -> list[str]:
        return [name for name in (self.clientSecret, self.refreshToken, self.privateKey) if name]


_AWS_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
_AWS_PLACEHOLDER_KEY = re.compile(r"^[A-Z0-9]{16,128}$")

Auth = Annotated[
    BearerAuth | BasicAuth | ApiKeyAuth | CustomHeadersAuth | PassthroughAuth | AwsSigV4Auth | OAuth2Auth,
    Field(discriminator="type"),
]
_SINGLE_CREDENTIAL_AUTH = ("bearer", "basic", "apiKey")
_MULTI_CREDENTIAL_AUTH = ("customHeaders", "passthrough", "awsSigV4", "oauth2")


class Binding(_Model):
    """A vault credential, where it may be sent (`match`) and how it is written (`auth`)."""

    name: str = Field(min_length=1)
    match: BindingMatch
    auth: Auth
    _origin: str | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _credential_shorthand(cls, data: Any) -> Any:
        """Accept sandgate's `credential:` at binding level; store it inside `auth` (OpenSandbox's form)."""
        if not isinstance(data, dict) or "credential" not in data:
            return data
        data = dict(data)
        credential = data.pop("credential")
        auth = data.get("auth")
        if not isinstance(auth, dict) or auth.get("type") not in (
            *_SINGLE_CREDENTIAL_AUTH,
            *_MULTI_CREDENTIAL_AUTH,
        ):
            return data  # the auth error itself is reported by the discriminated union
        if auth.get("type") in _MULTI_CREDENTIAL_AUTH:
            raise HintedValueError(
                f"binding-level `credential` does not apply to auth type {auth.get('type')!r}",
                "customHeaders and passthrough name a credential per header or substitution, "
                "awsSigV4 and oauth2 name theirs inside auth",
            )
        if "credential" in auth and auth["credential"] != credential:
            raise HintedValueError(
                "binding names two different credentials",
                "give `credential` once, at binding level or in auth",
            )
        data["auth"] = {**auth, "credential": credential}
        return data

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        value = value.strip()
        if not value:
            raise HintedValueError("binding name is empty")
        return value

    def credential_names(self) -> list[str]:
        """Every vault credential name this binding needs, in order, without repeats."""
        auth = self.auth
        if isinstance(auth, CustomHeadersAuth):
            names = [header.credential for header in auth.headers]
        elif isinstance(auth, PassthroughAuth):
            names = [substitution.credential for substitution in auth.substitutions]
        elif isinstance(auth, AwsSigV4Auth | OAuth2Auth):
            names = auth.credential_names()
        else:
            names = [auth.credential]
        return list(dict.fromkeys(names))

    @property
    def origin(self) -> str | None:
        origin: str | None = _private(self)["_origin"]
        return origin


class Policy(_Model):
    """A sandbox's egress policy: ordered rules, a default, and credential bindings."""

    version: Literal[1] = 1
    defaultAction: Action = "deny"
    mode: Literal["enforce", "report"] = "enforce"
    askTimeout: int = Field(60, ge=1, le=ASK_TIMEOUT_MAX)  # seconds a held request waits for a reviewer
    include: list[str] = []  # presets whose rules follow the own rules (policy/presets.py)
    egress: list[EgressRule] = []
    bindings: list[Binding] = []
    budgets: Budget | None = None  # for the whole sandbox

    _default = field_validator("defaultAction", mode="before")(_lower)

    @model_validator(mode="after")
    def _whole_document(self) -> Policy:
        problems = _duplicate_binding_names(self.bindings) + _uncovered_binding_hosts(self)
        if problems:
            raise Problem(problems)
        return self


def _duplicate_binding_names(bindings: list[Binding]) -> list[tuple[tuple[str | int, ...], str, str | None]]:
    seen: dict[str, int] = {}
    problems: list[tuple[tuple[str | int, ...], str, str | None]] = []
    for index, binding in enumerate(bindings):
        if binding.name in seen:
            problems.append(
                (
                    ("bindings", index, "name"),
                    f"duplicate binding name {binding.name!r}",
                    f"binding names are unique; the first is bindings[{seen[binding.name]}]",
                )
            )
        seen.setdefault(binding.name, index)
    return problems


def _uncovered_binding_hosts(policy: Policy) -> list[tuple[tuple[str | int, ...], str, str | None]]:
    problems: list[tuple[tuple[str | int, ...], str, str | None]] = []
    for index, binding in enumerate(policy.bindings):
        for host_index, host in enumerate(binding.match.hosts):
            if not explicit_allow_covers(policy.egress, host):
                problems.append(
                    (
                        ("bindings", index, "match", "hosts", host_index),
                        f"binding {binding.name!r} host {host!r} is not covered by an explicit allow rule",
                        f"add `- {{action: allow, target: {host!r}}}` to egress; defaultAction doesn't count",
                    )
                )
    return problems


def explicit_allow_covers(rules: list[EgressRule], host: str) -> bool:
    """OpenSandbox's rule: the first name rule matching the host (or `probe.<suffix>`) allows it.

    Conditional deny rules (with ports, schemes, methods or paths) only deny some requests, so they
    do not stop a later allow rule from covering the host. Targets are compared as canonical text:
    a binding host is a name, so it can only equal a name target or end in a wildcard's suffix.
    """
    probe = "probe." + host[2:] if host.startswith("*.") else host
    for rule in rules:
        target = rule.target
        if target != probe and not (target.startswith("*.") and probe.endswith(target[1:])):
            continue
        if rule.action == "allow":
            return True
        if not rule.conditional and rule.ports is None and rule.schemes is None:
            return False
    return False
