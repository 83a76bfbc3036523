"""A browser automation sandbox: headless Chromium driven by Playwright, inside a sandbox whose
policy lets it reach one site and nothing else.

The sandbox runs the `sandgate/host` image of the local runtime, whose /usr is the host's: it
needs Debian's `chromium`, `libnss3-tools` (certutil) and `python3-pip` on the host (on the
Docker runtime `sandgate/host` is the small base image, which has no browser). Playwright for Python is
installed into the sandbox from a package index (its bundled browsers are never downloaded:
Playwright launches Debian's Chromium by `executable_path`). Two policies, one after the other:

1. install: the sandbox may reach the package index and nothing else (`pip install playwright`);
2. browse: it may reach SITE_URL's host and nothing else. Playwright loads SITE_URL, prints its
   title and saves a screenshot (downloaded through the files API), then tries BLOCKED_URL,
   which the policy refuses (sandgate's DNS answers no address for a denied name; an address
   typed in would meet the proxy's 403).

TLS: the policy inspects HTTPS (`inspect: always`), so the browser meets the proxy's CA. Chromium
on Linux does not read the system's CA bundle; it trusts the CAs in the user's NSS database, so
the proxy's CA (/etc/ssl/certs/sandgate-proxy.crt in every local sandbox) is added there with
certutil. Nothing skips certificate checks. Chromium keeps its own sandbox: it refuses to run as
root with it, so the browser runs as `nobody` (uid 65534), where its user-namespace sandbox
works inside the sandgate sandbox.

    export OPEN_SANDBOX_DOMAIN=127.0.0.1:8080 OPEN_SANDBOX_API_KEY=$(cat /var/lib/sandgate/api_key)
    export PIP_INDEX_URL=https://pypi-mirror.example.com/simple/   # your index or mirror
    .venv/bin/python examples/browser/browse.py

Settings (environment): PIP_INDEX_URL (required: a PyPI-compatible index); PACKAGE_HOSTS (the
hosts the install step may reach, comma-separated; default the index's host; an index that
serves its files from another host needs that one too); SITE_URL (default https://example.com/);
BLOCKED_URL (default https://www.example.com/); SCREENSHOT (where the screenshot is saved,
default ./screenshot.png).
"""

import asyncio
import os
import shlex
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from opensandbox import Sandbox
from opensandbox.models.execd import RunCommandOpts

SITE_URL = os.environ.get("SITE_URL", "https://example.com/")
BLOCKED_URL = os.environ.get("BLOCKED_URL", "https://www.example.com/")
SCREENSHOT = Path(os.environ.get("SCREENSHOT", "screenshot.png"))
CHROMIUM = "/usr/lib/chromium/chromium"  # Debian's browser binary (/usr/bin/chromium is a wrapper)
PROXY_CA = "/etc/ssl/certs/sandgate-proxy.crt"
PLAYWRIGHT_DIR = "/opt/playwright"  # pip --target: Debian's Python is externally managed
BROWSER_UID = 65534  # nobody: Chromium's sandbox refuses root
BROWSER_HOME = "/tmp/browser"
FONTS_CONF = f"""<?xml version="1.0"?>
<fontconfig><dir>/usr/share/fonts</dir><cachedir>{BROWSER_HOME}/fontconfig</cachedir></fontconfig>
"""  # the host's /etc/fonts is not in the sandbox: without a config Chromium renders no text
# What runs inside the sandbox, as nobody: Playwright drives Debian's Chromium.
BROWSE = f"""
from playwright.sync_api import Error, sync_playwright

with sync_playwright() as driver:
    browser = driver.chromium.launch(executable_path={CHROMIUM!r}, chromium_sandbox=True)
    page = browser.new_page()
    page.goto({SITE_URL!r})
    print("title:", page.title())
    page.screenshot(path={BROWSER_HOME + "/screenshot.png"!r})
    try:
        page.goto({BLOCKED_URL!r}, timeout=15000)
        print("blocked site loaded:", page.title())
    except Error as refused:
        print("refused:", str(refused).splitlines()[0])
    browser.close()
"""


