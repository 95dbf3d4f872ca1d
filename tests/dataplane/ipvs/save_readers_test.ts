/**
 * The ipvs full sync's kernel reads, line by line: `ipvsadm -S -n` kept for one family only and `ipset save`
 * kept for the named sets only, the same as the whole-text parsers where no filter applies.
 */
import assert from "node:assert/strict";
import { IpsetSaveReader, parseIpsetSave } from "../../../lib/dataplane/ipvs/ipsets.ts";
import { IpvsadmSaveReader, parseIpvsadmSave } from "../../../lib/dataplane/ipvs/ipvsadm.ts";

const IPVSADM = [
  "-A -t 10.96.0.10:80 -s rr",
  "-a -t 10.96.0.10:80 -r 10.244.0.5:8080 -m -w 1",
  "-A -u [fd00::a]:53 -s rr -p 10800",
  "-a -u [fd00::a]:53 -r [fd00:1::5]:53 -m -w 0",
  "-A -f 7 -s rr",
  "-a -t 10.96.0.10:80 -r 10.244.1.5:8080 -m -w 1",
  "",
].join("\n");

function feed(reader: { line: (l: string) => void }, text: string): void {
  for (const l of text.split("\n")) reader.line(l);
}

Deno.test("IpvsadmSaveReader: a family keeps its own virtual servers and their real servers only", () => {
  const v4 = new IpvsadmSaveReader("IPv4");
  feed(v4, IPVSADM);
  assert.deepEqual([...v4.result.keys()], ["-t 10.96.0.10:80"]);
  assert.deepEqual([...v4.result.get("-t 10.96.0.10:80")!.reals], [["10.244.0.5:8080", 1], [
    "10.244.1.5:8080",
    1,
  ]]);
  const v6 = new IpvsadmSaveReader("IPv6");
  feed(v6, IPVSADM);
  assert.deepEqual([...v6.result.keys()], ["-u [fd00::a]:53"]);
  const vs = v6.result.get("-u [fd00::a]:53")!;
  assert.deepEqual(vs.def, { scheduler: "rr", persistence: 10800, flags: "" });
  assert.deepEqual([...vs.reals], [["[fd00:1::5]:53", 0]]);
});

Deno.test("IpvsadmSaveReader: without a family it reads what parseIpvsadmSave reads", () => {
  const all = new IpvsadmSaveReader();
  feed(all, IPVSADM);
  assert.deepEqual(all.result, parseIpvsadmSave(IPVSADM));
  assert.equal(all.result.size, 2, "firewall-mark services are skipped");
});

const IPSET = [
  "create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536",
  "add KUBE-CLUSTER-IP 10.96.0.10,tcp:80",
  "create KUBE-6-CLUSTER-IP hash:ip,port family inet6 hashsize 1024 maxelem 65536",
  "add KUBE-6-CLUSTER-IP fd00::a,udp:53",
  "create someone-else hash:ip family inet",
  "add someone-else 192.0.2.1 timeout 30",
  "",
].join("\n");

Deno.test("IpsetSaveReader: only the named sets are kept, with their entries", () => {
  const r = new IpsetSaveReader(new Set(["KUBE-6-CLUSTER-IP"]));
  feed(r, IPSET);
  assert.deepEqual([...r.result.keys()], ["KUBE-6-CLUSTER-IP"]);
  assert.deepEqual([...r.result.get("KUBE-6-CLUSTER-IP")!.entries], ["fd00::a,udp:53"]);
});

Deno.test("IpsetSaveReader: without names it reads what parseIpsetSave reads (entry options dropped)", () => {
  const r = new IpsetSaveReader();
  feed(r, IPSET);
  assert.deepEqual(r.result, parseIpsetSave(IPSET));
  assert.deepEqual([...r.result.get("someone-else")!.entries], ["192.0.2.1"]);
});
