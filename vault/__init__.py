"""sandgate.vault: where credentials live, outside every sandbox.

Rules: a store is write-only from the outside (names, versions and timestamps can be listed; a
value can be put, rotated and deleted, never read back through the CLI or any API). Only the
proxy's injection path calls `reveal`, and only to render a binding; `values` only builds a
`Redactor`. No code here logs, prints or raises with a value in it.

- Stores: `LocalStore` (one AES-256-GCM file in the state dir), `OpenBaoStore` (HashiCorp
  Vault / OpenBao KV v2), `MemoryStore` (a node proxy's, fed over its control socket), all
  `SecretStore`s; `open_store(...)` builds one from settings values;
  `open_configured(StoreSettings, StoreSecrets)` from the two halves a config file and a pipe carry.
- Rendering: `render(binding, reveal) -> Injection` (headers to set and `Placeholders` to
  substitute), one renderer per auth type in `RENDERERS`.
- AWS SigV4: an `awsSigV4` binding renders a `SigV4Signer` (`Injection.signer`) that checks a
  request signed with the placeholder key and signs it again with the real one (botocore).
- Minted tokens: an `oauth2` binding's token is minted by the proxy (`token_request` builds the
  grant's request with Authlib, `parse_token` reads the answer, `MintError` says what failed);
  its renderer reads the token under `minted_name(auth)` like any other value.
- Redaction: `Redactor(values)` with `redact`, `redact_text` and `stream()`.
"""

from sandgate.vault.errors import InvalidSecretName, SecretNotFound, VaultError, VaultKeyError, VaultTampered
from sandgate.vault.local import LocalStore, decode_master_key, generate_master_key
from sandgate.vault.memory import MemoryStore
from sandgate.vault.models import SecretInfo
from sandgate.vault.oauth2 import (
    Minted,
    MintError,
    TokenRequest,
    minted_name,
    parse_token,
    token_host,
    token_request,
)
from sandgate.vault.openbao import OpenBaoStore
from sandgate.vault.redact import REDACTED, RedactingStream, Redactor, secret_forms
from sandgate.vault.render import (
    DEFAULT_SURFACES,
    RENDERERS,
    BodyResult,
    Injection,
    Placeholders,
    Reveal,
    render,
    render_auth,
    render_headers,
    reveal_via,
)
from sandgate.vault.sigv4 import SigV4Refused, SigV4Signer
from sandgate.vault.store import (
    LOCAL_KEY_FILE,
    LOCAL_VAULT_FILE,
    SecretStore,
    StoreSecrets,
    StoreSettings,
    open_configured,
    open_store,
)

__all__ = [
    "DEFAULT_SURFACES",
    "LOCAL_KEY_FILE",
    "LOCAL_VAULT_FILE",
    "REDACTED",
    "RENDERERS",
    "BodyResult",
    "Injection",
    "InvalidSecretName",
    "LocalStore",
    "MemoryStore",
    "MintError",
    "Minted",
    "OpenBaoStore",
    "Placeholders",
    "RedactingStream",
    "Redactor",
    "Reveal",
    "SecretInfo",
    "SecretNotFound",
    "SecretStore",
    "SigV4Refused",
    "SigV4Signer",
    "StoreSecrets",
    "StoreSettings",
    "TokenRequest",
    "VaultError",
    "VaultKeyError",
    "VaultTampered",
    "decode_master_key",
    "generate_master_key",
    "minted_name",
    "open_configured",
    "open_store",
    "parse_token",
    "render",
    "render_auth",
    "render_headers",
    "reveal_via",
    "secret_forms",
    "token_host",
    "token_request",
]
