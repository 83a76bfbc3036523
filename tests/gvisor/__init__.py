"""The key adversarial and conformance tests again, on a server whose sandboxes run under gVisor
(`SANDGATE_ISOLATION=gvisor`): the same test functions, imported, with this package's `server`
fixtures. Chosen to prove the guarantees (egress, isolation, scrubbing, fail-closed, the
clients' scenarios), not the whole suite twice."""
