// An MCP client that authorizes itself as the MCP authorization spec describes, with the
// official TypeScript SDK: it connects without a token, and on the 401 the SDK discovers the
// protected resource metadata, then the authorization server's, and gets a token — with
// client_credentials (ClientCredentialsProvider), or with authorization code + PKCE, the
// browser's part done here by following the redirects (the test's provider logs its user in
// without a form). argv[2] is JSON:
//
//   {"url": "...", "grant": "client_credentials", "issuer": "...", "client_id": "...", "client_secret": "...",
//    "scope": "...", "calls": [{"name": "ssh_exec", "arguments": {...}}, ...]}
//   {"url": "...", "grant": "authorization_code", "client_id": "...", "scope": "...", "calls": [...]}
//
// It prints one JSON line per call — {"result": <structuredContent>, "is_error": bool} or
// {"error": "..."} — and last {"requests": ["GET http://…/.well-known/… 200", ...]}: every
// HTTP request the SDK made, in order, with its answer's status.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ClientCredentialsProvider } from '@modelcontextprotocol/sdk/client/auth-extensions.js';
import { UnauthorizedError } from '@modelcontextprotocol/sdk/client/auth.js';

const opts = JSON.parse(process.argv[2]);
const requests = [];

async function recordingFetch(url, init) {
  const res = await fetch(url, init);
  requests.push(`${init?.method ?? 'GET'} ${url} ${res.status}`);
  return res;
}

function print(obj) {
  process.stdout.write(JSON.stringify(obj) + '\n');
}

// pkceProvider is a public client with a loopback redirect URI that nothing serves: the
// authorization code is read from the redirect's Location.
function pkceProvider() {
  let tokens, verifier, authorizationUrl;
  return {
    get redirectUrl() { return 'http://127.0.0.1:9/callback'; },
    get clientMetadata() {
      return { client_name: 'postern-test', redirect_uris: ['http://127.0.0.1:9/callback'], grant_types: ['authorization_code'], token_endpoint_auth_method: 'none', scope: opts.scope };
    },
    clientInformation() { return { client_id: opts.client_id }; },
    tokens() { return tokens; },
    saveTokens(t) { tokens = t; },
    redirectToAuthorization(url) { authorizationUrl = url; },
    saveCodeVerifier(v) { verifier = v; },
    codeVerifier() { return verifier; },
    takeAuthorizationUrl() { const u = authorizationUrl; authorizationUrl = undefined; return u; },
  };
}

// followToCode plays the browser: it follows the redirects from the authorization URL until
// one goes to the redirect URI, and returns its code.
async function followToCode(url) {
  for (let i = 0; i < 10; i++) {
    const res = await fetch(url, { redirect: 'manual' });
    requests.push(`GET ${url} ${res.status}`);
    const location = res.headers.get('location');
    if (!location) throw new Error(`authorization stopped at ${url}: ${res.status} ${await res.text()}`);
    const next = new URL(location, url);
    if (next.href.startsWith('http://127.0.0.1:9/callback')) {
      const code = next.searchParams.get('code');
      if (!code) throw new Error(`redirected without a code: ${next.href}`);
      return code;
    }
    url = next.href;
  }
  throw new Error('too many redirects');
}

const url = new URL(opts.url);
let provider;
if (opts.grant === 'client_credentials') {
  provider = new ClientCredentialsProvider({ clientId: opts.client_id, clientSecret: opts.client_secret, scope: opts.scope, expectedIssuer: opts.issuer });
} else {
  provider = pkceProvider();
}
const newTransport = () => new StreamableHTTPClientTransport(url, { authProvider: provider, fetch: recordingFetch });
let client = new Client({ name: 'postern-oauth-test', version: '0' });
try {
  await client.connect(newTransport());
} catch (err) {
  if (!(err instanceof UnauthorizedError) || opts.grant !== 'authorization_code') throw err;
  // The SDK sent the user to the authorization server: follow it, then finish.
  const transport = newTransport();
  await transport.finishAuth(await followToCode(provider.takeAuthorizationUrl()));
  client = new Client({ name: 'postern-oauth-test', version: '0' });
  await client.connect(transport);
}
for (const call of opts.calls ?? []) {
  try {
    const res = await client.callTool({ name: call.name, arguments: call.arguments ?? {} });
    print({ result: res.structuredContent ?? null, is_error: !!res.isError });
  } catch (err) {
    print({ error: String(err?.message ?? err) });
  }
}
await client.close();
print({ requests });
