// An MCP client that declares the elicitation capability and answers Postern's approval
// forms (the official TypeScript SDK, through the stdio bridge `postern mcp`), driven by a
// script of steps given as JSON in argv[2]. Each step prints one JSON line on stdout.
//
//   {"connect": {"command": "/path/postern", "args": ["mcp", ...]}}   stdio (the bridge)
//   {"connect": {"url": "...", "token": "...", "run": "..."}}          Streamable HTTP
//   {"answer": "approve"|"deny"|"decline"|"cancel", "note": "..."}   how to answer from now on
//   {"call": {"name": "ssh_exec", "arguments": {...}}}
//   {"forge": {"socket": "/path/postern.sock", "decision": "approve"}}
//       a child of this client (curl) sends postern/approval for the last call's execution
//       to the daemon itself, naming this client as its parent as a bridge does; prints
//       {"step": i, "forged": <the daemon's answer>}
//   {"forge": {"socket": "/path/postern.sock", "call": {"name": ..., "arguments": ...}}}
//       the same child sends that tools/call, as a bridge whose client declared elicitation
//
// A call prints {"step": i, "result": <structuredContent>, "asked": <elicitations so far>,
// "messages": [<their messages>]} or {"step": i, "error": "..."}.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CallToolResultSchema, ElicitRequestSchema } from '@modelcontextprotocol/sdk/types.js';
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';

const steps = JSON.parse(process.argv[2]);
let answer = { action: 'decline' };
const messages = [];
let lastExecution = '';

// selfRef is this process as a bridge names its parent: "<pid>-<start ticks>" (/proc).
function selfRef() {
  const stat = readFileSync('/proc/self/stat', 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return `${process.pid}-${fields[19]}`;
}

function print(obj) {
  process.stdout.write(JSON.stringify(obj) + '\n');
}

let client;
for (const [i, step] of steps.entries()) {
  if (step.connect) {
    const c = step.connect;
    client = new Client({ name: 'postern-tsclient-elicit', version: '0' }, { capabilities: { elicitation: { form: {} } } });
    client.setRequestHandler(ElicitRequestSchema, async req => {
      messages.push(req.params.message);
      return answer;
    });
    let transport;
    if (c.url) {
      const headers = { Authorization: `Bearer ${c.token}` };
      if (c.run) headers['Postern-Run'] = c.run;
      transport = new StreamableHTTPClientTransport(new URL(c.url), { requestInit: { headers } });
    } else {
      transport = new StdioClientTransport({ command: c.command, args: c.args ?? [], stderr: 'inherit' });
    }
    await client.connect(transport);
    print({ step: i, connected: true });
  } else if (step.answer) {
    answer = step.answer === 'approve' || step.answer === 'deny'
      ? { action: 'accept', content: { decision: step.answer, note: step.note ?? '' } }
      : { action: step.answer };
    print({ step: i, answer: step.answer });
  } else if (step.call) {
    try {
      const res = await client.callTool(step.call, CallToolResultSchema, { timeout: 60000 });
      lastExecution = res.structuredContent?.execution_id ?? lastExecution;
      print({ step: i, result: res.structuredContent ?? null, asked: messages.length, messages });
    } catch (err) {
      print({ step: i, error: String(err?.message ?? err), asked: messages.length });
    }
  } else if (step.forge) {
    const msg = step.forge.call
      ? { jsonrpc: '2.0', id: 1, method: 'tools/call', params: step.forge.call }
      : { jsonrpc: '2.0', id: 1, method: 'postern/approval',
          params: { execution_id: lastExecution, decision: step.forge.decision, note: 'forged' } };
    const out = spawnSync('curl', ['-sS', '--unix-socket', step.forge.socket, '-X', 'POST',
      '-H', 'Content-Type: application/json', '-H', 'Accept: application/json, text/event-stream',
      '-H', 'Mcp-Protocol-Version: 2025-11-25', '-H', `Postern-Bridge-Parent: ${selfRef()}`,
      '-H', 'Postern-Bridge-Elicitation: form',
      '--data-binary', JSON.stringify(msg), 'http://localhost/mcp'], { encoding: 'utf8' });
    print({ step: i, forged: (out.stdout ?? '') + (out.stderr ?? '') });
  }
}
await client?.close();
process.exit(0);
