/**
 * Reading the kernel's state for an ipvs full sync: `ip -j addr show`, `ipvsadm -S -n`, `ipset save` and
 * `iptables-save` of nat and filter, replacing the kernel model with what they show.
 * @module
 */
import type { CommandRunner } from "../../exec.ts";
import type { IPFamily } from "../../net/ip.ts";
import { missingJumpLines, parseSavedTable } from "../iptables_jumps.ts";
import { parseLocalAddresses } from "./addresses.ts";
import { IpsetSaveReader, SET_DEFS, setName } from "./ipsets.ts";
import { IPVS_JUMP_RULES } from "./iptables_rules.ts";
import { IpvsadmSaveReader } from "./ipvsadm.ts";
import { KERNEL_COMMAND_TIMEOUT_MS, type KernelModel } from "./kernel_model.ts";

/** The jump rules into the mode's chains that nat and filter lack, as iptables-restore lines of each table. */
export interface MissingJumps {
  nat: string;
  filter: string;
}

/**
 * Reads the kernel's state once (full syncs) into `kernel`, each part as soon as it is read, clears the drain
 * list (the full sync's virtual server pass rebuilds it from the kernel) and returns the missing jump rules.
 * `iptablesSave` is the backend's iptables-save program of the family.
 */
export async function readKernel(
  kernel: KernelModel,
  runner: CommandRunner,
  family: IPFamily,
  iptablesSave: string,
): Promise<MissingJumps> {
  const a = await runner.run({ cmd: "ip", args: ["-j", "addr", "show"], timeoutMs: 60_000 });
  const addrs = parseLocalAddresses(a.stdout, family);
  kernel.dummyExists = addrs.dummyExists;
  kernel.addrs = addrs.dummy;
  kernel.nodeAddresses = addrs.others;

  // Both are read line by line, this family's part only: at 10k Services the IPVS table's text is ~7 MB and
  // the other family's sync would otherwise parse all of it to keep nothing.
  const v = new IpvsadmSaveReader(family);
  await runner.run({
    cmd: "ipvsadm",
    args: ["-S", "-n"],
    timeoutMs: KERNEL_COMMAND_TIMEOUT_MS,
    stdoutLines: v.line,
  });
  kernel.virtualServers = v.result;

  const names = new Set(SET_DEFS.map((d) => setName(d.key, family)));
  const s = new IpsetSaveReader(names);
  await runner.run({
    cmd: "ipset",
    args: ["save"],
    timeoutMs: KERNEL_COMMAND_TIMEOUT_MS,
    stdoutLines: s.line,
  });
  const saved = s.result;
  kernel.sets = new Map();
  for (const d of SET_DEFS) {
    kernel.sets.set(d.key, saved.get(setName(d.key, family))?.entries ?? new Set());
  }

  const jumps = { nat: "", filter: "" };
  for (const table of ["nat", "filter"] as const) {
    const r = await runner.run({ cmd: iptablesSave, args: ["-t", table], timeoutMs: 120_000 });
    jumps[table] = missingJumpLines(parseSavedTable(r.stdout), table, IPVS_JUMP_RULES);
  }
  // The drain list is rebuilt from the kernel by the full sync's virtual server pass.
  kernel.draining.clear();
  return jumps;
}
