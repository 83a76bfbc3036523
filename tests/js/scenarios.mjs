// The client scenarios (tests/conformance/scenarios.py) through the OpenSandbox JS SDK from npm.
//
// node scenarios.mjs --list            the scenario names, as JSON
// node scenarios.mjs direct|server_proxy
//     runs every scenario in order on one sandbox and prints one JSON line per scenario:
//     {"scenario", "ok", "ms", "error"?}. A failed scenario does not stop the others; the sandbox
//     is killed at the end whatever happened. Reads OPEN_SANDBOX_DOMAIN, OPEN_SANDBOX_API_KEY and
//     SANDGATE_TEST_API_HOST (an allowed host of the test internet).
import assert from "node:assert/strict";
import { ConnectionConfig, Sandbox } from "@alibaba-group/opensandbox";

const SCENARIO_TIMEOUT_MS = 60_000;
const API_HOST = process.env.SANDGATE_TEST_API_HOST ?? "api.example.com";
const BLOCKED = "blocked.example.com";
const SECRET = "js-secret-0123456789";
const DIR = "/tmp/js-conformance";

const mode = process.argv[2];
const connection = () =>
  new ConnectionConfig({
    domain: process.env.OPEN_SANDBOX_DOMAIN,
    apiKey: process.env.OPEN_SANDBOX_API_KEY,
    protocol: "http",
    requestTimeoutSeconds: 30,
    useServerProxy: mode === "server_proxy",
  });

const joined = (messages) => messages.map((m) => m.text).join("");
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function until(what, check, timeoutMs = 15_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(100);
  }
}

async function shell(sandbox, command) {
  const execution = await sandbox.commands.run(command);
  return { code: execution.exitCode, out: joined(execution.logs.stdout), err: joined(execution.logs.stderr) };
}

async function rejects(promise) {
  try {
    await promise;
  } catch (error) {
    return error;
  }
  throw new Error("expected a rejection, got success");
}

