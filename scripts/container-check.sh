#!/usr/bin/env bash
# Builds the venue's image (deploy/Dockerfile) and runs deploy/compose.yaml with podman: three
# replica nodes and a gateway, each in its own container; sends a crossing pair of orders over
# FIX from the host, kills the leader's container, trades again, and tears it all down.
# Long and root-only, so not part of scripts/test.sh; results in docs/results/containers.md.
#
#   scripts/container-check.sh [--local-base] [--prebuilt]
#
#   --local-base  no registry is reachable: make the Debian base image with debootstrap from
#                 the apt mirror and tag it as the Dockerfile's RUNTIME_IMAGE
#   --prebuilt    skip the Rust build stage: build the `runtime-base` stage and add the host's
#                 target/release/bourse (what the `build` stage would produce, without a Rust
#                 image and a 20-minute build inside it; built first if it is missing)
#
# Needs root; installs podman, runc and python3-venv with apt if missing, and podman-compose
# 1.2.0 with pip into a private virtualenv (Debian 12's 1.0.3 adds a network to host-network
# services, which podman refuses). It uses runc and no default rlimits (a private
# CONTAINERS_CONF): crun refuses hybrid cgroup hosts and raising rlimits needs
# CAP_SYS_RESOURCE, which some virtual machines withhold.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
local_base=0
prebuilt=0
for a in "$@"; do
  case "$a" in
    --local-base) local_base=1 ;;
    --prebuilt) prebuilt=1 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "usage: $0 [--local-base] [--prebuilt]" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "container-check: needs root" >&2; exit 2; }

need=()
for pkg in podman runc; do command -v "$pkg" >/dev/null || need+=("$pkg"); done
python3 -c 'import ensurepip' 2>/dev/null || need+=(python3-venv)
[ "$local_base" = 1 ] && ! command -v debootstrap >/dev/null && need+=(debootstrap)
if [ "${#need[@]}" -gt 0 ]; then
  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}"
fi

work="$(mktemp -d /tmp/bourse-containers.XXXXXX)"
compose() { (cd "$root/deploy" && "$work/venv/bin/podman-compose" -f compose.yaml "$@"); }
cleanup() {
  compose down -v >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q podman-compose==1.2.0
printf '[containers]\ndefault_ulimits = []\n[engine]\nruntime = "runc"\n' > "$work/containers.conf"
export CONTAINERS_CONF="$work/containers.conf"

runtime_image="docker.io/library/debian:bookworm-slim"
if [ "$local_base" = 1 ] && ! podman image exists localhost/debian:bookworm-slim; then
  echo "container-check: making the Debian base image with debootstrap"
  debootstrap --variant=minbase bookworm "$work/rootfs" http://deb.debian.org/debian >/dev/null
  tar -C "$work/rootfs" -c . | podman import - localhost/debian:bookworm-slim >/dev/null
fi
[ "$local_base" = 1 ] && runtime_image="localhost/debian:bookworm-slim"

cd "$root"
if [ "$prebuilt" = 1 ]; then
  [ -x target/release/bourse ] || cargo build --release -p bourse-cli --bin bourse
  podman build -q -f deploy/Dockerfile --target runtime-base \
    --build-arg RUNTIME_IMAGE="$runtime_image" -t localhost/bourse-base:latest . >/dev/null
  mkdir -p "$work/ctx"
  # The release profile keeps debug info (for profiling); the image does not need it.
  strip -o "$work/ctx/bourse" target/release/bourse
  printf 'FROM localhost/bourse-base:latest\nCOPY bourse /usr/local/bin/bourse\n' \
    > "$work/ctx/Containerfile"
  podman build -q -t localhost/bourse:latest "$work/ctx" >/dev/null
else
  podman build -f deploy/Dockerfile --build-arg RUNTIME_IMAGE="$runtime_image" \
    -t localhost/bourse:latest .
fi
echo "container-check: image $(podman image inspect localhost/bourse:latest --format '{{.Id}}' | cut -c1-12), $(podman image inspect localhost/bourse:latest --format '{{.Size}}') bytes"

compose up -d --no-build >/dev/null
bourse="$root/target/release/bourse"
wait_port() {
  for _ in $(seq 1 300); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "container-check: nothing listens on 127.0.0.1:$1" >&2
  compose logs >&2 || true
  return 1
}
wait_port 9878

# One crossing pair over FIX; the buyer's reports must show its whole 30 traded.
trade() {
  local tag="$1"
  "$bourse" order --sender ALPHA --store "$work/alpha" send --symbol SBER --side sell \
    --qty 100 --price 250.10 --cl-ord-id "s-$tag" > "$work/sell-$tag.txt"
  "$bourse" order --sender BETA --store "$work/beta" send --symbol SBER --side buy \
    --qty 30 --price 250.10 --cl-ord-id "b-$tag" > "$work/buy-$tag.txt"
  if ! grep -q "exec trade .* leaves 0 cum 30" "$work/buy-$tag.txt"; then
    echo "container-check: the buy $tag did not fill:" >&2
    cat "$work/buy-$tag.txt" >&2
    return 1
  fi
  echo "container-check: trade $tag: $(grep 'exec trade' "$work/buy-$tag.txt")"
}
trade 1

# Kill the container of the node that leads, then trade again through the survivors, which
# must have elected another leader.
leader_line() {
  for _ in $(seq 1 100); do
    line="$("$bourse" cluster status --config deploy/config/cluster.toml 2>/dev/null | head -1)"
    case "$line" in *"leader node"*) echo "$line"; return 0 ;; esac
    sleep 0.1
  done
  echo "container-check: no leader" >&2
  return 1
}
before="$(leader_line)"
leader="$(echo "$before" | sed -n 's/.*leader node \([0-9]*\).*/\1/p')"
container="$(podman ps --format '{{.Names}}' | grep "node${leader}" | head -1)"
echo "container-check: ${before}; killing container ${container}"
podman kill --signal KILL "$container" >/dev/null
trade 2
after="$(leader_line)"
echo "container-check: ${after}"
case "$after" in *"leader node ${leader} "*)
  echo "container-check: the killed node ${leader} still leads" >&2; exit 1 ;;
esac
echo "container-check: ok"
