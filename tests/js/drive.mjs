// Drive an existing sandbox through the OpenSandbox JS SDK from npm, with the headers a client
// adds of its own, in direct mode and with `useServerProxy: true` (for the canary test,
// tests/adversarial/test_no_secret_reaches_a_sandbox.py).
//
// node drive.mjs <sandbox id> <headers as JSON>
//     reads OPEN_SANDBOX_DOMAIN and OPEN_SANDBOX_API_KEY; runs commands and file operations in
//     both modes; prints one JSON line {"ok": true, "outputs": [...]} or exits non-zero.
import assert from "node:assert/strict";
import { ConnectionConfig, Sandbox } from "@alibaba-group/opensandbox";

const [sandboxId, headersJson] = process.argv.slice(2);
const outputs = [];
for (const useServerProxy of [false, true]) {
  const sandbox = await Sandbox.connect({
    sandboxId,
    connectionConfig: new ConnectionConfig({
      domain: process.env.OPEN_SANDBOX_DOMAIN,
      apiKey: process.env.OPEN_SANDBOX_API_KEY,
      protocol: "http",
      headers: JSON.parse(headersJson),
      requestTimeoutSeconds: 30,
      useServerProxy,
    }),
  });
  const execution = await sandbox.commands.run(`echo js-${useServerProxy}`);
  outputs.push(execution.logs.stdout.map((m) => m.text).join(""));
  const path = `/tmp/js-${useServerProxy}.txt`;
  await sandbox.files.writeFiles([{ path, data: "written by the JS SDK" }]);
  assert.equal(await sandbox.files.readFile(path), "written by the JS SDK");
  await sandbox.files.createDirectories([{ path: `/tmp/js-dir-${useServerProxy}`, mode: 755 }]);
}
console.log(JSON.stringify({ ok: true, outputs }));
