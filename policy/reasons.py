"""Every reason a decision can carry: the `reason` of a `Decision` and of its audit record.

Rules: a reason is a `Reason` member, never a bare string, in every component (the policy's
matcher, the proxy's own refusals, the security events it records). A control-plane change is
no decision: its words are `sandgate.lifecycle.audit.Change`. Values are what the audit file, the
API, `sandgate logs` and the console show; they never change once written (older audit files
keep their meaning), so a new reason is a new member. `StrEnum`: a member is its value.
"""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    # The policy's matcher (sandgate.policy.compiled).
    RULE = "rule"  # a rule decided; `Decision.rule` says which (file:line)
    DEFAULT = "default"  # no rule matched: the policy's default action
    L7_PENDING = "l7_pending"  # allowed to connect; the request's method/path decide later
    ADDRESS_OK = "address_ok"  # the resolved address may be dialled
    INVALID_HOST = "invalid_host"
    INVALID_ADDRESS = "invalid_address"
    AMBIGUOUS_TARGET = "ambiguous_target"  # origins could read the target two ways (400)
    IP_LITERAL_NEEDS_CIDR_RULE = "ip_literal_needs_cidr_rule"
    ALWAYS_DENIED_RANGE = "always_denied_range"  # loopback, link-local, metadata... without a CIDR rule
    BINDING_AMBIGUOUS = "binding_ambiguous"  # two credential bindings tie for one request
    PORT_NOT_ALLOWED = "port_not_allowed"  # near misses: a rule for the host, not for this
    SCHEME_NOT_ALLOWED = "scheme_not_allowed"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    PATH_NOT_ALLOWED = "path_not_allowed"
    # The proxy's own refusals (sandgate.proxy).
    IDENTITY_MISMATCH = "identity-mismatch"  # SNI, Host, :authority or port disagree (421)
    MALFORMED_CLIENTHELLO = "malformed-clienthello"  # a ClientHello a conforming server must reject
    ECH_REFUSED = "ech-refused"  # a ClientHello carrying ECH: its SNI is only the outer name
    UNKNOWN_SANDBOX = "unknown-sandbox"  # the sandbox's entry was dropped
    UNKNOWN_SOURCE = "unknown-source"  # a connection from an address that names no sandbox
    UNRESOLVED = "upstream-unresolvable"  # the proxy could not resolve the allowed name (502)
    NEEDS_INSPECTION = "inspection-required"  # a pass-through host that now needs an L7 view
    CREDENTIAL_UNAVAILABLE = "credential-unavailable"  # the vault has no value for a binding (502)
    PLACEHOLDER_MISUSE = "placeholder-outside-binding"  # a credential placeholder sent elsewhere
    NOT_RESIGNABLE = "request-not-resignable"  # an AWS request the proxy cannot re-sign (400)
    TOKEN_UNAVAILABLE = "token-unavailable"  # an oauth2 binding's token could not be minted (502)
    TOKEN_MINTED = "token-minted"  # the proxy called a token endpoint for a binding (its record)
    TOKEN_MINT_FAILED = "token-mint-failed"
    RESPONSE_REFUSED = "response-refused"  # a response the scrubber cannot read is not sent
    UPSTREAM_ERROR = "upstream-error"  # the upstream failed; the page the sandbox got says why
    TOO_MANY_CONNECTIONS = "connection-limit"  # fairness: the sandbox's open connections
    TOO_FAST = "accept-rate"  # fairness: the sandbox's new connections per second
    HEADER_TIMEOUT = "header_timeout"  # a client too slow to send its first request's headers
    AUDIT_UNWRITABLE = "audit-unwritable"  # the audit log cannot be written: nothing is forwarded (503)
    BUDGET = "budget"  # the sandbox's or the rule's requests-per-second budget is spent (429)
    # Approvals (`action: ask`): the policy asks, a reviewer answers.
    ASK = "ask"  # the policy's answer to a request an `ask` rule or default matched: hold it
    APPROVED = "approved"  # a reviewer allowed the held request (once, or for the sandbox)
    APPROVAL_DENIED = "approval-denied"  # a reviewer refused it
    APPROVAL_TIMEOUT = "approval-timeout"  # nobody answered within the policy's askTimeout
    APPROVAL_CLIENT_GONE = "approval-client-gone"  # its client closed the connection while it was held
    APPROVAL_QUEUE_FULL = "approval-queue-full"  # the sandbox already has its limit of held requests
