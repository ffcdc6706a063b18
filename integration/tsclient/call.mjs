// A real MCP client for Postern's integration tests: the official TypeScript SDK, driven by a
// script of steps given as JSON in argv[2]. Each step prints one JSON line on stdout.
//
//   {"connect": {"url": "...", "token": "...", "run": "..."}}     Streamable HTTP
//   {"connect": {"command": "/path/postern", "args": ["mcp", ...]}} stdio (spawns the bridge)
//   {"call": {"name": "ssh_exec", "arguments": {...}},
//    "timeout_ms": 500,        the SDK's request timeout (it then sends notifications/cancelled)
//    "abort_after_ms": 500,    an AbortSignal fired after this long (same)
//    "hold_ms": 2000,          hold the response this long before the SDK sees it, as a busy
//                              client would (the bytes are received; the SDK's timer runs)
//    "reset_on_progress": true} send a progress token, count the notifications, and let each
//                              one reset the SDK's timeout (resetTimeoutOnProgress)
//   {"sleep_ms": 3000}   wait (a token's expiry)
//   {"close": true}
//
// A call prints {"step": i, "result": <structuredContent>, "text": "<the text content the
// model reads>", "is_error": bool, "progress": <notifications heard>} or {"step": i, "error": "..."}.
// Before the next step, every notifications/cancelled POST the SDK sent has been answered.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';

const steps = JSON.parse(process.argv[2]);
const pendingCancels = new Set();
let holdMs = 0;

// fetchTrackingCancels is fetch that remembers the notifications/cancelled POSTs in flight.
function fetchTrackingCancels(url, init) {
  const p = fetch(url, init);
  if (typeof init?.body === 'string' && init.body.includes('"notifications/cancelled"')) {
    const settled = p.then(() => {}, () => {});
    pendingCancels.add(settled);
    settled.then(() => pendingCancels.delete(settled));
  }
  return p;
}

// holdResponses delays the responses a transport hands to the SDK by holdMs (when set).
function holdResponses(transport) {
  const start = transport.start.bind(transport);
  transport.start = async () => {
    const deliver = transport.onmessage;
    transport.onmessage = (msg, extra) => {
      if (holdMs > 0 && msg.id !== undefined && (msg.result !== undefined || msg.error !== undefined)) {
        setTimeout(() => deliver(msg, extra), holdMs);
        return;
      }
      deliver(msg, extra);
    };
    return start();
  };
  return transport;
}

function print(obj) {
  process.stdout.write(JSON.stringify(obj) + '\n');
}

let client;
for (const [i, step] of steps.entries()) {
  if (step.connect) {
    const c = step.connect;
    let transport;
    if (c.url) {
      const headers = { Authorization: `Bearer ${c.token}` };
      if (c.run) headers['Postern-Run'] = c.run;
      transport = new StreamableHTTPClientTransport(new URL(c.url), {
        requestInit: { headers },
        fetch: fetchTrackingCancels,
      });
    } else {
      transport = new StdioClientTransport({ command: c.command, args: c.args ?? [], stderr: 'inherit' });
    }
    client = new Client({ name: 'postern-tsclient', version: '0' });
    await client.connect(holdResponses(transport));
    print({ step: i, connected: true });
  } else if (step.call) {
    const options = {};
    if (step.timeout_ms) options.timeout = step.timeout_ms;
    if (step.abort_after_ms) {
      const ac = new AbortController();
      setTimeout(() => ac.abort('the agent gave up'), step.abort_after_ms);
      options.signal = ac.signal;
    }
    let progress = 0;
    if (step.reset_on_progress) {
      options.onprogress = () => { progress++; };
      options.resetTimeoutOnProgress = true;
    }
    holdMs = step.hold_ms ?? 0;
    try {
      const res = await client.callTool(step.call, CallToolResultSchema, options);
      const text = (res.content ?? []).filter((c) => c.type === 'text').map((c) => c.text).join('\n');
      print({ step: i, result: res.structuredContent ?? null, text, is_error: res.isError ?? false, progress });
    } catch (err) {
      print({ step: i, error: String(err?.message ?? err), progress });
    }
    holdMs = 0;
    // The SDK does not await its cancel; a test's next step must come after it.
    await Promise.all([...pendingCancels]);
  } else if (step.sleep_ms) {
    await new Promise((resolve) => setTimeout(resolve, step.sleep_ms));
    print({ step: i, slept: true });
  } else if (step.close) {
    await client.close();
    print({ step: i, closed: true });
  }
}
process.exit(0);
