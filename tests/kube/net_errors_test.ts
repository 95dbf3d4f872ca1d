/**
 * A refused, unresolvable, untrusted or silent API server is reported with its cause (endpoint, name,
 * TLS reason, timeout), through both transports (Deno fetch, and node:https for insecure-skip-tls-verify),
 * and the reflector's log line carries it.
 */
import assert from "node:assert/strict";
import { issueServerCert, makeTestPki, type TestPki } from "../../testkit/certs.ts";
import { ApiServerSimulator } from "../../testkit/apiserver.ts";
import { KubeClient } from "../../lib/kube/client.ts";
import { newNodeInformer } from "../../lib/kube/informer.ts";
import { ApiConnectionError, connectionError, type ConnectionFailure } from "../../lib/kube/net_errors.ts";
import { logLines, waitFor } from "./helpers.ts";

let pkiPromise: Promise<TestPki> | undefined;
const pki = () => pkiPromise ??= makeTestPki();

/** A loopback port nothing listens on (bound, then released). */
function closedPort(): number {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (l.addr as Deno.NetAddr).port;
  l.close();
  return port;
}

async function failure(client: KubeClient): Promise<ApiConnectionError> {
  try {
    await client.list("/api/v1/nodes");
  } catch (e) {
    assert.ok(e instanceof ApiConnectionError, `${(e as Error).name}: ${(e as Error).message}`);
    return e;
  } finally {
    client.close();
  }
  throw new Error("the request succeeded");
}

Deno.test("errors: refused, DNS failure, unknown CA, wrong name and timeout name their cause", async (t) => {
  const p = await pki();
  const refused = closedPort();
  const wrongName = await issueServerCert(p, "DNS:elsewhere.example");
  const wrongNameServer = await ApiServerSimulator.start({ tls: wrongName });
  const trusted = await ApiServerSimulator.start({ tls: { cert: p.serverCert, key: p.serverKey } });
  // Accepts connections and never answers.
  const silent = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const held: Deno.Conn[] = [];
  (async () => {
    for await (const c of silent) held.push(c);
  })();
  const silentPort = (silent.addr as Deno.NetAddr).port;
  const cases: {
    name: string;
    client: () => KubeClient;
    kind: ConnectionFailure;
    want: RegExp;
  }[] = [
    {
      name: "refused (plain http)",
      client: () => new KubeClient({ server: `http://127.0.0.1:${refused}`, source: "t" }, { qps: 0 }),
      kind: "refused",
      want: new RegExp(`^GET /api/v1/nodes: connection refused 127\\.0\\.0\\.1:${refused}`),
    },
    {
      name: "refused (insecure-skip-tls-verify, node:https)",
      client: () =>
        new KubeClient({ server: `https://127.0.0.1:${refused}`, insecure: true, source: "t" }, { qps: 0 }),
      kind: "refused",
      want: new RegExp(`connection refused 127\\.0\\.0\\.1:${refused}`),
    },
    {
      name: "unresolvable name",
      client: () => new KubeClient({ server: "https://nonexistent.invalid:6443", source: "t" }, { qps: 0 }),
      kind: "dns",
      want: /DNS lookup of "nonexistent\.invalid" failed/,
    },
    {
      name: "unresolvable name (node:https)",
      client: () =>
        new KubeClient({ server: "https://nonexistent.invalid:6443", insecure: true, source: "t" }, {
          qps: 0,
        }),
      kind: "dns",
      want: /DNS lookup of "nonexistent\.invalid" failed/,
    },
    {
      name: "unknown CA",
      client: () => new KubeClient({ server: trusted.url, source: "t" }, { qps: 0 }),
      kind: "tls",
      want:
        /TLS verification with the API server 127\.0\.0\.1:\d+ failed: .*UnknownIssuer.*certificate-authority/,
    },
    {
      name: "certificate for another name",
      client: () => new KubeClient({ server: wrongNameServer.url, caPem: p.caCert, source: "t" }, { qps: 0 }),
      kind: "tls",
      want: /TLS verification .* failed: .*not valid for name "127\.0\.0\.1".*elsewhere\.example/,
    },
    {
      name: "no answer",
      client: () =>
        new KubeClient({ server: `http://127.0.0.1:${silentPort}`, source: "t" }, {
          qps: 0,
          requestTimeoutMs: 300,
        }),
      kind: "timeout",
      want: new RegExp(`no answer from the API server 127\\.0\\.0\\.1:${silentPort} within 0\\.3 s`),
    },
  ];
  try {
    for (const c of cases) {
      await t.step(c.name, async () => {
        const e = await failure(c.client());
        assert.equal(e.kind, c.kind, e.message);
        assert.match(e.message, c.want);
        assert.ok(!/^fetch failed$/.test(e.message));
      });
    }
  } finally {
    silent.close();
    for (const c of held) c.close();
    await wrongNameServer.close();
    await trusted.close();
  }
});

Deno.test("errors: the reflector logs the cause of a refused API server", async () => {
  const port = closedPort();
  const client = new KubeClient({ server: `http://127.0.0.1:${port}`, source: "t" }, { qps: 0 });
  const inf = newNodeInformer(client, "n1", { backoff: { initialMs: 5, maxMs: 10 } });
  logLines.length = 0;
  inf.start();
  try {
    await waitFor(() => logLines.some((l) => l.includes("Failed to watch")), "a failure log line");
    const line = logLines.find((l) => l.includes("Failed to watch"))!;
    assert.match(
      line,
      new RegExp(`failed to list nodes: GET /api/v1/nodes: connection refused 127\\.0\\.0\\.1:${port}`),
    );
  } finally {
    await inf.stop();
    client.close();
  }
});

Deno.test("errors: Deno's nested fetch causes are classified without a live server", () => {
  const nested = (inner: string) =>
    new TypeError("fetch failed", {
      cause: new Error(
        `error sending request for url (https://10.0.0.1:6443/api): client error (Connect): ${inner}`,
      ),
    });
  const table: [string, ConnectionFailure, RegExp][] = [
    [
      "tcp connect error: Connection refused (os error 111)",
      "refused",
      /connection refused 10\.0\.0\.1:6443/,
    ],
    [
      "tcp connect error: Network is unreachable (os error 101)",
      "unreachable",
      /cannot reach the API server 10\.0\.0\.1:6443/,
    ],
    ["tcp connect error: No route to host (os error 113)", "unreachable", /No route to host/],
    ["invalid peer certificate: Expired", "tls", /has expired/],
    ["received fatal alert: CertificateRequired", "tls", /requires a client certificate/],
  ];
  for (const [inner, kind, want] of table) {
    const e = connectionError(nested(inner), "GET", "https://10.0.0.1:6443/api");
    assert.equal(e.kind, kind, inner);
    assert.match(e.message, want);
  }
});
