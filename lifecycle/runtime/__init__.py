"""Sandbox runtimes: `local` (bubblewrap in a sandgate netns), `docker` and `kubernetes`."""

from sandgate.lifecycle.runtime.base import Runtime, RuntimeError_, SandboxSpec

__all__ = ["Runtime", "RuntimeError_", "SandboxSpec"]
