/**
 * iptables-specific test helpers: a recorder that plays the kernel's part for jump rules, restore payloads of
 * a recorder, and a port of upstream's `sortIPTablesRules` from proxier_test.go.
 * @module
 */
import type { RecordedCall, RecordingCommandRunner } from "../../../lib/exec.ts";
import { recorder } from "../../../testkit/fixtures.ts";

/**
 * A recorder that remembers the jump rules (`-I CHAIN 1 ...`) of every restore and the chains and jumps created
 * with plain `iptables` calls, and shows them in later `iptables-save -t <table>` output, as the kernel would.
 * `state.drop(table, chain)` forgets a chain's jumps (an external `iptables -F INPUT`).
 */
export function jumpRecorder(
  extra?: (c: RecordedCall) => { code?: number; stdout?: string; stderr?: string } | undefined,
) {
  const tables: Record<string, { chains: Set<string>; rules: string[] }> = {
    filter: { chains: new Set(["INPUT", "FORWARD", "OUTPUT"]), rules: [] },
    nat: { chains: new Set(["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"]), rules: [] },
  };
  const state = {
    tables,
    drop(table: string, chain: string) {
      tables[table].rules = tables[table].rules.filter((l) => !l.startsWith(`-A ${chain} `));
    },
  };
  const r = recorder((c) => {
    const e = extra?.(c);
    if (e) return e;
    if (c.cmd.endsWith("-save")) {
      const t = tables[c.args[1]];
      return {
        stdout: `*${c.args[1]}\n${[...t.chains].map((n) => `:${n} - [0:0]\n`).join("")}${
          t.rules.join("")
        }COMMIT\n`,
      };
    }
    if (c.cmd.endsWith("-restore")) {
      let table = "";
      for (const l of c.stdin.split("\n")) {
        if (l.startsWith("*")) table = l.slice(1);
        else if (l.startsWith(":") && tables[table]) tables[table].chains.add(l.slice(1, l.indexOf(" ")));
        else if (l.startsWith("-I ") && tables[table]) {
          tables[table].rules.unshift(l.replace(/^-I (\S+) 1 /, "-A $1 ") + "\n");
        }
      }
      return undefined;
    }
    if (/^ip6?tables/.test(c.cmd)) {
      const t = tables[c.args[c.args.indexOf("-t") + 1]];
      const i = c.args.indexOf("-N");
      if (i >= 0) t.chains.add(c.args[i + 1]);
      const j = c.args.indexOf("-I");
      if (j >= 0) t.rules.unshift(`-A ${c.args[j + 1]} ${c.args.slice(j + 3).join(" ")}\n`);
    }
    return undefined;
  });
  return { r, state };
}

/** Restore payloads handed to `cmd`. */
export function restores(r: RecordingCommandRunner, cmd = "iptables-restore"): string[] {
  return r.callsOf(cmd).map((c) => c.stdin);
}

// ---- port of upstream sortIPTablesRules ----

interface Table {
  name: string;
  chains: string[];
  rules: Map<string, string[]>;
}

function commentService(rule: string): string | null {
  const m = rule.match(/--comment (?:"([^"]*)"|(\S+))/);
  if (!m) return null;
  const v = m[1] ?? m[2];
  const i = v.search(/[ :]/);
  return i === -1 ? v : v.slice(0, i);
}

function chainOrder(a: string, b: string): number {
  const rank = (
    c: string,
  ) => (c === "KUBE-NODEPORTS" ? 0 : c === "KUBE-SERVICES" ? 1 : c.startsWith("KUBE-") ? 2 : 3);
  const ra = rank(a), rb = rank(b);
  if (ra !== rb) return ra - rb;
  return a < b ? -1 : a > b ? 1 : 0;
}

/** Sorts an iptables-restore payload like upstream's test helper (tables, chains, service-ordered rules). */
export function sortIPTablesRules(data: string): string {
  const tables: Table[] = [];
  let cur: Table | null = null;
  for (const line of data.split("\n")) {
    if (line.startsWith("*")) {
      cur = { name: line.slice(1), chains: [], rules: new Map() };
      tables.push(cur);
    } else if (line.startsWith(":")) {
      const c = line.slice(1).split(" ")[0];
      cur!.chains.push(c);
      cur!.rules.set(c, []);
    } else if (line.startsWith("-A ")) {
      const c = line.split(" ")[1];
      cur!.rules.get(c)!.push(line);
    }
  }
  tables.sort((a, b) => (a.name < b.name ? -1 : 1));
  let out = "";
  for (const t of tables) {
    t.chains.sort(chainOrder);
    const byName = (a: string, b: string) => {
      const x = commentService(a), y = commentService(b);
      if (x === null || y === null) return 0;
      return x < y ? -1 : x > y ? 1 : 0;
    };
    for (const c of ["KUBE-NODEPORTS", "KUBE-SERVICES"]) {
      const rs = t.rules.get(c);
      if (!rs) continue;
      rs.sort((a, b) => {
        if (t.name === "nat" && c === "KUBE-SERVICES") {
          if (a.includes("must be the last rule")) return 1;
          if (b.includes("must be the last rule")) return -1;
        }
        return byName(a, b);
      });
    }
    out += `*${t.name}\n`;
    for (const c of t.chains) out += `:${c} - [0:0]\n`;
    for (const c of t.chains) for (const r of t.rules.get(c)!) out += r + "\n";
    out += "COMMIT\n";
  }
  return out;
}

/** Removes our own additions upstream's payload does not have: canary chains, mangle table, -I jump lines. */
export function stripExtras(payload: string): string {
  const out: string[] = [];
  let skip = false;
  for (const line of payload.split("\n")) {
    if (line === "*mangle") skip = true;
    if (!skip && !line.includes("KUBE-PROXY-CANARY") && !line.startsWith("-I ") && !line.startsWith("-X ")) {
      out.push(line);
    }
    if (skip && line === "COMMIT") skip = false;
  }
  return out.join("\n");
}

export function dedent(s: string): string {
  const lines = s.replace(/^\n/, "").split("\n");
  const ind = Math.min(...lines.filter((l) => l.trim()).map((l) => l.match(/^\s*/)![0].length));
  return lines.map((l) => l.slice(ind)).join("\n").replace(/\s+$/, "\n");
}
