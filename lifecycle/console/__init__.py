"""sandgate.lifecycle.console: the reviewer's web console (`/console`), server-rendered, no CDN.

Mount with `console_router(store, verify_key, sandboxes)`; see docs/audit.md.
"""

from sandgate.lifecycle.console.routes import console_router
from sandgate.lifecycle.console.session import COOKIE, Sessions
from sandgate.lifecycle.console.views import ConsoleSandbox

__all__ = ["COOKIE", "ConsoleSandbox", "Sessions", "console_router"]
