// MCP tasks through the official TypeScript SDK's experimental tasks client
// (client.experimental.tasks), driven by a script of steps given as JSON in argv[2]. Each
// step prints one JSON line on stdout.
//
//   {"connect": {"url": "...", "token": "...", "run": "..."}}     Streamable HTTP
//   {"connect": {"command": "/path/postern", "args": ["mcp", ...]}} stdio (spawns the bridge)
//   {"capabilities": true}      the server's capabilities.tasks and each tool's taskSupport
//   {"task": {"name": "ssh_exec", "arguments": {...}}, "ttl": 60000}
//                               a task-augmented tools/call (callToolStream, first message)
//   {"stream": {"name": ..., "arguments": {...}}}   callToolStream to its end
//   {"get": "ex_…"}             tasks/get ("$last": the task the last "task" step created)
//   {"result": "ex_…", "timeout_ms": 60000, "progress": true}
//                               tasks/result (blocks until terminal); with progress, each
//                               progress notification is printed as it arrives
//                               ({"progress_event"}) and all of them with the result
//   {"list": true, "cursor": "…"}                   tasks/list
//   {"cancel": "ex_…"}          tasks/cancel
//   {"wait_for": "/path"}       wait until the file exists (the test did something meanwhile)
//
// Errors print {"step": i, "error": "...", "code": n}.
import { existsSync } from 'node:fs';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';

const steps = JSON.parse(process.argv[2]);

function print(obj) {
  process.stdout.write(JSON.stringify(obj) + '\n');
}

let client;
let lastTask = ''; // "$last" in a step names the task the last "task" step created
const id = v => (v === '$last' ? lastTask : v);
for (const [i, step] of steps.entries()) {
  try {
    if (step.connect) {
      const c = step.connect;
      let transport;
      if (c.url) {
        const headers = { Authorization: `Bearer ${c.token}` };
        if (c.run) headers['Postern-Run'] = c.run;
        transport = new StreamableHTTPClientTransport(new URL(c.url), { requestInit: { headers } });
      } else {
        transport = new StdioClientTransport({ command: c.command, args: c.args ?? [], stderr: 'inherit' });
      }
      client = new Client({ name: 'postern-tsclient-tasks', version: '0' });
      await client.connect(transport);
      print({ step: i, connected: true });
    } else if (step.capabilities) {
      const { tools } = await client.listTools();
      const support = Object.fromEntries(tools.map(t => [t.name, t.execution?.taskSupport ?? null]));
      print({ step: i, tasks_capability: client.getServerCapabilities()?.tasks ?? null, task_support: support });
    } else if (step.task) {
      const stream = client.experimental.tasks.callToolStream(step.task, CallToolResultSchema, { task: { ttl: step.ttl ?? 60000 } });
      for await (const msg of stream) {
        if (msg.type === 'taskCreated') {
          lastTask = msg.task.taskId;
          print({ step: i, task: msg.task });
        } else if (msg.type === 'error') {
          print({ step: i, error: String(msg.error?.message ?? msg.error), code: msg.error?.code });
        } else {
          continue;
        }
        break; // the rest is fetched later, by id
      }
    } else if (step.stream) {
      const statuses = [];
      let created;
      for await (const msg of client.experimental.tasks.callToolStream(step.stream, CallToolResultSchema, { task: { ttl: 60000 } })) {
        if (msg.type === 'taskCreated') created = msg.task;
        if (msg.type === 'taskStatus') statuses.push(msg.task.status);
        if (msg.type === 'result') print({ step: i, task: created, statuses, result: msg.result.structuredContent ?? null, is_error: msg.result.isError ?? false });
        if (msg.type === 'error') print({ step: i, task: created, statuses, error: String(msg.error?.message ?? msg.error), code: msg.error?.code });
      }
    } else if (step.get) {
      print({ step: i, task: await client.experimental.tasks.getTask(id(step.get)) });
    } else if (step.result) {
      const progress = [];
      const options = { timeout: step.timeout_ms ?? 60000 };
      if (step.progress) {
        options.onprogress = p => {
          progress.push(p.message ?? '');
          print({ step: i, progress_event: p.message ?? '' }); // as it arrives
        };
      }
      const res = await client.experimental.tasks.getTaskResult(id(step.result), CallToolResultSchema, options);
      const line = { step: i, result: res.structuredContent ?? null, is_error: res.isError ?? false, text: res.content?.[0]?.text ?? '', meta: res._meta ?? null };
      if (step.progress) line.progress = progress;
      print(line);
    } else if (step.list) {
      const page = await client.experimental.tasks.listTasks(step.cursor);
      print({ step: i, tasks: page.tasks, next_cursor: page.nextCursor ?? '' });
    } else if (step.cancel) {
      print({ step: i, task: await client.experimental.tasks.cancelTask(id(step.cancel)) });
    } else if (step.wait_for) {
      while (!existsSync(step.wait_for)) await new Promise(r => setTimeout(r, 50));
      print({ step: i, waited: true });
    } else if (step.close) {
      await client.close();
      print({ step: i, closed: true });
    }
  } catch (err) {
    print({ step: i, error: String(err?.message ?? err), code: err?.code });
  }
}
process.exit(0);
