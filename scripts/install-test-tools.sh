#!/usr/bin/env bash
# Installs the real peers the tests talk to, on a fresh Debian machine. Idempotent: a tool that
# is already on the PATH is skipped, so running it twice costs one `command -v` per tool.
# Shared by every crate's tests: add a line to TOOLS (command, then the Debian packages that
# provide it) rather than a new block.
#   scripts/install-test-tools.sh        (as root; CI runs it before scripts/test.sh)
set -euo pipefail

# command-on-PATH  debian-packages...
TOOLS=(
  "prometheus prometheus"              # monitor: real Prometheus scrapes /metrics
  "chromium chromium"                  # monitor: headless browser opens the dashboard
  "chromedriver chromium-driver"       # monitor: WebDriver for the browser
  "tshark tshark"                      # marketdata: reads the pcap `bourse md record` writes
  "java default-jdk-headless"         # gateway: QuickFIX/J initiators; wire: sbe-tool
  "mvn maven"                          # gateway: builds the QuickFIX/J test client; wire: fetches sbe-tool
  "python3 python3"                    # delivery, clients/python: the Python client's tests, examples/delivery_client.py
  "ip iproute2"                        # cli: the namespace test bed (scripts/netbed.sh)
  "iptables iptables"                  # cli: the bed's impairments (NFQUEUE, TEE rules)
  "losetup mount"                      # cli: the bed's small disks (a loop device each)
  "mkfs.ext4 e2fsprogs"                # cli: the bed's small disks (ext4)
  "fallocate util-linux"               # cli: the bed's full disk (the filler)
)

missing=()
for line in "${TOOLS[@]}"; do
  read -r cmd pkgs <<<"$line"
  if ! command -v "$cmd" >/dev/null 2>&1; then
    # shellcheck disable=SC2206
    missing+=($pkgs)
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-test-tools: everything is installed"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "install-test-tools: need root to install: ${missing[*]}" >&2
  exit 1
fi
echo "install-test-tools: installing ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
