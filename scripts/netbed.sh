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
#   scripts/netbed.sh heal-all PREFIX      undo every cut (impairments stay)
#   scripts/netbed.sh impair PREFIX FROM TO [--delay-us N] [--jitter-us N] [--loss-pct P]
#                     [--dup-pct P] [--reorder-pct P] [--reorder-extra-us N] [--seed N]
#                                          FROM's packets to TO delayed, lost, duplicated,
#                                          reordered (one way; TO: hosts joined by commas, an
#                                          address such as a feed's group, or any)
#   scripts/netbed.sh unimpair PREFIX FROM TO  undo one impair; prints its counters
#   scripts/netbed.sh distance PREFIX      two data centres: n1-n2 50 µs apart, n3 1 ms away
#   scripts/netbed.sh nodistance PREFIX    undo distance
#   scripts/netbed.sh slowdisk PREFIX HOST WRITE_IOPS PATH
#                                          every process on HOST may write to the disk that
#                                          holds PATH only WRITE_IOPS times a second; prints
#                                          how long one 4 KiB write with fsync took there
#   scripts/netbed.sh fastdisk PREFIX HOST lift the limit, the processes back where they were
#   scripts/netbed.sh iocgroup             the cgroup hierarchy slowdisk uses (v1/v2, root)
#   scripts/netbed.sh smalldisk PREFIX HOST DIR MIB [IMAGE]  a fresh MIB-MiB ext4 file system
#                                          (a loop device on IMAGE, by default DIR.img)
#                                          mounted on the empty DIR
#   scripts/netbed.sh fulldisk PREFIX HOST fill HOST's small disk until ENOSPC
#   scripts/netbed.sh emptydisk PREFIX HOST  remove what fulldisk wrote
#   scripts/netbed.sh nodisk PREFIX HOST   unmount and detach the small disk, delete its image
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
# has no netem qdisc, so an impairment is a userspace one: an iptables NFQUEUE rule in FROM's
# OUTPUT chain hands the packets for TO to a `bourse-netem` process in FROM's namespace
# (crates/testkit, built by `cargo build --release -p bourse-testkit --bin bourse-netem`;
# BOURSE_NETEM names another path), which drops, delays and reorders them; a TEE rule with a
# random share clones packets to TO (duplication, sent at once). A released packet carries
# mark bit 31, which every impairment's rule skips: when two impairments of a host match a
# packet, the newest alone acts on it (an impair on top of `distance` gives the distance's
# delay too). Passing a packet from one queue to the next lost wakeups in trials here (a
# packet sat in the first queue until the next one came). Delays are a process's timers on a shared
# machine: tens of µs late under load, never early. `distance` puts n1, n2 and the other
# hosts in one data centre (50 µs between n1 and n2) and n3 in another, 1 ms one way from
# every host (its feeds too), the issue's "two hosts 50 µs apart and a third 1 ms away".
# Process pauses and kills are the caller's (SIGSTOP, SIGCONT, SIGKILL by pid).
#
# Disks: this kernel has no device-mapper (no dm-delay), so a slow disk is a cgroup's write
# limit: `slowdisk` moves every process of HOST's namespace into a cgroup of its own that
# may issue WRITE_IOPS writes a second to the block device holding PATH (a partition maps to
# its disk), with cgroup v2's io.max where an io controller is enabled, else v1's blkio
# throttle; with neither it fails and says so. Writes wait in the kernel, so an fsync takes
# about 1/WRITE_IOPS s per write it needs. A full disk is real too: `smalldisk` puts a
# directory on a small ext4 file system of its own (no blocks reserved for root: the nodes
# run as root), and `fulldisk` fills it so that the next write there gets ENOSPC. A small
# disk is mounted in the caller's mount namespace (`ip netns exec` gives each command its
# own copy): make it before starting the processes that use it, from the same process.
# `down` lifts the limits and detaches the loop devices too.
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

