// A stdio MCP client for Postern's benchmarks: the official TypeScript SDK, as Claude Code
// connects. It spawns `argv[2] ...argv[3..]` (the `postern mcp` bridge) through the SDK's
// StdioClientTransport, prints {"connected": true}, then for each line read on stdin — a JSON
// object of ssh_exec arguments — makes one tools/call and prints {"ok": true} or
// {"error": "..."} when the answer is in. The benchmark times each line's round trip.
import { createInterface } from 'node:readline';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';

const [command, ...args] = process.argv.slice(2);
const client = new Client({ name: 'postern-tsclient-bench', version: '0' });
await client.connect(new StdioClientTransport({ command, args, stderr: 'inherit' }));
process.stdout.write(JSON.stringify({ connected: true }) + '\n');

for await (const line of createInterface({ input: process.stdin })) {
  try {
    const res = await client.callTool({ name: 'ssh_exec', arguments: JSON.parse(line) });
    const state = res.structuredContent?.state;
    process.stdout.write(JSON.stringify(res.isError || state !== 'completed'
      ? { error: `ssh_exec: ${state}: ${JSON.stringify(res.content)}` } : { ok: true }) + '\n');
  } catch (err) {
    process.stdout.write(JSON.stringify({ error: String(err) }) + '\n');
  }
}
await client.close();
