#!/usr/bin/env bash
# A venue's hosts as network namespaces on this machine: every node, gateway, client and
# subscriber in its own namespace, joined by veth pairs to two bridges (network 1 carries
# replication, order entry and feed A; network 2 carries feed B), and faults between them.
#
#   scripts/netbed.sh up PREFIX            make the namespaces PREFIX-n1 … and the bridges
#   scripts/netbed.sh down PREFIX          kill what runs in them and delete them all
#   scripts/netbed.sh run PREFIX HOST CMD… run a command on a host (ip netns exec)
#   scripts/netbed.sh cut PREFIX FROM TO   FROM's packets to TO are dropped (one way)
#   scripts/netbed.sh heal PREFIX FROM TO  undo one cut
#   scripts/netbed.sh heal-all PREFIX      undo every cut
#   scripts/netbed.sh addr HOST [NET]      a host's address on network 1 (or 2)
#   scripts/netbed.sh hosts                the host names
#
# Hosts: n1 n2 n3 (replicas), gw (a gateway), cl (a client), sub (a subscriber). Host i has
# 10.201.0.i on network 1 (its eth1) and 10.202.0.i on network 2 (eth2). The bridges live in
# their own namespace (PREFIX-hub), so nothing is added to the machine's own network: traffic
# stays inside the namespaces made here. Multicast snooping is off on the bridges, so groups
# reach every port as on a plain LAN.
#
# Faults: a cut is a blackhole route in FROM's namespace for TO's network-1 address (the
# sender's packets vanish; TO's still arrive); cutting both ways is a partition. This kernel
# has no netem and no tc classifiers or actions, so delay, loss, duplication and reordering
# are not emulated; iptables and nft are absent too, which is why routes do the cutting.
# Process pauses and kills are the caller's (SIGSTOP, SIGCONT, SIGKILL by pid).
set -euo pipefail

HOSTS="n1:1 n2:2 n3:3 gw:5 cl:10 sub:20"

index_of() {
    local h
    for h in $HOSTS; do
        if [ "${h%%:*}" = "$1" ]; then
            echo "${h##*:}"
            return
        fi
    done
    echo "netbed: unknown host $1 (hosts: $(hosts))" >&2
    exit 2
}

hosts() {
    local h out=""
    for h in $HOSTS; do out="$out ${h%%:*}"; done
    echo "${out# }"
}

addr() {
    local net=${2:-1}
    echo "10.20${net}.0.$(index_of "$1")"
}

up() {
    local p=$1 h name i
    if ip netns list | grep -q "^$p-"; then
        echo "netbed: namespaces $p-* exist already (scripts/netbed.sh down $p)" >&2
        exit 1
    fi
    ip netns add "$p-hub"
    ip -n "$p-hub" link set lo up
    for br in br1 br2; do
        ip -n "$p-hub" link add "$br" type bridge
        ip -n "$p-hub" link set "$br" type bridge mcast_snooping 0
        ip -n "$p-hub" link set "$br" up
    done
    for h in $HOSTS; do
        name=${h%%:*}
        i=${h##*:}
        ip netns add "$p-$name"
        ip -n "$p-$name" link set lo up
        for net in 1 2; do
            ip -n "$p-hub" link add "$name-$net" type veth peer name "eth$net" netns "$p-$name"
            ip -n "$p-hub" link set "$name-$net" master "br$net" up
            ip -n "$p-$name" addr add "10.20$net.0.$i/24" dev "eth$net"
            ip -n "$p-$name" link set "eth$net" up
        done
    done
}

down() {
    local p=$1 ns pid
    for ns in $(ip netns list | awk '{print $1}' | grep "^$p-" || true); do
        for pid in $(ip netns pids "$ns" 2>/dev/null || true); do
            kill -CONT "$pid" 2>/dev/null || true
            kill -KILL "$pid" 2>/dev/null || true
        done
    done
    for ns in $(ip netns list | awk '{print $1}' | grep "^$p-" || true); do
        ip netns del "$ns" || true
    done
}

cmd=${1:-}
case "$cmd" in
up) up "$2" ;;
down) down "$2" ;;
run)
    p=$2 h=$3
    shift 3
    index_of "$h" >/dev/null
    exec ip netns exec "$p-$h" "$@"
    ;;
cut) ip -n "$2-$3" route add blackhole "$(addr "$4")/32" ;;
heal) ip -n "$2-$3" route del blackhole "$(addr "$4")/32" ;;
heal-all)
    for h in $(hosts); do ip -n "$2-$h" route flush type blackhole 2>/dev/null || true; done
    ;;
addr) addr "$2" "${3:-1}" ;;
hosts) hosts ;;
*)
    sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
