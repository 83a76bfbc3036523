"""sandgate.policy: the egress policy language, its loader, the compiled matcher and decisions.

A decision depends only on the policy and the request's facts (host, port, scheme, method, path,
resolved address); this package has no sockets, no mitmproxy, no clock, and reads files only in
`load_policy`. See docs/policy.md for the language and the always-deny list.
"""

from sandgate.policy.addresses import (
    ALWAYS_DENIED,
    EMBEDDING_PREFIXES,
    DeniedRange,
    denied_range,
    embedded_ipv4,
)
from sandgate.policy.canonical import AmbiguousTarget, RequestIdentity, request_identity
from sandgate.policy.ceiling import WITHIN, CeilingDecision, within_ceiling
from sandgate.policy.compiled import (
    ALWAYS_ENFORCED,
    DEFAULT_CACHE_SIZE,
    DEFAULT_MAX_RULES,
    OUTCOMES,
    CompiledPolicy,
    Decision,
    Outcome,
    Request,
    compile_policy,
)
from sandgate.policy.errors import PolicyError, PolicyIssue
from sandgate.policy.loader import load_policy, load_preset, parse_policy, policy_from_dict
from sandgate.policy.models import (
    DEFAULT_BINDING_METHODS,
    RESERVED_HEADERS,
    ApiKeyAuth,
    Auth,
    AwsSigV4Auth,
    BasicAuth,
    BearerAuth,
    Binding,
    BindingMatch,
    Budget,
    CustomHeadersAuth,
    EgressRule,
    HeaderCredential,
    OAuth2Auth,
    PassthroughAuth,
    Policy,
    Substitution,
)
from sandgate.policy.names import path_matches
from sandgate.policy.presets import Preset, Presets
from sandgate.policy.reasons import Reason
from sandgate.policy.suggest import Suggestion, suggest_policy
from sandgate.policy.updates import (
    add_bindings,
    delete_targets,
    patch_rules,
    replace_policy,
    to_document,
    to_opensandbox,
    to_source_document,
)

__all__ = [
    "ALWAYS_DENIED",
    "ALWAYS_ENFORCED",
    "DEFAULT_BINDING_METHODS",
    "DEFAULT_CACHE_SIZE",
    "DEFAULT_MAX_RULES",
    "EMBEDDING_PREFIXES",
    "OUTCOMES",
    "RESERVED_HEADERS",
    "WITHIN",
    "AmbiguousTarget",
    "ApiKeyAuth",
    "Auth",
    "AwsSigV4Auth",
    "BasicAuth",
    "BearerAuth",
    "Binding",
    "BindingMatch",
    "Budget",
    "CeilingDecision",
    "CompiledPolicy",
    "CustomHeadersAuth",
    "Decision",
    "DeniedRange",
    "EgressRule",
    "HeaderCredential",
    "OAuth2Auth",
    "Outcome",
    "PassthroughAuth",
    "Policy",
    "PolicyError",
    "PolicyIssue",
    "Preset",
    "Presets",
    "Reason",
    "Request",
    "RequestIdentity",
    "Substitution",
    "Suggestion",
    "add_bindings",
    "compile_policy",
    "delete_targets",
    "denied_range",
    "embedded_ipv4",
    "load_policy",
    "load_preset",
    "parse_policy",
    "patch_rules",
    "path_matches",
    "policy_from_dict",
    "replace_policy",
    "request_identity",
    "suggest_policy",
    "to_document",
    "to_opensandbox",
    "to_source_document",
    "within_ceiling",
]
