import assert from "node:assert/strict";
import { ServiceHealthBook } from "../../lib/proxy/service_health_book.ts";
import type { ServiceHealthUpdater } from "../../lib/proxy/types.ts";
import { makeState } from "../../testkit/fixtures.ts";

/** A health server that records what it was told. */
function recorder(): ServiceHealthUpdater & { ports: Map<string, number>[]; counts: Map<string, number>[] } {
  const ports: Map<string, number>[] = [], counts: Map<string, number>[] = [];
  return {
    ports,
    counts,
    syncServices: (p) => void ports.push(new Map(p)),
    syncEndpoints: (c) => void counts.push(new Map(c)),
  };
}

const lb = (hcnp: number, eps: Parameters<typeof makeState>[1], clusterIP = "172.30.0.1") =>
  makeState({ ns: "ns", name: "lb", clusterIP, eTPLocal: true, hcnp }, eps);

Deno.test("health book: distinct local ready IPs per Service, health-check ports told after every flush", () => {
  const book = new ServiceHealthBook();
  const server = recorder();
  book.set("IPv4", "ns/lb", [
    lb(32000, [{ ip: "10.0.0.1", local: true }, { ip: "10.0.0.2", local: true, ready: false }, {
      ip: "10.0.1.1",
    }]),
  ]);
  book.set("IPv4", "ns/web", [
    makeState({ ns: "ns", name: "web", clusterIP: "172.30.0.2" }, [{ ip: "10.0.1.2" }]),
  ]);
  book.flush(server);
  assert.deepEqual(server.ports, [new Map([["ns/lb", 32000]])]);
  assert.deepEqual(server.counts.at(-1), new Map([["ns/lb", 1]]), "only local and ready; no entry for 0");

  // The same local IP on two ports counts once; the ports are told again (the server retries failed listeners).
  book.set("IPv4", "ns/lb", [
    lb(32000, [{ ip: "10.0.0.1", local: true }, { ip: "10.0.0.3", local: true }]),
    lb(32000, [{ ip: "10.0.0.1", local: true, port: 8443 }]),
  ]);
  book.flush(server);
  assert.deepEqual(server.ports.at(-1), new Map([["ns/lb", 32000]]));
  assert.deepEqual(server.counts.at(-1), new Map([["ns/lb", 2]]));

  // A Service untouched by a flush keeps its entry; a deleted one loses its port and count.
  book.set("IPv4", "ns/web", undefined);
  book.flush(server);
  assert.deepEqual(server.counts.at(-1), new Map([["ns/lb", 2]]));
  book.set("IPv4", "ns/lb", undefined);
  book.flush(server);
  assert.deepEqual(server.ports.at(-1), new Map());
  assert.deepEqual(server.counts.at(-1), new Map());
});

Deno.test("health book: dual-stack takes the larger family's count; clear() drops what is not set again", () => {
  const book = new ServiceHealthBook();
  const server = recorder();
  book.set("IPv4", "ns/lb", [lb(32000, [{ ip: "10.0.0.1", local: true }, { ip: "10.0.0.2", local: true }])]);
  book.set("IPv6", "ns/lb", [lb(32000, [{ ip: "fd00::1", local: true }], "fd00:96::1")]);
  book.flush(server);
  assert.deepEqual(server.counts.at(-1), new Map([["ns/lb", 2]]), "a dual-stack pod counts once");
  book.set("IPv4", "ns/lb", undefined);
  book.flush(server);
  assert.deepEqual(server.counts.at(-1), new Map([["ns/lb", 1]]), "the IPv6 family's count remains");
  assert.deepEqual(server.ports.at(-1), new Map([["ns/lb", 32000]]));

  // A selection recomputed from scratch (node topology changed): every Service of the family set again.
  book.set("IPv4", "ns/other", [lb(31000, [{ ip: "10.0.0.9", local: true }])]);
  book.flush(server);
  book.clear("IPv4");
  book.clear("IPv6");
  book.set("IPv6", "ns/lb", [lb(32000, [{ ip: "fd00::1", local: true }], "fd00:96::1")]);
  book.flush(server);
  assert.deepEqual(server.counts.at(-1), new Map([["ns/lb", 1]]));
  assert.deepEqual(server.ports.at(-1), new Map([["ns/lb", 32000]]), "ns/other's port is gone");
});
