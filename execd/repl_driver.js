// The JavaScript side of a code context: one persistent Node.js realm that runs cells like a
// Jupyter JavaScript kernel. execd starts it as `node repl_driver.js FD MARKER`.
//
// Rules (the same protocol as repl_driver.py, whose docstring is the reference):
// 1. Node's own modules only; nothing of execd or sandgate. Frames on the socket FD are a 4-byte
//    big-endian length and a UTF-8 JSON object: execd sends {op: "run", code, count}; the driver
//    answers {op: "ready"} once, {op: "result", data: {mime: value}} per value shown and
//    {op: "done", error: null | {ename, evalue, traceback}} when the cell ends.
// 2. Output is not framed: console.log and child processes write to fds 1 and 2 (synchronous
//    pipes on Linux); after each cell the driver writes MARKER to both, so execd knows the
//    cell's output is complete.
// 3. A cell is a script in the one realm: `var`, functions and top-level `let`/`const` persist
//    from cell to cell, `require` resolves from the context's cwd. The cell's completion value
//    is shown (util.inspect, as the Node REPL shows it) unless it is undefined; a Promise is
//    awaited first and a rejection is the cell's error. A cell that uses top-level `await` runs
//    as an async function: its declarations stay inside that cell (use globalThis.x = ...).
// 4. SIGINT (execd's interrupt) stops a running cell (vm's breakOnSigint) or abandons the promise
//    it awaits; the realm and its state survive. An error thrown between cells (a timer, an
//    unhandled rejection) is printed to stderr and never ends the context.
"use strict";

const fs = require("fs");
const net = require("net");
const path = require("path");
const util = require("util");
const vm = require("vm");
const { createRequire } = require("module");

const MAX_TEXT = 2 * 1024 * 1024;
const channel = new net.Socket({ fd: Number(process.argv[2]), readable: true, writable: true });
const marker = process.argv[3];
let interruptCell = null; // rejects the awaited promise of the running cell

function send(message) {
  const body = Buffer.from(JSON.stringify(message), "utf8");
  const header = Buffer.alloc(4);
  header.writeUInt32BE(body.length);
  channel.write(Buffer.concat([header, body]));
}

function clean(text) {
  return text.length <= MAX_TEXT ? text : text.slice(0, MAX_TEXT) + "\n[... truncated by execd]";
}

function show(value) {
  send({ op: "result", data: { "text/plain": clean(util.inspect(value)) } });
}

// The stack up to the frames of vm and of this driver (what ran the cell, not the user's code).
function userStack(stack) {
  const lines = stack.split("\n");
  const end = lines.findIndex((line) => line.includes("node:vm") || line.includes(__filename));
  return end < 0 ? lines : lines.slice(0, end);
}

function describe(error) {
  if (error instanceof Error || (error && typeof error.stack === "string")) {
    return {
      ename: String(error.name || "Error"),
      evalue: clean(String(error.message)),
      traceback: userStack(clean(String(error.stack || `${error.name}: ${error.message}`))),
    };
  }
  const text = clean(util.inspect(error));
  return { ename: "Error", evalue: text, traceback: [`Uncaught ${text}`] };
}

function compile(code, filename) {
  try {
    return { script: new vm.Script(code, { filename }), isAsync: false };
  } catch (error) {
    if (!(error instanceof SyntaxError) || !/\bawait\b/.test(code)) throw error;
    const wrapped = `(async () => {\n${code}\n})()`;
    return { script: new vm.Script(wrapped, { filename, lineOffset: -1 }), isAsync: true };
  }
}

async function runCell(code, count) {
  const { script, isAsync } = compile(code, `<cell ${count}>`);
  let value = script.runInThisContext({ breakOnSigint: true, displayErrors: false });
  if (value && typeof value.then === "function") {
    value = await new Promise((resolve, reject) => {
      interruptCell = () => reject(new Error("Script execution was interrupted by `SIGINT`"));
      value.then(resolve, reject);
    });
  }
  if (value !== undefined && !isAsync) show(value);
}

function endOutput() {
  for (const fd of [1, 2]) {
    try {
      fs.writeSync(fd, marker);
    } catch (error) {
      // a cell may have closed the fd; execd then sees EOF instead of the marker
    }
  }
}

async function serve(request) {
  let error = null;
  try {
    await runCell(request.code, request.count);
  } catch (caught) {
    error = describe(caught);
  } finally {
    interruptCell = null;
  }
  endOutput();
  send({ op: "done", error });
}

function main() {
  const cwdRequire = createRequire(path.join(process.cwd(), "<repl>"));
  Object.assign(globalThis, { require: cwdRequire, display: (...values) => values.forEach(show) });
  process.on("SIGINT", () => interruptCell && interruptCell());
  process.on("uncaughtException", (error) => console.error("Uncaught", error));
  process.on("unhandledRejection", (reason) => console.error("Unhandled rejection:", reason));
  let pending = Buffer.alloc(0);
  let queue = Promise.resolve();
  channel.on("data", (chunk) => {
    pending = Buffer.concat([pending, chunk]);
    while (pending.length >= 4 && pending.length >= 4 + pending.readUInt32BE(0)) {
      const size = pending.readUInt32BE(0);
      const request = JSON.parse(pending.subarray(4, 4 + size).toString("utf8"));
      pending = pending.subarray(4 + size);
      if (request.op === "run") queue = queue.then(() => serve(request));
    }
  });
  channel.on("close", () => process.exit(0));
  channel.on("error", () => process.exit(0));
  send({ op: "ready", pid: process.pid, node: process.version });
}

main();