def allow_only(*hosts: str) -> dict[str, Any]:
    """sandgate's policy document: `hosts` allowed (HTTPS inspected), everything else denied."""
    rules = [{"action": "allow", "target": host, "inspect": "always"} for host in hosts]
    return {"version": 1, "defaultAction": "deny", "mode": "enforce", "egress": rules}


async def set_policy(api: httpx.AsyncClient, sandbox: Sandbox, policy: dict[str, Any]) -> None:
    answer = await api.put(f"/v1/sandboxes/{sandbox.id}/egress/sandgate-policy", json={"policy": policy})
    answer.raise_for_status()


async def run(sandbox: Sandbox, command: str, **opts: Any) -> str:
    """Run `command`; its stdout, or exit with its stderr when it fails."""
    execution = await sandbox.commands.run(command, opts=RunCommandOpts(timeout=timedelta(minutes=5), **opts))
    stdout = "".join(line.text + "\n" for line in execution.logs.stdout)  # one event per line
    if execution.error is not None or execution.exit_code not in (0, None):
        stderr = "".join(line.text + "\n" for line in execution.logs.stderr)
        sys.exit(f"{command!r} failed ({execution.exit_code}):\n{stdout}{stderr}")
    return stdout


async def install_playwright(sandbox: Sandbox, index: str) -> None:
    await run(
        sandbox,
        "python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "
        f"--target {PLAYWRIGHT_DIR} --index-url {shlex.quote(index)} playwright",
    )


async def prepare_browser_home(sandbox: Sandbox) -> None:
    """nobody's home: an NSS database trusting the proxy's CA, and a fontconfig file."""
    pki = f"{BROWSER_HOME}/.pki"
    await run(sandbox, f"install -d -o {BROWSER_UID} {BROWSER_HOME} {pki} {pki}/nssdb")
    await sandbox.files.write_file(f"{BROWSER_HOME}/fonts.conf", FONTS_CONF)
    nssdb = f"sql:{pki}/nssdb"
    trust = f"certutil -A -d {nssdb} -n sandgate-proxy -t C,, -i {PROXY_CA}"
    await run(
        sandbox, f"certutil -N -d {nssdb} --empty-password && {trust}", uid=BROWSER_UID, gid=BROWSER_UID
    )


async def browse(sandbox: Sandbox) -> None:
    env = {
        "HOME": BROWSER_HOME,
        "PYTHONPATH": PLAYWRIGHT_DIR,
        "FONTCONFIG_FILE": f"{BROWSER_HOME}/fonts.conf",
    }
    print(
        await run(sandbox, f"python3 -c {shlex.quote(BROWSE)}", envs=env, uid=BROWSER_UID, gid=BROWSER_UID),
        end="",
    )
    SCREENSHOT.write_bytes(await sandbox.files.read_bytes(f"{BROWSER_HOME}/screenshot.png"))
    print(f"screenshot: {SCREENSHOT} ({SCREENSHOT.stat().st_size} bytes)")


async def main() -> None:
    index = os.environ.get("PIP_INDEX_URL")
    if not index:
        sys.exit("set PIP_INDEX_URL to a PyPI-compatible index the sandbox may reach (see the docstring)")
    package_hosts = os.environ.get("PACKAGE_HOSTS", urlsplit(index).hostname or "").split(",")
    domain = os.environ.get("OPEN_SANDBOX_DOMAIN", "localhost:8080")
    headers = {"OPEN-SANDBOX-API-KEY": os.environ["OPEN_SANDBOX_API_KEY"]}
    sandbox = await Sandbox.create(
        "sandgate/host", entrypoint=["sleep", "infinity"], timeout=timedelta(minutes=10)
    )
    async with sandbox, httpx.AsyncClient(base_url=f"http://{domain}", headers=headers) as api:
        try:
            await set_policy(api, sandbox, allow_only(*package_hosts))
            await install_playwright(sandbox, index)
            await set_policy(api, sandbox, allow_only(urlsplit(SITE_URL).hostname or ""))
            await prepare_browser_home(sandbox)
            await browse(sandbox)
        finally:
            await sandbox.kill()


if __name__ == "__main__":
    asyncio.run(main())
