/**
 * The API client's `rest_client_*` families: what a real HTTP exchange with a local server records (codes,
 * verbs, host, latencies, sizes, rate-limiter waits), what watches record, and the exec plugin's calls and
 * certificate TTL. Each test uses its own server port, so its `host` label keeps its series apart.
 */
import assert from "node:assert/strict";
import { KubeClient } from "../../lib/kube/client.ts";
import {
  hostLabel,
  resetExecCertificate,
  restClientExecPluginCalls,
  restClientExecPluginRotationAge,
  restClientExecPluginTTL,
  restClientRateLimiterDuration,
  restClientRequestDuration,
  restClientRequestSize,
  restClientRequestsTotal,
  restClientResponseSize,
} from "../../lib/kube/client_metrics.ts";
import { ExecAuthenticator } from "../../lib/kube/exec_credential.ts";
import { issueCert, makeCA } from "../../testkit/certs.ts";
import { metricsText } from "../../lib/metrics.ts";
import "./helpers.ts";

type Labels = Partial<Record<string, string | number>>;

/** The value of a counter or gauge series (undefined: no series with exactly these labels). */
async function value(m: { get(): Promise<{ values: { value: number; labels: Labels }[] }> }, labels: Labels) {
  const v = (await m.get()).values.find((s) =>
    Object.keys(labels).length === Object.keys(s.labels).length &&
    Object.entries(labels).every(([k, x]) => String(s.labels[k]) === String(x))
  );
  return v?.value;
}

/** A histogram series' count and sum. */
async function histogram(
  m: { get(): Promise<{ values: { value: number; labels: Labels; metricName?: string }[] }> },
  labels: Labels,
) {
  const vals = (await m.get()).values.filter((s) =>
    Object.entries(labels).every(([k, x]) => String(s.labels[k]) === String(x))
  );
  const count = vals.find((s) => s.metricName?.endsWith("_count"))?.value;
  const sum = vals.find((s) => s.metricName?.endsWith("_sum"))?.value;
  return { count, sum };
}

/** A local API-like server: answers by `handler`; returns the client's host label and a stop function. */
function serve(handler: (req: Request) => Response | Promise<Response>) {
  const ac = new AbortController();
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, signal: ac.signal, onListen() {} }, handler);
  const host = `127.0.0.1:${server.addr.port}`;
  return {
    host,
    url: `http://${host}`,
    stop: async () => {
      ac.abort();
      await server.finished;
    },
  };
}

Deno.test("rest_client metrics: each response counts by code, method and host; sizes are the bytes sent and received", async () => {
  const body = JSON.stringify({ kind: "Service", metadata: { name: "ü" } });
  const s = serve(async (req) => {
    if (req.method === "POST") {
      await req.text();
      return new Response(body, { status: 201, headers: { "content-type": "application/json" } });
    }
    if (new URL(req.url).pathname === "/missing") {
      return Response.json({ kind: "Status", reason: "NotFound", message: "nope", code: 404 }, {
        status: 404,
      });
    }
    return new Response(body, { headers: { "content-type": "application/json" } });
  });
  const c = new KubeClient({ server: s.url, source: "t" }, { qps: 0 });
  try {
    await c.get("/api/v1/namespaces/default/services/a");
    await c.get("/api/v1/namespaces/default/services/a");
    await assert.rejects(c.get("/missing"), /404/);
    const posted = { kind: "Service", metadata: { name: "é" } };
    await c.create("/api/v1/namespaces/default/services", posted);

    assert.equal(await value(restClientRequestsTotal, { code: "200", method: "GET", host: s.host }), 2);
    assert.equal(await value(restClientRequestsTotal, { code: "404", method: "GET", host: s.host }), 1);
    assert.equal(await value(restClientRequestsTotal, { code: "201", method: "POST", host: s.host }), 1);

    const get = await histogram(restClientRequestDuration, { verb: "GET", host: s.host });
    assert.equal(get.count, 3);
    assert.ok(get.sum! > 0);
    assert.equal((await histogram(restClientRequestDuration, { verb: "POST", host: s.host })).count, 1);

    // GETs send no body (observed as 0, as client-go's ContentLength); the POST its UTF-8 bytes.
    assert.deepEqual(await histogram(restClientRequestSize, { verb: "GET", host: s.host }), {
      count: 3,
      sum: 0,
    });
    const postBytes = new TextEncoder().encode(JSON.stringify(posted)).byteLength;
    assert.deepEqual(await histogram(restClientRequestSize, { verb: "POST", host: s.host }), {
      count: 1,
      sum: postBytes,
    });
    const bodyBytes = new TextEncoder().encode(body).byteLength;
    const notFoundBytes = new TextEncoder().encode(
      JSON.stringify({ kind: "Status", reason: "NotFound", message: "nope", code: 404 }),
    ).byteLength;
    assert.deepEqual(await histogram(restClientResponseSize, { verb: "GET", host: s.host }), {
      count: 3,
      sum: 2 * bodyBytes + notFoundBytes,
    });
    // Every non-watch request passed the rate limiter (unlimited here: no wait, still observed).
    assert.equal((await histogram(restClientRateLimiterDuration, { verb: "GET", host: s.host })).count, 3);
  } finally {
    c.close();
    await s.stop();
  }
});

