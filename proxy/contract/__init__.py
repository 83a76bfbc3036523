"""The proxy's contract: everything lifecycle needs of the proxy, and nothing that loads mitmproxy.

Rules: this package imports only pydantic, httpx, cryptography and sandgate.policy/vault (a test
proves no mitmproxy module loads with it). The engine (every other module of sandgate.proxy)
implements it; lifecycle reaches it only through `sandgate.proxy`, the face that re-exports it
(enforced by import-linter in `make lint`). What is here:
- names.py: the name of every file and socket in the state dir;
- config.py: `ProxyConfig` (with every limit the proxy enforces) and `SandboxEntry`;
- audit.py: the audit record's schema (`AuditRecord`) and `append_record`, lifecycle's writer;
- control.py: the control API's route table (`ROUTES`) and its client (`ProxyControl`);
- ca.py: the deployment CA's files (`ensure_ca`), which lifecycle copies into sandboxes.

This file imports nothing: importing one submodule must not load the others (the CLI reads audit
records with pydantic alone; `sandgate.proxy`'s face loads each name from its module on first use).
"""
