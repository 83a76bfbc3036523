"""Sandbox runtimes: `local` (bubblewrap in a sandgate netns) and `docker`."""

from sandgate.lifecycle.runtime.base import Runtime, RuntimeError_, SandboxNet, SandboxSpec

__all__ = ["Runtime", "RuntimeError_", "SandboxNet", "SandboxSpec"]