Deno.test("rest_client metrics: the rate limiter's wait is observed per request", async () => {
  const s = serve(() => Response.json({ kind: "List", items: [] }));
  // 20 per second, burst 1: the second and third requests each wait about 50 ms for a token.
  const c = new KubeClient({ server: s.url, source: "t" }, { qps: 20, burst: 1 });
  try {
    for (let i = 0; i < 3; i++) await c.get("/api/v1/nodes/n");
    const waits = await histogram(restClientRateLimiterDuration, { verb: "GET", host: s.host });
    assert.equal(waits.count, 3);
    // The token bucket made the last two wait; timers may fire late but never early (lower bound only).
    assert.ok(waits.sum! >= 0.08, `waited ${waits.sum} s`);
  } finally {
    c.close();
    await s.stop();
  }
});

Deno.test("rest_client metrics: a streamed list records the bytes read; a watch counts its response but no latency", async () => {
  const list = JSON.stringify({
    kind: "ServiceList",
    metadata: { resourceVersion: "5" },
    items: [{ metadata: { name: "a" } }],
  });
  const s = serve((req) => {
    if (new URL(req.url).searchParams.get("watch") === "true") {
      return new Response(JSON.stringify({ type: "ADDED", object: { metadata: { name: "b" } } }) + "\n");
    }
    return new Response(list, { headers: { "content-type": "application/json" } });
  });
  const c = new KubeClient({ server: s.url, source: "t" }, { qps: 0 });
  try {
    const items: unknown[] = [];
    await c.listStream("/api/v1/services", {}, undefined, (i) => items.push(i));
    assert.equal(items.length, 1);
    for await (const _ of c.watch("/api/v1/services", {})) { /* one event, then the stream ends */ }

    assert.equal(await value(restClientRequestsTotal, { code: "200", method: "GET", host: s.host }), 2);
    assert.equal((await histogram(restClientRequestDuration, { verb: "GET", host: s.host })).count, 1);
    assert.deepEqual(await histogram(restClientResponseSize, { verb: "GET", host: s.host }), {
      count: 1,
      sum: new TextEncoder().encode(list).byteLength,
    });
  } finally {
    c.close();
    await s.stop();
  }
});

Deno.test("rest_client metrics: a request that gets no response counts as code <error>", async () => {
  const s = serve(() => new Response("x"));
  await s.stop();
  const c = new KubeClient({ server: s.url, source: "t" }, { qps: 0 });
  try {
    await assert.rejects(c.get("/api/v1/nodes/n"));
    assert.equal(await value(restClientRequestsTotal, { code: "<error>", method: "GET", host: s.host }), 1);
    // client-go observes the latency of a failed request too, but no response size.
    assert.equal((await histogram(restClientRequestDuration, { verb: "GET", host: s.host })).count, 1);
    assert.equal((await histogram(restClientResponseSize, { verb: "GET", host: s.host })).count, undefined);
  } finally {
    c.close();
  }
});

Deno.test("rest_client metrics: the host label is the server's host and port as written", () => {
  assert.equal(hostLabel("https://172.30.0.1:6443"), "172.30.0.1:6443");
  assert.equal(hostLabel("https://[fd00::1]:6443/prefix"), "[fd00::1]:6443");
  assert.equal(hostLabel("https://api.example:443"), "api.example:443");
  assert.equal(hostLabel("http://user:pw@h"), "h");
});

