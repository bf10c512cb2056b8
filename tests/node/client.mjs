// gitdrop's MCP server seen by the official TypeScript SDK: list the tools, then
// register, send and check_inbox, over stdio or streamable HTTP.
//   node client.mjs stdio PYTHON HUB     (spawns python -m gitdrop.mcp.server HUB lobby --as ...)
//   node client.mjs http URL
//   node client.mjs pingpong PYTHON HUB ROUNDS   (bench/bench_mcp.py: two registered
//     agents core/ada and core/bob take turns; prints each call's milliseconds)
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [mode, target, hub] = process.argv.slice(2);

async function connect(transport) {
  const client = new Client({ name: "gitdrop-node-check", version: "1.0.0" });
  await client.connect(transport);
  return client;
}

async function call(client, name, args) {
  const r = await client.callTool({ name, arguments: args });
  if (r.isError) throw new Error(`${name} refused: ${r.content?.[0]?.text}`);
  if (!r.structuredContent) throw new Error(`${name} returned no structured content`);
  return r.structuredContent;
}

function stdio(agent) {
  return new StdioClientTransport({
    command: target,
    args: ["-m", "gitdrop.mcp.server", hub, "lobby", "--as", agent],
    stderr: "inherit",
  });
}

function http(token) {
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  return new StreamableHTTPClientTransport(new URL(target), { requestInit: { headers } });
}

const out = {};
if (mode === "pingpong") {
  const a = await connect(stdio("core/ada"));
  const b = await connect(stdio("core/bob"));
  out.send = [];
  out.check_inbox = [];
  const rounds = Number(process.argv[5]);
  for (let i = 0; i < rounds + 5; i++) {
    for (const [me, other, name] of [[a, b, "core/bob"], [b, a, "core/ada"]]) {
      const t0 = performance.now();
      await call(me, "send", { to_agent: name, message: `ping ${i}` });
      const t1 = performance.now();
      const got = await call(other, "check_inbox", {});
      const t2 = performance.now();
      if (got.messages.length !== 1) throw new Error(`expected one message, got ${got.messages.length}`);
      if (i >= 5) {  // the first five rounds warm up
        out.send.push(t1 - t0);
        out.check_inbox.push(t2 - t1);
      }
    }
  }
  await a.close();
  await b.close();
} else if (mode === "stdio") {
  // two agents, one server process each (--as binds the process)
  const a = await connect(stdio("node/ada"));
  const b = await connect(stdio("node/bob"));
  out.tools = (await a.listTools()).tools.map((t) => t.name);
  out.register = [await call(a, "register", { role: "lead" }), await call(b, "register", {})];
  out.send = await call(a, "send", { to_agent: "bob", message: "hello from node" });
  out.inbox = await call(b, "check_inbox", { limit: 5 });
  await a.close();
  await b.close();
} else {
  // register without a token gives one; every later call carries it
  const anon = await connect(http());
  out.tools = (await anon.listTools()).tools.map((t) => t.name);
  const ra = await call(anon, "register", { agent_name: "ada", team: "node", role: "lead" });
  const rb = await call(anon, "register", { agent_name: "bob", team: "node" });
  out.register = [ra, rb];
  const refused = await anon.callTool({ name: "send", arguments: { to_agent: "bob", message: "x" } });
  out.refused_without_token = refused.isError === true;
  await anon.close();
  const a = await connect(http(ra.token));
  const b = await connect(http(rb.token));
  out.send = await call(a, "send", { to_agent: "bob", message: "hello from node" });
  out.inbox = await call(b, "check_inbox", { limit: 5 });
  await a.close();
  await b.close();
}
console.log(JSON.stringify(out));