netem_bin() {
    if [ -n "${BOURSE_NETEM:-}" ]; then
        echo "$BOURSE_NETEM"
    else
        echo "$(cd "$(dirname "$0")/.." && pwd)/target/release/bourse-netem"
    fi
}

# Where the impairments of PREFIX's host FROM keep their process ids, rules and logs.
state_dir() { echo "/run/netbed/$1/$2"; }

# TO as iptables matches, one line per destination: "-d ADDR" or "! -o lo" (any).
destinations() {
    local p=$1 from=$2 to=$3 t h
    for t in ${to//,/ }; do
        case "$t" in
        any) echo "! -o lo" ;;
        all)
            for h in $(hosts); do
                [ "$h" = "$from" ] || echo "-d $(addr "$h")"
            done
            ;;
        *.*) echo "-d $t" ;;
        *) echo "-d $(addr "$t")" ;;
        esac
    done
}

impair() {
    local p=$1 from=$2 to=$3
    shift 3
    local delay=0 jitter=0 loss=0 dup=0 reorder=0 extra=1000 seed=$RANDOM
    while [ $# -gt 0 ]; do
        [ $# -ge 2 ] || { echo "netbed: $1 needs a value" >&2; exit 2; }
        case "$1" in
        --delay-us) delay=$2 ;;
        --jitter-us) jitter=$2 ;;
        --loss-pct) loss=$2 ;;
        --dup-pct) dup=$2 ;;
        --reorder-pct) reorder=$2 ;;
        --reorder-extra-us) extra=$2 ;;
        --seed) seed=$2 ;;
        *) echo "netbed: impair: unknown option $1" >&2; exit 2 ;;
        esac
        shift 2
    done
    index_of "$from" >/dev/null
    local ns="$p-$from" dir key k netem
    dir=$(state_dir "$p" "$from")
    key=${to//,/_}
    mkdir -p "$dir"
    if [ -e "$dir/$key.pid" ]; then
        echo "netbed: $from to $to is impaired already (scripts/netbed.sh unimpair $p $from $to)" >&2
        exit 1
    fi
    netem=$(netem_bin)
    if [ ! -x "$netem" ]; then
        echo "netbed: no $netem (cargo build --release -p bourse-testkit --bin bourse-netem)" >&2
        exit 1
    fi
    if ! ip netns exec "$ns" iptables -w -L OUTPUT -n >/dev/null 2>&1; then
        echo "netbed: iptables is missing or cannot work in $ns (scripts/install-test-tools.sh)" >&2
        exit 1
    fi
    # One queue and one mark bit per impairment of this host: the lowest free of 0-31.
    for k in $(seq 0 32); do
        [ "$k" -lt 32 ] || { echo "netbed: 32 impairments on $from already" >&2; exit 1; }
        grep -qx "$k" "$dir"/*.k 2>/dev/null || break
    done
    echo "$k" >"$dir/$key.k"
    # At a real-time priority (when chrt is there): on a loaded machine the scheduler would
    # otherwise wake the program milliseconds late, a delay no data centre has. It sleeps in
    # poll between packets, so it takes little of the CPU.
    local rt=()
    [ "${BOURSE_NETEM_RT:-1}" != 0 ] && command -v chrt >/dev/null 2>&1 && rt=(chrt -f 10)
    ip netns exec "$ns" "${rt[@]}" "$netem" --queue "$k" --mark-bit 31 --delay-us "$delay" \
        --jitter-us "$jitter" --loss-pct "$loss" --reorder-pct "$reorder" \
        --reorder-extra-us "$extra" --seed "$seed" >"$dir/$key.log" 2>&1 &
    echo $! >"$dir/$key.pid"
    # The rules go in once the program holds the queue, so that the impairment is whole when
    # this returns (until then --queue-bypass would let packets pass untouched).
    local tries=0
    until ip netns exec "$ns" awk -v q="$k" '$1 == q { found = 1 } END { exit !found }' \
        /proc/net/netfilter/nfnetlink_queue 2>/dev/null; do
        if ! alive "$(cat "$dir/$key.pid")" || [ $tries -ge 500 ]; then
            echo "netbed: bourse-netem did not start: $(cat "$dir/$key.log")" >&2
            rm -f "$dir/$key".*
            exit 1
        fi
        tries=$((tries + 1))
        sleep 0.01
    done
    local m=$((1 << 31)) match rules=()
    while read -r match; do
        rules+=("$match -m mark ! --mark $m/$m -m comment --comment netbed-$k -j NFQUEUE --queue-num $k --queue-bypass")
        # The clone of the duplication, inserted above every queue rule and only on a
        # packet's first pass (mark 0), so that a packet is duplicated once at most however
        # many impairments release it.
        if [ "$dup" != 0 ]; then
            local gw=${match#-d }
            [ "$gw" = "$match" ] && { echo "netbed: --dup-pct needs a destination host or address" >&2; exit 2; }
            rules+=("$match -m mark --mark 0 -m statistic --mode random --probability $(awk -v d="$dup" 'BEGIN { printf "%.6f", d / 100 }') -m comment --comment netbed-dup-$k -j TEE --gateway $gw")
        fi
    done < <(destinations "$p" "$from" "$to")
    : >"$dir/$key.rules"
    local r
    for r in "${rules[@]}"; do
        # shellcheck disable=SC2086
        ip netns exec "$ns" iptables -w -I OUTPUT 1 $r
        echo "$r" >>"$dir/$key.rules"
    done
}

# Whether process $1 still runs. `kill -0` is not enough: a process that exited stays a
# zombie until its parent reaps it, and the impairments' programs are reparented to the
# machine's init, which here reaps about 1.4 s late; waiting for that made every heal of an
# impaired link 1.4 s long, so a host's links healed one by one over seconds.
alive() {
    local state
    state=$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null) || return 1
    [ -n "$state" ] && [ "$state" != Z ]
}

unimpair() {
    local p=$1 from=$2 to=$3 dir key ns="$1-$2" r pid dups
    dir=$(state_dir "$p" "$from")
    key=${to//,/_}
    if [ ! -e "$dir/$key.pid" ]; then
        echo "netbed: $from to $to is not impaired" >&2
        exit 1
    fi
    dups=$(ip netns exec "$ns" iptables -w -L OUTPUT -v -x -n 2>/dev/null |
        awk -v c="netbed-dup-$(cat "$dir/$key.k") " 'index($0, c) { n += $1 } END { print n + 0 }')
    while read -r r; do
        # shellcheck disable=SC2086
        ip netns exec "$ns" iptables -w -D OUTPUT $r || true
    done <"$dir/$key.rules"
    pid=$(cat "$dir/$key.pid")
    kill -TERM "$pid" 2>/dev/null || true
    local tries=0
    while alive "$pid" && [ $tries -lt 500 ]; do
        tries=$((tries + 1))
        sleep 0.01
    done
    echo "netbed: $from to $to: $(tail -n 1 "$dir/$key.log") duplicated $dups"
    rm -f "$dir/$key".*
}

# The hosts of the first data centre besides n1 and n2.
DC1_OTHERS="gw,cl,sub"

distance() {
    local p=$1
    impair "$p" n1 n2 --delay-us 50
    impair "$p" n2 n1 --delay-us 50
    impair "$p" n3 any --delay-us 1000
    impair "$p" n1 n3 --delay-us 1000
    impair "$p" n2 n3 --delay-us 1000
    for h in ${DC1_OTHERS//,/ }; do impair "$p" "$h" n3 --delay-us 1000; done
}

nodistance() {
    local p=$1
    unimpair "$p" n1 n2
    unimpair "$p" n2 n1
    unimpair "$p" n3 any
    unimpair "$p" n1 n3
    unimpair "$p" n2 n3
    for h in ${DC1_OTHERS//,/ }; do unimpair "$p" "$h" n3; done
}

# PATH's block device as MAJOR:MINOR, a partition mapped to its whole disk (throttling rules
# name disks).
block_device_of() {
    local path=$1 dev maj min sys
    dev=$(stat -c '%d' "$path") || exit 1
    # Linux's encoding of st_dev: minor's low byte, major, minor's high bits.
    maj=$(((dev >> 8) & 0xfff))
    min=$(((dev & 0xff) | ((dev >> 12) & 0xfff00)))
    sys=/sys/dev/block/$maj:$min
    if [ ! -e "$sys" ]; then
        echo "netbed: $path is on device $maj:$min, which is no block device (tmpfs or overlay?); a slow disk needs one" >&2
        exit 1
    fi
    if [ -e "$sys/partition" ]; then
        cat "$(readlink -f "$sys")/../dev"
    else
        cat "$sys/dev"
    fi
}

# The cgroup hierarchy that can limit writes: "v2 ROOT" when cgroup v2 has an io controller,
# else "v1 ROOT" when v1's blkio has throttling; nothing when neither. `ip netns exec` mounts
# a fresh /sys, which hides /sys/fs/cgroup: a hierarchy the kernel has but this mount
# namespace does not show is mounted again under /run/netbed (the same hierarchy).
io_cgroup() {
    local root
    root=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/mounts)
    if [ -z "$root" ] && grep -q cgroup2 /proc/filesystems; then
        root=/run/netbed/.cgroup2
        mkdir -p "$root"
        mountpoint -q "$root" || mount -t cgroup2 netbed "$root" 2>/dev/null || root=
    fi
    if [ -n "$root" ] && grep -qw io "$root/cgroup.controllers" 2>/dev/null; then
        echo "v2 $root"
        return
    fi
    root=$(awk '$3 == "cgroup" && $4 ~ /(^|,)blkio(,|$)/ { print $2; exit }' /proc/mounts)
    if [ -z "$root" ] && awk '$1 == "blkio" && $4 == 1 { f = 1 } END { exit !f }' /proc/cgroups; then
        root=/run/netbed/.blkio
        mkdir -p "$root"
        mountpoint -q "$root" || mount -t cgroup -o blkio netbed "$root" 2>/dev/null || root=
    fi
    if [ -n "$root" ] && [ -e "$root/blkio.throttle.write_iops_device" ]; then
        echo "v1 $root"
    fi
}

# io_cgroup, or a failure that says what is missing.
iocgroup() {
    local found
    found=$(io_cgroup)
    if [ -z "$found" ]; then
        echo "netbed: no cgroup can limit writes here: cgroup v2 has no io controller and v1's blkio throttling is not mounted" >&2
        exit 1
    fi
    echo "$found"
}

# The cgroup (a path below the hierarchy's root) that holds PID in hierarchy KIND.
cgroup_of() {
    if [ "$1" = v2 ]; then
        awk -F: '$1 == "0" { print $3 }' "/proc/$2/cgroup"
    else
        awk -F: '$2 ~ /(^|,)blkio(,|$)/ { print $3 }' "/proc/$2/cgroup"
    fi
}

slowdisk() {
    local p=$1 host=$2 iops=$3 path=$4 dir kind root dev cg pid pids
    index_of "$host" >/dev/null
    if ! [[ "$iops" =~ ^[1-9][0-9]{0,6}$ ]]; then
        echo "netbed: slowdisk: WRITE_IOPS must be 1-9999999 writes a second, not $iops" >&2
        exit 2
    fi
    dir=$(state_dir "$p" "$host")
    if [ -e "$dir/slowdisk" ]; then
        echo "netbed: $host's disk is slow already (scripts/netbed.sh fastdisk $p $host)" >&2
        exit 1
    fi
    local found
    found=$(iocgroup)
    read -r kind root <<<"$found"
    dev=$(block_device_of "$path")
    pids=$(ip netns pids "$p-$host")
    if [ -z "$pids" ]; then
        echo "netbed: nothing runs on $host to slow down" >&2
        exit 1
    fi
    mkdir -p "$dir"
    cg="$root/netbed-$p-$host"
    mkdir "$cg"
    # The hierarchy's root is found again when undoing (it may be mounted elsewhere there).
    echo "$kind $dev" >"$dir/slowdisk"
    if [ "$kind" = v2 ]; then
        grep -qw io "$root/cgroup.subtree_control" || echo +io >"$root/cgroup.subtree_control"
        echo "$dev wiops=$iops" >"$cg/io.max"
    else
        echo "$dev $iops" >"$cg/blkio.throttle.write_iops_device"
    fi
    : >"$dir/slowdisk.pids"
    for pid in $pids; do
        # Where it was, so that fastdisk can put it back (writing a pid moves all its threads).
        echo "$pid $(cgroup_of "$kind" "$pid")" >>"$dir/slowdisk.pids"
        echo "$pid" >"$cg/cgroup.procs"
    done
    # What one write with fsync now takes on that disk: the mean of three from a probe in the
    # same cgroup (its writes queue behind the processes' own).
    local probe="$path/.netbed-probe" t0 t1
    t0=$(date +%s%N)
    sh -c 'echo $$ >"$1/cgroup.procs" && exec dd if=/dev/zero of="$2" bs=4096 count=3 oflag=dsync status=none' \
        sh "$cg" "$probe"
    t1=$(date +%s%N)
    rm -f "$probe"
    echo "netbed: $host's writes to $dev limited to $iops a second ($kind); one 4 KiB write with fsync took $(((t1 - t0) / 3000)) µs"
}

fastdisk() {
    local p=$1 host=$2 dir kind root cg dev pid was tries=0
    dir=$(state_dir "$p" "$host")
    if [ ! -e "$dir/slowdisk" ]; then
        echo "netbed: $host's disk is not slow" >&2
        exit 1
    fi
    local found
    read -r kind dev <"$dir/slowdisk"
    found=$(iocgroup)
    read -r kind root <<<"$found"
    cg="$root/netbed-$p-$host"
    # The limit goes first, so that the writes it holds are issued at once.
    if [ "$kind" = v2 ]; then
        echo "$dev wiops=max" >"$cg/io.max" 2>/dev/null || true
    else
        echo "$dev 0" >"$cg/blkio.throttle.write_iops_device" 2>/dev/null || true
    fi
    while read -r pid was; do
        [ -e "/proc/$pid" ] && { echo "$pid" >"$root$was/cgroup.procs"; } 2>/dev/null || true
    done <"$dir/slowdisk.pids"
    # Whatever else went in (children started meanwhile) goes to the root.
    for pid in $(cat "$cg/cgroup.procs" 2>/dev/null); do
        { echo "$pid" >"$root/cgroup.procs"; } 2>/dev/null || true
    done
    # A process that was killed may take a moment to leave.
    while [ -d "$cg" ] && ! rmdir "$cg" 2>/dev/null; do
        if [ $tries -ge 500 ]; then
            echo "netbed: cannot remove $cg: $(cat "$cg/cgroup.procs" 2>/dev/null | tr '\n' ' ')" >&2
            exit 1
        fi
        tries=$((tries + 1))
        sleep 0.01
    done
    rm -f "$dir/slowdisk" "$dir/slowdisk.pids"
}

smalldisk() {
    local p=$1 host=$2 mnt=${3%/} mib=$4 img=${5:-${3%/}.img} dir dev t
    index_of "$host" >/dev/null
    if ! [[ "$mib" =~ ^[1-9][0-9]{0,5}$ ]] || [ "$mib" -lt 8 ]; then
        echo "netbed: smalldisk: MIB must be 8-999999 MiB, not $mib" >&2
        exit 2
    fi
    for t in losetup mkfs.ext4 fallocate; do
        if ! command -v "$t" >/dev/null 2>&1; then
            echo "netbed: smalldisk needs $t (scripts/install-test-tools.sh)" >&2
            exit 1
        fi
    done
    dir=$(state_dir "$p" "$host")
    if [ -e "$dir/disk" ]; then
        echo "netbed: $host has a small disk already (scripts/netbed.sh nodisk $p $host)" >&2
        exit 1
    fi
    mkdir -p "$mnt" "$dir"
    if [ -n "$(ls -A "$mnt")" ] || mountpoint -q "$mnt" || [ -e "$img" ]; then
        echo "netbed: $mnt is not empty, is mounted on already, or $img exists" >&2
        exit 1
    fi
    truncate -s "${mib}M" "$img"
    # No blocks reserved for root: the nodes run as root and would write into them.
    mkfs.ext4 -q -F -m 0 -b 4096 "$img"
    # A loop device of its own (not mount -o loop), so that `down` can detach it even when the
    # mount namespace that mounted it is gone.
    dev=$(losetup --find --show "$img")
    echo "$mnt $img $dev" >"$dir/disk"
    mount "$dev" "$mnt"
    rmdir "$mnt/lost+found"
}

fulldisk() {
    local p=$1 host=$2 dir mnt img dev avail
    dir=$(state_dir "$p" "$host")
    if [ ! -e "$dir/disk" ]; then
        echo "netbed: $host has no small disk (scripts/netbed.sh smalldisk)" >&2
        exit 1
    fi
    read -r mnt img dev <"$dir/disk"
    # Most of the space at once, then the rest a block at a time until the file system refuses
    # (fallocate of exactly what df reports can fail for want of a block for its extents).
    avail=$(df -B1 --output=avail "$mnt" | tail -n 1)
    if [ "$avail" -gt $((1 << 20)) ]; then
        fallocate -l $((avail - (1 << 20))) "$mnt/.netbed-filler"
    fi
    if dd if=/dev/zero of="$mnt/.netbed-filler-rest" bs=1024 status=none 2>/dev/null; then
        echo "netbed: $mnt took /dev/zero without running out of space" >&2
        exit 1
    fi
    echo "netbed: $host's disk $mnt is full ($(df -B1 --output=avail "$mnt" | tail -n 1) bytes left)"
}

emptydisk() {
    local dir mnt img dev
    dir=$(state_dir "$1" "$2")
    read -r mnt img dev <"$dir/disk"
    rm -f "$mnt/.netbed-filler" "$mnt/.netbed-filler-rest"
}

# Unmounts (when mounted here) and detaches HOST's small disk, and deletes its image.
nodisk() {
    local p=$1 host=$2 dir mnt img dev
    dir=$(state_dir "$p" "$host")
    [ -e "$dir/disk" ] || return 0
    read -r mnt img dev <"$dir/disk"
    if mountpoint -q "$mnt" 2>/dev/null; then
        umount "$mnt" 2>/dev/null || umount -l "$mnt"
    fi
    # By name alone: in another mount namespace the backing path may read differently.
    if losetup "$dev" 2>/dev/null | grep -qF "$(basename "$img")"; then
        losetup -d "$dev"
    fi
    rm -f "$img"
    rm -f "$dir/disk"
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
    for h in $(hosts); do
        [ -e "$(state_dir "$p" "$h")/slowdisk" ] && { (fastdisk "$p" "$h") || true; }
        (nodisk "$p" "$h") || true
    done
    rm -rf "/run/netbed/$p"
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
impair)
    shift
    impair "$@"
    ;;
unimpair) unimpair "$2" "$3" "$4" ;;
distance) distance "$2" ;;
nodistance) nodistance "$2" ;;
slowdisk) slowdisk "$2" "$3" "$4" "$5" ;;
iocgroup) iocgroup ;;
fastdisk) fastdisk "$2" "$3" ;;
smalldisk) smalldisk "$2" "$3" "$4" "$5" "${6:-}" ;;
fulldisk) fulldisk "$2" "$3" ;;
emptydisk) emptydisk "$2" "$3" ;;
nodisk) nodisk "$2" "$3" ;;
addr) addr "$2" "${3:-1}" ;;
hosts) hosts ;;
*)
    sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