Deno.test("rest_client metrics: exec plugin calls count by exit code and status; the certificate TTL follows the plugin's certificate", async () => {
  const dir = await Deno.makeTempDir({ prefix: "exec-metrics-" });
  try {
    const ca = await makeCA(dir, "ca", "exec-metrics-ca");
    const one = await issueCert(dir, ca, { name: "one", cn: "one" });
    const two = await issueCert(dir, ca, { name: "two", cn: "two" });
    const pems = await Promise.all([one, two].map(async (p) => ({
      cert: await Deno.readTextFile(p.cert),
      key: await Deno.readTextFile(p.key),
    })));
    resetExecCertificate();
    assert.equal(await value(restClientExecPluginTTL, {}), Infinity);
    const before = {
      ok: (await value(restClientExecPluginCalls, { code: "0", call_status: "no_error" })) ?? 0,
      failed:
        (await value(restClientExecPluginCalls, { code: "3", call_status: "plugin_execution_error" })) ?? 0,
      missing:
        (await value(restClientExecPluginCalls, { code: "1", call_status: "plugin_not_found_error" })) ?? 0,
    };
    const rotations = (await histogram(restClientExecPluginRotationAge, {})).count ?? 0;
    let run = 0;
    const outcomes: (() => { code: number; stdout: string })[] = [
      () => ({ code: 3, stdout: "" }),
      () => {
        throw new Deno.errors.NotFound("no such plugin");
      },
      ...pems.map((p) => () => ({
        code: 0,
        stdout: JSON.stringify({
          apiVersion: "client.authentication.k8s.io/v1",
          kind: "ExecCredential",
          status: { clientCertificateData: p.cert, clientKeyData: p.key },
        }),
      })),
    ];
    const a = new ExecAuthenticator(
      {
        command: "p",
        args: [],
        env: [],
        apiVersion: "client.authentication.k8s.io/v1",
        interactiveMode: "Never",
        provideClusterInfo: false,
      },
      { server: "https://x" },
      { run: () => Promise.resolve().then(() => outcomes[run++]()) },
    );
    await assert.rejects(a.get(), /exit code 3/);
    await assert.rejects(a.get(), /not found/);
    const first = await a.get();
    await a.refreshAfterUnauthorized(first);
    assert.equal(
      await value(restClientExecPluginCalls, { code: "0", call_status: "no_error" }),
      before.ok + 2,
    );
    assert.equal(
      await value(restClientExecPluginCalls, { code: "3", call_status: "plugin_execution_error" }),
      before.failed + 1,
    );
    assert.equal(
      await value(restClientExecPluginCalls, { code: "1", call_status: "plugin_not_found_error" }),
      before.missing + 1,
    );
    // The test CA issues certificates valid for 2 days.
    const ttl = (await value(restClientExecPluginTTL, {}))!;
    assert.ok(ttl > 86400 && ttl <= 2 * 86400 + 60, `ttl ${ttl}`);
    assert.equal((await histogram(restClientExecPluginRotationAge, {})).count, rotations + 1);
  } finally {
    resetExecCertificate();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("rest_client metrics: the families are in the exposition with client-go's types and help", async () => {
  const text = await metricsText();
  for (
    const [name, type, help] of [
      [
        "rest_client_requests_total",
        "counter",
        "Number of HTTP requests, partitioned by status code, method, and host.",
      ],
      [
        "rest_client_request_duration_seconds",
        "histogram",
        "Request latency in seconds. Broken down by verb, and host.",
      ],
      [
        "rest_client_rate_limiter_duration_seconds",
        "histogram",
        "Client side rate limiter latency in seconds.",
      ],
      ["rest_client_request_size_bytes", "histogram", "Request size in bytes. Broken down by verb and host."],
      [
        "rest_client_response_size_bytes",
        "histogram",
        "Response size in bytes. Broken down by verb and host.",
      ],
      ["rest_client_exec_plugin_ttl_seconds", "gauge", "Gauge of the shortest TTL"],
      ["rest_client_exec_plugin_certificate_rotation_age", "histogram", "Histogram of the number of seconds"],
      ["rest_client_exec_plugin_call_total", "counter", "Number of calls to an exec plugin"],
    ]
  ) {
    assert.match(text, new RegExp(`^# HELP ${name} \\[ALPHA\\] ${help.replace(/[.()]/g, "\\$&")}`, "m"));
    assert.match(text, new RegExp(`^# TYPE ${name} ${type}$`, "m"));
  }
});
