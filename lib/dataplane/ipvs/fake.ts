/**
 * An in-memory kernel for the ipvs mode's tools, for tests (the agent never imports it: checked by the module
 * graph test): a {@linkcode CommandRunner} that applies what the mode writes (`ipvsadm -R`, `ipset restore`,
 * `ip -force -batch -`, `iptables-restore`) to typed state (virtual servers and their real servers, ipsets and
 * their entries, links and their addresses, iptables tables per family) and answers the reads from it in the
 * tools' own formats (`ipvsadm -S -n`, `ipvsadm -L -n`, `ipset save`, `ip -j addr show`, `iptables-save`). So
 * state written and state read back are one model, and what the real tools refuse it refuses too (a real
 * server of a missing virtual server, an entry of a missing set, an address on a missing link, a rule naming a
 * missing chain), with an error and a non-zero exit.
 * @module
 */
import type { CommandResult, CommandRunner, CommandSpec } from "../../exec.ts";
import { CommandError } from "../../exec.ts";
import { familyOf, type IPFamily } from "../../net/ip.ts";
import { IptablesTables } from "../iptables/model.ts";
import {
  type KernelVirtualServer,
  parseIpvsadmSave,
  realServerLine,
  serviceLine,
  type VirtualServerDef,
} from "./ipvsadm.ts";

/** One ipset as the fake holds it. */
export interface FakeIpset {
  readonly type: string;
  readonly options: string;
  readonly entries: Set<string>;
}

const decoder = new TextDecoder();

function stdinText(spec: CommandSpec): string {
  const s = spec.stdin;
  if (s === undefined) return "";
  if (typeof s === "string") return s;
  if (s instanceof Uint8Array) return decoder.decode(s);
  const dec = new TextDecoder();
  let out = "";
  for (const chunk of s) out += dec.decode(chunk, { stream: true });
  return out + dec.decode();
}

/** The fake kernel (see the module doc). */
export class FakeIpvsKernel implements CommandRunner {
  /** Virtual servers by key (`-t 10.96.0.1:443`). */
  readonly virtualServers = new Map<string, KernelVirtualServer>();
  readonly sets = new Map<string, FakeIpset>();
  /** Link name → its addresses (`ip/len`). */
  readonly links = new Map<string, Set<string>>();
  readonly iptables: Record<IPFamily, IptablesTables> = {
    IPv4: new IptablesTables(),
    IPv6: new IptablesTables(),
  };
  /** Every command run, as `cmd args`. */
  readonly calls: string[] = [];

  /** A node with `lo` and `eth0` holding `nodeIPs` (as `/24` and `/64`). */
  constructor(nodeIPs: readonly string[] = []) {
    this.links.set("lo", new Set(["127.0.0.1/8", "::1/128"]));
    this.links.set("eth0", new Set(nodeIPs.map((ip) => `${ip}/${familyOf(ip) === "IPv6" ? 64 : 24}`)));
  }

  async run(spec: CommandSpec): Promise<CommandResult> {
    const r = await this.tryRun(spec);
    if (r.code !== 0) throw new CommandError(spec, r.code, r.stderr, r.stdout);
    return r;
  }

  tryRun(spec: CommandSpec): Promise<CommandResult> {
    this.calls.push([spec.cmd, ...spec.args].join(" "));
    let r: CommandResult;
    try {
      r = this.#dispatch(spec.cmd, spec.args, stdinText(spec));
    } catch (err) {
      r = { code: 1, stdout: "", stderr: (err as Error).message };
    }
    if (spec.stdoutLines && r.code === 0) {
      const lines = r.stdout.split("\n");
      if (lines.at(-1) === "") lines.pop();
      for (const l of lines) spec.stdoutLines(l);
      r = { ...r, stdout: "" };
    }
    return Promise.resolve(r);
  }

