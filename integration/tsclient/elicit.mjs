// An MCP client that declares the elicitation capability and answers Postern's approval
// forms (the official TypeScript SDK, through the stdio bridge `postern mcp`), driven by a
// script of steps given as JSON in argv[2]. Each step prints one JSON line on stdout.
//
//   {"connect": {"command": "/path/postern", "args": ["mcp", ...]}}   stdio (the bridge)
//   {"connect": {"url": "...", "token": "...", "run": "..."}}          Streamable HTTP
//   {"answer": "approve"|"deny"|"decline"|"cancel", "note": "..."}   how to answer from now on
//   {"call": {"name": "ssh_exec", "arguments": {...}}}
//
// A call prints {"step": i, "result": <structuredContent>, "asked": <elicitations so far>,
// "messages": [<their messages>]} or {"step": i, "error": "..."}.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CallToolResultSchema, ElicitRequestSchema } from '@modelcontextprotocol/sdk/types.js';

const steps = JSON.parse(process.argv[2]);
let answer = { action: 'decline' };
const messages = [];

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
      print({ step: i, result: res.structuredContent ?? null, asked: messages.length, messages });
    } catch (err) {
      print({ step: i, error: String(err?.message ?? err), asked: messages.length });
    }
  }
}
await client?.close();
process.exit(0);
