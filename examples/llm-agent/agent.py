"""An agent in a sandbox calls an LLM API with a key it never sees.

The key lives in sandgate's vault (`sandgate vault put llm-api-key < key.txt`); policy.yaml
beside this file lets the sandbox POST to the chat-completions endpoint of llm.example.com and
nothing else, and binds the key to those requests: the egress proxy adds
`Authorization: Bearer <key>` in flight. The agent's code (AGENT below) sends no key; its
environment holds none.

    export OPEN_SANDBOX_DOMAIN=127.0.0.1:8080 OPEN_SANDBOX_API_KEY=$(cat /var/lib/sandgate/api_key)
    .venv/bin/sandgate vault put llm-api-key < key.txt
    .venv/bin/python examples/llm-agent/agent.py

LLM_API_URL overrides the endpoint (it must stay within the policy).
"""

import asyncio
import os
import shlex
from datetime import timedelta
from pathlib import Path

import httpx
import yaml
from opensandbox import Sandbox

POLICY = Path(__file__).with_name("policy.yaml")
URL = os.environ.get("LLM_API_URL", "https://llm.example.com/v1/chat/completions")
# What runs inside the sandbox: a plain HTTPS POST with the standard library, no key anywhere.
AGENT = f"""
import json, os, urllib.request
body = {{"model": "example-model", "messages": [{{"role": "user", "content": "Say hello"}}]}}
request = urllib.request.Request({URL!r}, data=json.dumps(body).encode(), method="POST",
                                 headers={{"content-type": "application/json"}})
with urllib.request.urlopen(request, timeout=30) as response:
    print("status", response.status)
    print(response.read().decode())
print("key-like variables in my environment:", [k for k in os.environ if "KEY" in k or "TOKEN" in k])
"""


async def main() -> None:
    sandbox = await Sandbox.create(
        "sandgate/host", entrypoint=["sleep", "infinity"], timeout=timedelta(minutes=5)
    )
    async with sandbox:
        # sandgate's policy API takes the whole policy document (L7 rules and bindings)
        domain = os.environ.get("OPEN_SANDBOX_DOMAIN", "localhost:8080")
        headers = {"OPEN-SANDBOX-API-KEY": os.environ["OPEN_SANDBOX_API_KEY"]}
        async with httpx.AsyncClient(base_url=f"http://{domain}", headers=headers) as api:
            answer = await api.put(
                f"/v1/sandboxes/{sandbox.id}/egress/sandgate-policy",
                json={"policy": yaml.safe_load(POLICY.read_text())},
            )
            answer.raise_for_status()
        execution = await sandbox.commands.run(f"python3 -c {shlex.quote(AGENT)}")
        for line in execution.logs.stdout:
            print(line.text, end="")
        for line in execution.logs.stderr:
            print(line.text, end="")
        await sandbox.kill()


if __name__ == "__main__":
    asyncio.run(main())