  #dispatch(cmd: string, args: readonly string[], stdin: string): CommandResult {
    const a = args.join(" ");
    const ok = (stdout = ""): CommandResult => ({ code: 0, stdout, stderr: "" });
    if (cmd === "ip" && a === "-j addr show") return ok(this.#addrJson());
    if (cmd === "ip" && args.includes("-batch")) return this.#ipBatch(stdin, args.includes("-force"));
    if (cmd === "ipvsadm" && a === "-S -n") return ok(this.saveIpvs());
    if (cmd === "ipvsadm" && a === "-R") return this.#ipvsadmRestore(stdin);
    if (cmd === "ipvsadm" && args[0] === "-L") return ok(this.#ipvsadmList(args.slice(2).join(" ")));
    if (cmd === "ipset" && a === "save") return ok(this.saveIpsets());
    if (cmd === "ipset" && a === "restore") return this.#ipsetRestore(stdin);
    if (cmd === "ipset" && args[0] === "list" && args[1] === "-t") {
      const s = this.sets.get(args[2]);
      if (!s) {
        return { code: 1, stdout: "", stderr: `ipset v7.17: The set with the given name does not exist\n` };
      }
      return ok(`Name: ${args[2]}\nType: ${s.type}\nNumber of entries: ${s.entries.size}\n`);
    }
    const family: IPFamily = cmd.startsWith("ip6tables") ? "IPv6" : "IPv4";
    if (/^ip6?tables(-nft|-legacy)?-restore$/.test(cmd)) {
      this.iptables[family].restore(stdin, args.includes("--noflush"));
      return ok();
    }
    if (/^ip6?tables(-nft|-legacy)?-save$/.test(cmd)) {
      const dump = this.iptables[family].dump();
      if (args[0] !== "-t") return ok(dump);
      return ok(this.#oneTable(dump, args[1]));
    }
    if (/^ip6?tables(-nft|-legacy)?$/.test(cmd)) {
      const t = args.indexOf("-t"), s = args.indexOf("-S");
      if (t >= 0 && s >= 0) {
        const chain = this.iptables[family].chain(args[t + 1], args[s + 1]);
        if (!chain) return { code: 1, stdout: "", stderr: "iptables: No chain/target/match by that name.\n" };
        return ok(
          [`-N ${chain.name}`, ...chain.rules.map((r) => `-A ${chain.name} ${r.text}`), ""].join("\n"),
        );
      }
    }
    return { code: 1, stdout: "", stderr: `fake ipvs kernel: ${cmd} ${a} is not emulated\n` };
  }

  /** `ipvsadm -S -n`. */
  saveIpvs(): string {
    let out = "";
    for (const [key, vs] of this.virtualServers) {
      out += serviceLine("-A", key, vs.def);
      for (const [rs, w] of vs.reals) out += realServerLine("-a", key, rs, w);
    }
    return out;
  }

  /** `ipset save`. */
  saveIpsets(): string {
    let out = "";
    for (const [name, s] of this.sets) {
      out += `create ${name} ${s.type}${s.options ? ` ${s.options}` : ""}\n`;
      for (const e of s.entries) out += `add ${name} ${e}\n`;
    }
    return out;
  }

  /** The addresses on `link` (without their prefix length). */
  addresses(link: string): string[] {
    return [...this.links.get(link) ?? []].map((a) => a.slice(0, a.lastIndexOf("/")));
  }

  #addrJson(): string {
    return JSON.stringify([...this.links].map(([ifname, addrs]) => ({
      ifname,
      addr_info: [...addrs].map((a) => {
        const ip = a.slice(0, a.lastIndexOf("/"));
        return {
          family: familyOf(ip) === "IPv6" ? "inet6" : "inet",
          local: ip,
          prefixlen: Number(a.split("/")[1]),
        };
      }),
    })));
  }

  #oneTable(dump: string, table: string): string {
    const lines = dump.split("\n");
    const start = lines.indexOf(`*${table}`);
    if (start < 0) return "";
    const end = lines.indexOf("COMMIT", start);
    return lines.slice(start, end + 1).join("\n") + "\n";
  }

