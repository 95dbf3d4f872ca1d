# deno-kube-proxy as one `deno compile` binary on gcr.io/distroless/cc-debian12, with exactly the netfilter tools
# the agent spawns (deno.json's --allow-run) and their libraries and data files: no shell, no package manager.
#
#   docker build -t deno-kube-proxy:0.1.0 .
#   docker build --build-arg DENORT_BIN=denort -t deno-kube-proxy:0.1.0 .   # a denort 2.9.6 in the context
#
# `deno compile` downloads Deno's `denort` base runtime from dl.deno.land unless DENORT_BIN names one (a path in
# the build context); see the `compile` task in deno.json. The permission flags are the `compile` task's (the
# same set as the `start` task).
#
# The tool set is deploy/image/files.txt, staged by scripts/assemble_rootfs.sh exactly as upstream's
# distroless-iptables image is (each program, its symlinks and ldd closure, plugins, data files, package
# metadata). The same script and list build the directory that tests/image/rootfs_test.ts runs the agent and
# every tool in, so the image's contents are tested without Docker; this file itself is not built by the tests
# (no container engine there). Builder and base are both Debian 12 (glibc 2.36).
#
# A kubeconfig with an exec credential plugin needs the plugin granted:
#   --build-arg DKP_EXTRA_PERMISSIONS=--allow-run=/path/plugin

FROM debian:bookworm-slim AS build
ARG DKP_EXTRA_PERMISSIONS=""
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates nodejs npm \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
ARG DENORT_BIN=
RUN deno_bin=$(DKP_SYSTEM_TOOLS=0 bash scripts/install.sh | tail -n 1) \
    && if [ -n "$DENORT_BIN" ]; then export DENORT_BIN="$(realpath "$DENORT_BIN")"; else unset DENORT_BIN; fi \
    && PATH="$(dirname "$deno_bin"):$PATH" deno task compile

FROM debian:bookworm-slim AS stage
COPY deploy/image/files.txt scripts/assemble_rootfs.sh /stage/
RUN apt-get update \
    && apt-get install -y --no-install-recommends $(bash /stage/assemble_rootfs.sh --packages /stage/files.txt) \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/dist/kube-proxy /stage/kube-proxy
RUN bash /stage/assemble_rootfs.sh --program /stage/kube-proxy=/usr/local/bin/kube-proxy \
      /stage/files.txt /rootfs

FROM gcr.io/distroless/cc-debian12
COPY --from=stage /rootfs/ /
ENTRYPOINT ["/usr/local/bin/kube-proxy"]