const scenarios = {
  async create(s) {
    s.sandbox = await Sandbox.create({
      connectionConfig: connection(),
      image: process.env.SANDGATE_TEST_IMAGE ?? "sandgate/host",
      entrypoint: ["sleep", "infinity"],
      resource: { cpu: "1", memory: "512Mi" },
      env: { GREETING: "hello from create" },
      metadata: { suite: "js-sdk" },
      networkPolicy: { defaultAction: "deny", egress: [{ action: "allow", target: API_HOST }] },
      credentialProxy: { enabled: true },
      readyTimeoutSeconds: 30,
    });
    const info = await s.sandbox.getInfo();
    assert.equal(info.status.state, "Running");
    assert.equal(info.metadata.suite, "js-sdk");
    assert.equal((await shell(s.sandbox, 'printf %s "$GREETING"')).out, "hello from create");
  },

  async command_stream(s) {
    const seen = [];
    const execution = await s.sandbox.commands.run(
      'for i in 1 2 3; do echo "out $i"; echo "err $i" >&2; sleep 0.05; done',
      undefined,
      {
        onStdout: (m) => seen.push(`stdout:${m.text.trim()}`),
        onStderr: (m) => seen.push(`stderr:${m.text.trim()}`),
      },
    );
    assert.equal(execution.exitCode, 0);
    assert.ok(execution.complete, "no execution_complete event");
    assert.deepEqual(seen.filter((e) => e.startsWith("stdout:")), ["stdout:out 1", "stdout:out 2", "stdout:out 3"]);
    assert.deepEqual(seen.filter((e) => e.startsWith("stderr:")), ["stderr:err 1", "stderr:err 2", "stderr:err 3"]);
  },

  async command_exit_code(s) {
    const execution = await s.sandbox.commands.run("echo broken >&2; exit 3");
    assert.equal(execution.exitCode, 3);
    assert.equal(execution.error?.value, "3");
    assert.equal(joined(execution.logs.stderr).trim(), "broken");
  },

  async command_timeout(s) {
    const started = Date.now();
    const execution = await s.sandbox.commands.run("echo begun; sleep 30; echo never", { timeoutSeconds: 1 });
    assert.ok(Date.now() - started < 15_000, "the timeout did not stop the command");
    assert.notEqual(execution.exitCode, 0);
    assert.ok(execution.error, "a timed-out command reports an error");
    assert.equal(joined(execution.logs.stdout).trim(), "begun");
  },

  async command_background(s) {
    const execution = await s.sandbox.commands.run("echo started; sleep 0.5; echo finished", { background: true });
    assert.ok(execution.id, "a background run has an id");
    const status = await until("the background command to end", async () => {
      const current = await s.sandbox.commands.getCommandStatus(execution.id);
      return current.running ? null : current;
    });
    assert.equal(status.exitCode, 0);
    const logs = await s.sandbox.commands.getBackgroundCommandLogs(execution.id);
    assert.equal(logs.content, "started\nfinished\n");
  },

  async command_interrupt(s) {
    let id;
    let ready;
    const readyNow = new Promise((resolve) => (ready = resolve));
    const running = s.sandbox.commands.run("echo ready; sleep 60", undefined, {
      onInit: (init) => (id = init.id),
      onStdout: (m) => m.text.includes("ready") && ready(),
    });
    await readyNow;
    const started = Date.now();
    await s.sandbox.commands.interrupt(id);
    const execution = await running;
    assert.ok(Date.now() - started < 15_000, "the interrupt did not stop the command");
    assert.ok(execution.error || execution.exitCode !== 0, "an interrupted command does not succeed");
    const status = await s.sandbox.commands.getCommandStatus(id);
    assert.equal(status.running, false);
  },

  async session_run(s) {
    s.session = await s.sandbox.commands.createSession({ workingDirectory: "/tmp" });
    const first = await s.sandbox.commands.runInSession(s.session, "mkdir -p js-session && cd js-session && export KEPT=yes");
    assert.equal(first.exitCode, 0);
    const second = await s.sandbox.commands.runInSession(s.session, 'echo "$(pwd) $KEPT"');
    assert.equal(joined(second.logs.stdout).trim(), "/tmp/js-session yes");
  },

  async session_delete(s) {
    await s.sandbox.commands.deleteSession(s.session);
    await rejects(s.sandbox.commands.runInSession(s.session, "true"));
  },

  async files_write_read(s) {
    const bytes = Uint8Array.from([0, 1, 2, 253, 254, 255]);
    await s.sandbox.files.writeFiles([
      { path: `${DIR}/a.txt`, data: "alpha\nbeta\n", mode: 644 },
      { path: `${DIR}/b.bin`, data: bytes },
    ]);
    assert.equal(await s.sandbox.files.readFile(`${DIR}/a.txt`), "alpha\nbeta\n");
    assert.deepEqual(await s.sandbox.files.readBytes(`${DIR}/b.bin`), bytes);
    const info = (await s.sandbox.files.getFileInfo([`${DIR}/a.txt`]))[`${DIR}/a.txt`];
    assert.equal(info.size, 11);
    assert.equal(info.mode, 644);
    const listed = (await s.sandbox.files.listDirectory({ path: DIR })).map((f) => f.path).sort();
    assert.deepEqual(listed, [`${DIR}/a.txt`, `${DIR}/b.bin`]);
    const found = (await s.sandbox.files.search({ path: DIR, pattern: "*.txt" })).map((f) => f.path);
    assert.deepEqual(found, [`${DIR}/a.txt`]);
  },

  async create_directories(s) {
    await s.sandbox.files.createDirectories([{ path: `${DIR}/d1/d2`, mode: 750 }]);
    const info = (await s.sandbox.files.getFileInfo([`${DIR}/d1/d2`]))[`${DIR}/d1/d2`];
    assert.equal(info.type, "directory");
    assert.equal(info.mode, 750);
  },

  async delete_files(s) {
    await s.sandbox.files.writeFiles([{ path: `${DIR}/gone.txt`, data: "soon gone" }]);
    await s.sandbox.files.deleteFiles([`${DIR}/gone.txt`]);
    assert.equal((await shell(s.sandbox, `test -e ${DIR}/gone.txt`)).code, 1);
  },

  async delete_directories(s) {
    await s.sandbox.files.writeFiles([{ path: `${DIR}/tree/sub/leaf.txt`, data: "leaf" }]);
    await s.sandbox.files.deleteDirectories([`${DIR}/tree`]);
    assert.equal((await shell(s.sandbox, `test -e ${DIR}/tree`)).code, 1);
  },

  async replace_move_chmod(s) {
    await s.sandbox.files.writeFiles([{ path: `${DIR}/r.txt`, data: "hello world" }]);
    await s.sandbox.files.replaceContents([{ path: `${DIR}/r.txt`, oldContent: "world", newContent: "sandgate" }]);
    await s.sandbox.files.moveFiles([{ src: `${DIR}/r.txt`, dest: `${DIR}/moved.txt` }]);
    await s.sandbox.files.setPermissions([{ path: `${DIR}/moved.txt`, mode: 600 }]);
    assert.equal(await s.sandbox.files.readFile(`${DIR}/moved.txt`), "hello sandgate");
    assert.equal((await s.sandbox.files.getFileInfo([`${DIR}/moved.txt`]))[`${DIR}/moved.txt`].mode, 600);
    assert.equal((await shell(s.sandbox, `test -e ${DIR}/r.txt`)).code, 1);
  },

  async metrics(s) {
    const metrics = await s.sandbox.getMetrics();
    assert.ok(metrics.cpuCount > 0, JSON.stringify(metrics));
    assert.ok(metrics.memoryTotalMiB > 0, JSON.stringify(metrics));
    assert.ok(metrics.memoryUsedMiB >= 0 && metrics.memoryUsedMiB <= metrics.memoryTotalMiB);
  },

  async endpoints(s) {
    // Direct mode: the endpoint and its headers alone reach execd (no API key); server-proxy
    // mode: the server's /proxy route, opened by the API key.
    const execd = await s.sandbox.getEndpoint(44772);
    const url = await s.sandbox.getEndpointUrl(44772);
    assert.equal(url, `http://${execd.endpoint}`);
    const viaServer = `/sandboxes/${s.sandbox.id}/proxy/44772`;
    const headers = { ...(execd.headers ?? {}) };
    if (mode === "server_proxy") {
      assert.ok(execd.endpoint.endsWith(viaServer), execd.endpoint);
      headers["OPEN-SANDBOX-API-KEY"] = process.env.OPEN_SANDBOX_API_KEY;
    }
    assert.equal((await fetch(`${url}/ping`, { headers })).status, 200);
    // the egress API: at the proxied egress port in server-proxy mode, as OpenSandbox answers
    const egress = await s.sandbox.getEndpoint(18080);
    const egressPath = mode === "server_proxy" ? "proxy/18080" : "egress";
    assert.ok(egress.endpoint.endsWith(`/sandboxes/${s.sandbox.id}/${egressPath}`), egress.endpoint);
  },

  async egress(s) {
    const targets = async () => (await s.sandbox.getEgressPolicy()).egress.map((r) => `${r.action}:${r.target}`);
    assert.deepEqual(await targets(), [`allow:${API_HOST}`]);
    await s.sandbox.patchEgressRules([{ action: "deny", target: BLOCKED }]);
    assert.deepEqual(await targets(), [`deny:${BLOCKED}`, `allow:${API_HOST}`]);
    await s.sandbox.deleteEgressRules([BLOCKED]);
    assert.deepEqual(await targets(), [`allow:${API_HOST}`]);
  },

  async credential_vault(s) {
    const vault = s.sandbox.credentialVault;
    const created = await vault.create({
      credentials: [{ name: "api-token", source: { type: "inline", value: SECRET } }],
      bindings: [{ name: "api", match: { hosts: [API_HOST] }, auth: { type: "bearer", credential: "api-token" } }],
    });
    assert.equal(created.revision, 1);
    const state = await vault.get();
    assert.deepEqual(state.credentials.map((c) => c.name), ["api-token"]);
    assert.ok(!JSON.stringify(state).includes(SECRET), "the vault state shows the secret");
  },

  async pause_resume(s) {
    await s.sandbox.files.writeFiles([{ path: `${DIR}/kept.txt`, data: "kept across pause" }]);
    await s.sandbox.pause();
    assert.equal((await s.sandbox.getInfo()).status.state, "Paused");
    s.sandbox = await s.sandbox.resume({ readyTimeoutSeconds: 30 }); // shares the old one's transport
    assert.equal((await s.sandbox.getInfo()).status.state, "Running");
    assert.equal(await s.sandbox.files.readFile(`${DIR}/kept.txt`), "kept across pause");
    assert.equal((await shell(s.sandbox, "echo again")).out.trim(), "again");
  },

  async connect(s) {
    const other = await Sandbox.connect({ sandboxId: s.sandbox.id, connectionConfig: connection() });
    try {
      assert.equal((await shell(other, "echo connected")).out.trim(), "connected");
      assert.equal(await other.files.readFile(`${DIR}/kept.txt`), "kept across pause");
    } finally {
      await other.close();
    }
  },

  async kill(s) {
    await s.sandbox.kill();
    s.killed = true;
    const error = await rejects(s.sandbox.getInfo());
    assert.equal(error.error?.code, "NOT_FOUND", String(error));
  },
};

function withTimeout(promise, ms, name) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${name} took more than ${ms} ms`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

async function main() {
  if (mode === "--list") {
    console.log(JSON.stringify(Object.keys(scenarios)));
    return;
  }
  if (mode !== "direct" && mode !== "server_proxy") throw new Error(`unknown mode ${mode}`);
  const state = {};
  try {
    for (const [name, scenario] of Object.entries(scenarios)) {
      const started = Date.now();
      const result = { scenario: name, ok: true };
      try {
        await withTimeout(scenario(state), SCENARIO_TIMEOUT_MS, name);
      } catch (error) {
        const cause = error?.cause ? `\ncaused by: ${error.cause?.stack ?? error.cause}` : "";
        Object.assign(result, { ok: false, error: `${error?.stack ?? error}${cause}` });
      }
      console.log(JSON.stringify({ ...result, ms: Date.now() - started }));
    }
  } finally {
    if (state.sandbox && !state.killed) await state.sandbox.kill().catch(() => {});
    await state.sandbox?.close();
  }
}

await main();