  /** `ip -batch`: link add/del, addr replace/add/del; with -force it goes on after an error, exiting 1. */
  #ipBatch(stdin: string, force: boolean): CommandResult {
    const errors: string[] = [];
    for (const [n, raw] of stdin.split("\n").entries()) {
      const w = raw.trim().split(/\s+/);
      if (w[0] === "") continue;
      let err: string | null = null;
      if (w[0] === "link" && w[1] === "add") {
        if (this.links.has(w[2])) err = "RTNETLINK answers: File exists";
        else this.links.set(w[2], new Set());
      } else if (w[0] === "link" && w[1] === "del") {
        if (!this.links.delete(w[2])) err = `Cannot find device "${w[2]}"`;
      } else if (
        w[0] === "addr" && (w[1] === "replace" || w[1] === "add" || w[1] === "del") && w[3] === "dev"
      ) {
        const link = this.links.get(w[4]);
        if (!link) err = `Cannot find device "${w[4]}"`;
        else if (w[1] === "del") {
          if (!link.delete(w[2])) err = "RTNETLINK answers: Cannot assign requested address";
        } else if (w[1] === "add" && link.has(w[2])) err = "RTNETLINK answers: File exists";
        else link.add(w[2]);
      } else err = `Command "${raw.trim()}" is unknown`;
      if (err !== null) {
        errors.push(`${err}\nCommand failed -:${n + 1}`);
        if (!force) break;
      }
    }
    return { code: errors.length > 0 ? 1 : 0, stdout: "", stderr: errors.join("\n") };
  }

  /** `ipvsadm -R`: goes on after a failing line, printing its error (as the real one does). */
  #ipvsadmRestore(stdin: string): CommandResult {
    const errors: string[] = [];
    for (const raw of stdin.split("\n")) {
      const line = raw.trim();
      if (line === "") continue;
      const w = line.split(/\s+/);
      const key = `${w[1]} ${w[2]}`;
      const vs = this.virtualServers.get(key);
      const opt = (flag: string) => {
        const i = w.indexOf(flag);
        return i >= 0 ? w[i + 1] : undefined;
      };
      switch (w[0]) {
        case "-A":
        case "-E": {
          if (w[0] === "-A" && vs) errors.push("Service already exists");
          else if (w[0] === "-E" && !vs) errors.push("No such service");
          else {
            const parsed = parseIpvsadmSave(`-A ${w.slice(1).join(" ")}`).values().next().value;
            const def: VirtualServerDef = parsed?.def ??
              { scheduler: opt("-s") ?? "wlc", persistence: 0, flags: "" };
            this.virtualServers.set(key, { def, reals: vs?.reals ?? new Map() });
          }
          break;
        }
        case "-D":
          if (!this.virtualServers.delete(key)) errors.push("No such service");
          break;
        case "-a":
        case "-e": {
          const rs = opt("-r");
          if (!vs) errors.push("Service not defined");
          else if (!rs) errors.push("Missing real server address");
          else {
            const canon = [...parseIpvsadmSave(`-A ${key}\n-a ${key} -r ${rs}`).values()][0];
            const real = [...canon.reals.keys()][0];
            if (w[0] === "-a" && vs.reals.has(real)) errors.push("Destination already exists");
            else if (w[0] === "-e" && !vs.reals.has(real)) errors.push("No such destination");
            else vs.reals.set(real, Number(opt("-w") ?? 1));
          }
          break;
        }
        case "-d": {
          const rs = opt("-r");
          const canon = rs ? [...parseIpvsadmSave(`-A ${key}\n-a ${key} -r ${rs}`).values()][0] : undefined;
          const real = canon ? [...canon.reals.keys()][0] : "";
          if (!vs) errors.push("Service not defined");
          else if (!vs.reals.delete(real)) errors.push("No such destination");
          break;
        }
        case "-C":
          this.virtualServers.clear();
          break;
        default:
          errors.push(`Illegal command: ${line}`);
      }
    }
    return { code: errors.length > 0 ? 2 : 0, stdout: "", stderr: errors.map((e) => `${e}\n`).join("") };
  }

  /** `ipvsadm -L -n [-t key]`: every real server with no connections. */
  #ipvsadmList(key: string): string {
    let out = "IP Virtual Server version 1.2.1 (size=4096)\nProt LocalAddress:Port Scheduler Flags\n" +
      "  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n";
    for (const [k, vs] of this.virtualServers) {
      if (key !== "" && k !== key) continue;
      const [flag, hp] = k.split(" ");
      out += `${flag === "-t" ? "TCP" : flag === "-u" ? "UDP" : "SCTP"}  ${hp} ${vs.def.scheduler}\n`;
      for (const [rs, w] of vs.reals) out += `  -> ${rs}    Masq    ${w}      0          0\n`;
    }
    return out;
  }

  /** `ipset restore`: stops at the first failing line, as the real one does. */
  #ipsetRestore(stdin: string): CommandResult {
    for (const [n, raw] of stdin.split("\n").entries()) {
      const w = raw.trim().split(/\s+/);
      if (w[0] === "") continue;
      const exist = w.at(-1) === "-exist";
      if (exist) w.pop();
      const set = this.sets.get(w[1]);
      const fail = (msg: string): CommandResult => ({
        code: 1,
        stdout: "",
        stderr: `ipset v7.17: Error in line ${n + 1}: ${msg}\n`,
      });
      switch (w[0]) {
        case "create":
          if (set && (!exist || set.type !== w[2])) {
            return fail("Set cannot be created: set with the same name already exists");
          }
          if (!set) this.sets.set(w[1], { type: w[2], options: w.slice(3).join(" "), entries: new Set() });
          break;
        case "add":
          if (!set) return fail("The set with the given name does not exist");
          if (set.entries.has(w[2]) && !exist) {
            return fail("Element cannot be added to the set: it's already added");
          }
          set.entries.add(w[2]);
          break;
        case "del":
          if (!set) return fail("The set with the given name does not exist");
          if (!set.entries.delete(w[2]) && !exist) {
            return fail("Element cannot be deleted from the set: it's not added");
          }
          break;
        case "flush":
          if (!set) return fail("The set with the given name does not exist");
          set.entries.clear();
          break;
        case "destroy":
          if (!this.sets.delete(w[1]) && !exist) return fail("The set with the given name does not exist");
          break;
        default:
          return fail(`Unknown command ${w[0]}`);
      }
    }
    return { code: 0, stdout: "", stderr: "" };
  }
}
