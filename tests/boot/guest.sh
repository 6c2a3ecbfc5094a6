#!/bin/bash
# guest.sh: a Debian 12 or 13 guest with the real systemd as PID 1, for the boot tier
# (tests/boot): system units run there with all their sandboxing (DynamicUser=,
# ProtectKernelModules=, ...), as a user's machine runs them.  Adapted from the
# team's realboot harness (shared/realboot/boot.sh).  One image (mmdebstrap,
# Debian's packages only: systemd, Debian's kernel and headers, and what
# alfwrapper's package depends on, read from debian/control), two routes; every
# boot starts from the pristine image unless GUEST_KEEP=1:
#   nspawn  (default) systemd-nspawn --boot on the image: the host's kernel, boots in
#           about 2 s.  Made for hosts whose PID 1 is not systemd (Firecracker VMs).
#   qemu    qemu-system-x86_64 booting Debian's own kernel (linux-image-amd64: 6.1 on
#           Debian 12, 6.12 on Debian 13) from the image.  KVM where the host has hardware virtualisation
#           (kvm_intel/kvm_amd); otherwise TCG, emulated: ~40 s to boot, ~30x slower
#           (a /dev/kvm from kvm_pvm, as on Firecracker hosts, runs only PVM-guest
#           kernels: Debian's hangs after "Probing EDD").
#
#   guest.sh build                 build the image if missing (cached by package list)
#   guest.sh kernel                build if needed; print the path of its Debian kernel
#   guest.sh start                 build if needed, boot in the background, wait for ssh
#   guest.sh run 'CMD'             run CMD in the guest as root (stdin passed through)
#   guest.sh put HOSTFILE GUESTPATH   copy a file into the guest
#   guest.sh client 'CMD'          run CMD on the host side, "outside" the guest
#   guest.sh console               print the guest's console log
#   guest.sh status                running or not (exit 3: not running)
#   guest.sh stop                  power off; remove the netns, mounts, cgroups
#   guest.sh clean                 stop, and delete the cached images
#
# Network: a network namespace NAME (GUEST_NAME, default alfguest) holds the host
# side; the guest is reached only from there (no NAT, no route out of the machine).
#   host side  192.0.2.1/24  198.51.100.1/24  2001:db8::1/64 on the link, and
#              203.0.113.1/24  2001:db8:a::1/64  2001:db8:b::1/64 (the guest's default
#              routes lead there), all usable as a client's source address
#   guest      192.0.2.2/24  198.51.100.2/24  2001:db8::2/64
# The guest's own sshd, used by `run`, listens on port 2222 (22 is left free).
#
# Needs, on Debian 12, as root: mmdebstrap systemd-container (nspawn) or
# qemu-system-x86 (qemu), plus iproute2, openssh-client, e2fsprogs (make setup).
#
# Environment: GUEST_SUITE (bookworm, the default, or trixie: systemd 257, which
# refuses cgroup v1, so its nspawn guest gets a cgroup v2-only hierarchy, as the
# release boots on hardware), GUEST_DIR (cache and state; default build/guest in the checkout),
# GUEST_ROUTE (nspawn|qemu), GUEST_NAME, GUEST_MEM (qemu, MiB, default 2048),
# GUEST_CPUS (qemu, default 2), GUEST_ACCEL (qemu: auto|kvm|tcg), GUEST_PACKAGES
# (extra packages, comma or space separated; part of the cache key), GUEST_MIRROR
# (a Debian mirror URL; default: the host's own apt mirrors, with the suite's
# -updates and -security), GUEST_KEEP=1 (write to the image itself), GUEST_TIMEOUT
# (seconds to wait for the guest, default 240), GUEST_NSPAWN_ARGS (more
# systemd-nspawn options), GUEST_NICE (qemu's nice level), MMDEBSTRAP.
set -euo pipefail

SELF=$(readlink -f "$0")
CHECKOUT=$(cd "$(dirname "$SELF")/../.." && pwd)
DIR=${GUEST_DIR:-$CHECKOUT/build/guest}
ROUTE=${GUEST_ROUTE:-nspawn}
NAME=${GUEST_NAME:-alfguest}
MEM=${GUEST_MEM:-2048}
CPUS=${GUEST_CPUS:-2}
TIMEOUT=${GUEST_TIMEOUT:-240}
MMDEBSTRAP=${MMDEBSTRAP:-mmdebstrap}
SUITE=${GUEST_SUITE:-bookworm}
case "$SUITE" in
    bookworm | trixie) ;;
    *) echo "guest: GUEST_SUITE is bookworm or trixie, not $SUITE" >&2; exit 64 ;;
esac
IMAGE_FORMAT=1   # bump when the guest's customisation below changes

HOST4=192.0.2.1 GUEST4=192.0.2.2
HOST4B=198.51.100.1 GUEST4B=198.51.100.2
HOST6=2001:db8::1 GUEST6=2001:db8::2
# Further client addresses on the host side only, reached by the guest's default routes.
HOST_EXTRA="203.0.113.1/24 2001:db8:a::1/64 2001:db8:b::1/64"
SSH_PORT=2222
case "$NAME" in
    *[!a-z0-9-]* | "" | ?????????????*) echo "guest: GUEST_NAME is 1-12 of a-z, 0-9, -" >&2; exit 64 ;;
esac
TAP=rb-$NAME

# The guest: systemd as PID 1, Debian's kernel, sshd, the gallery's daemons (git,
# tftpd-hpa, nginx-light, dnsmasq-base, apache2, redis-server, haproxy, postgresql),
# pytest, hypothesis, shtab and mandoc (the unit tier under the release's own Python),
# and what alfwrapper's .deb depends on (Depends + Recommends of
# debian/control, first alternatives), so that `apt-get install ./alfwrapper_*.deb`
# works offline in the guest.
BASE_PACKAGES="systemd systemd-sysv udev dbus kmod iproute2 iputils-ping procps less
openssh-server openssh-client linux-image-amd64 initramfs-tools e2fsprogs ncat python3
git tftpd-hpa nginx-light dnsmasq-base apache2 redis-server haproxy postgresql
python3-pytest python3-hypothesis python3-shtab mandoc"
control_depends() {
    sed -n '/^Package: alfwrapper/,$p' "$CHECKOUT/debian/control" |
        awk '/^(Depends|Recommends):/ { on = 1; sub(/^[A-Za-z]+:/, "") } /^[A-Za-z-]+:/ && !/^(Depends|Recommends):/ { on = 0 } on' |
        tr ',' '\n' | sed 's/|.*//; s/(.*)//; s/\$[{][^}]*[}]//; s/[[:space:]]//g' | sed '/^$/d'
}

die() { echo "guest: $*" >&2; exit 1; }
# host_uri PATTERN [-v]: the first URI of the host's Debian apt sources whose suites
# match PATTERN (with -v: do not match), deb822 or one-line format.
host_uri() {
    { for f in /etc/apt/sources.list.d/*.sources; do
          [ -f "$f" ] && awk 'BEGIN { RS = ""; FS = "\n" } { u = ""; s = ""
              for (i = 1; i <= NF; i++) {
                  if ($i ~ /^URIs:/) { sub(/^URIs:[ \t]*/, "", $i); u = $i }
                  if ($i ~ /^Suites:/) { sub(/^Suites:[ \t]*/, "", $i); s = $i } }
              if (u != "") print u " " s }' "$f"
      done
      cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
          awk '$1 == "deb" { print $2 " " $3 }' || true; } |
        grep -e "$1" ${2:-} | awk 'NR == 1 { print $1 }' || true
}
log() { echo "guest: $*" >&2; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

packages() {
    { echo "$BASE_PACKAGES ${GUEST_PACKAGES:-}" | tr ', ' '\n\n'; control_depends; } |
        sed '/^$/d' | sort -u
}
image_key() {
    { echo "format=$IMAGE_FORMAT suite=$SUITE mirror=${GUEST_MIRROR:-default}"; packages; } |
        sha256sum | cut -c1-12
}
IMG=$DIR/images/$(image_key)
RUN=$DIR/run/$NAME
# A running guest keeps the image it was started from (its ssh key is that image's).
case "${1:-}" in
    start | build | kernel) ;;
    *) [ ! -s "$RUN/image" ] || IMG=$(cat "$RUN/image") ;;
esac

need_root() { [ "$(id -u)" = 0 ] || die "run as root"; }
need() {
    command -v "$1" >/dev/null || die "$1 is missing (apt-get install $2)"
}

# ---------------------------------------------------------------- the image
# Runs inside mmdebstrap's --customize-hook: $1 is the new root file system.
customize() {
    local root=$1 pub=$2
    echo alfguest >"$root/etc/hostname"
    printf '127.0.0.1\tlocalhost\n127.0.1.1\talfguest\n::1\tlocalhost ip6-localhost ip6-loopback\n' \
        >"$root/etc/hosts"
    # qemu: the image is /dev/vda.  (nspawn ignores an fstab entry for /.)
    echo '/dev/vda / ext4 defaults,errors=remount-ro 0 1' >"$root/etc/fstab"
    mkdir -p "$root/etc/systemd/network"
    cat >"$root/etc/systemd/network/10-alfguest.network" <<EOF
[Match]
Name=en* eth* host0

[Network]
Address=$GUEST4/24
Address=$GUEST4B/24
Address=$GUEST6/64
Gateway=$HOST4
Gateway=$HOST6
IPv6AcceptRA=no
LinkLocalAddressing=ipv6
EOF
    install -d -m 700 "$root/root/.ssh"
    install -m 600 "$pub" "$root/root/.ssh/authorized_keys"
    cat >"$root/etc/ssh/sshd_config.d/alfguest.conf" <<EOF
# the tier's control channel (guest.sh run); port 22 stays free for the units under test.
Port $SSH_PORT
PasswordAuthentication no
UseDNS no
EOF
    # The serial console logs in by itself (debugging: guest.sh console, or qemu's monitor).
    mkdir -p "$root/etc/systemd/system/serial-getty@ttyS0.service.d"
    cat >"$root/etc/systemd/system/serial-getty@ttyS0.service.d/autologin.conf" <<'EOF'
[Service]
ExecStart=
ExecStart=-/sbin/agetty --autologin root --keep-baud 115200,57600,38400,9600 %I $TERM
EOF
    # No network beyond the host side: nothing that would try to reach the Internet.
    chroot "$root" systemctl enable systemd-networkd.service >/dev/null 2>&1
    chroot "$root" systemctl mask systemd-timesyncd.service apt-daily.timer \
        apt-daily-upgrade.timer man-db.timer e2scrub_all.timer fstrim.timer >/dev/null 2>&1 || true
    # Daemons installed for units under test (the gallery's tftp) run only behind them.
    chroot "$root" systemctl disable tftpd-hpa.service nginx.service apache2.service \
        redis-server.service haproxy.service postgresql.service >/dev/null 2>&1 || true
    # Keep journald's log across boots of a kept image, and readable after a failure.
    mkdir -p "$root/var/log/journal"
}

# One build of an image at a time (two lanes of a test run may ask at once); the lock
# is not held past the build (a guest started afterwards must not inherit it).
build() {
    need_root
    mkdir -p "$DIR/images"
    (flock 9 || die "cannot lock $DIR/images"
        build_locked) 9>"$DIR/images/.lock"
}
build_locked() {
    if [ -f "$IMG/done" ]; then
        log "image $IMG is built (delete it, or change GUEST_PACKAGES, to rebuild)"
        return 0
    fi
    command -v "$MMDEBSTRAP" >/dev/null || die "mmdebstrap is missing (apt-get install mmdebstrap)"
    need mkfs.ext4 e2fsprogs
    need ssh-keygen openssh-client
    local t0 tmp root size mirrors=()
    t0=$(now)
    tmp=$IMG.tmp
    # A build killed while mmdebstrap had its chroot's /proc, /sys and /dev/pts mounted
    # leaves them there: unmounted first, else rm would walk into them.
    findmnt -rn -o TARGET | awk -v t="$tmp/" 'index($0, t) == 1' | sort -r |
        while read -r m; do umount -l "$m"; done
    rm -rf "$tmp"
    mkdir -p "$tmp"
    ssh-keygen -q -t ed25519 -N '' -C alfguest -f "$tmp/id_ed25519"
    root=$tmp/rootfs
    if [ -n "${GUEST_MIRROR:-}" ]; then
        mirrors=("deb $GUEST_MIRROR $SUITE main" "deb $GUEST_MIRROR $SUITE-updates main")
    elif [ "$SUITE" != bookworm ]; then
        # another release than the host's: the host's own mirrors, with its suites
        local main sec
        main=$(host_uri '-security' -v)
        sec=$(host_uri '-security')
        [ -n "$main" ] || die "no Debian mirror in the host's apt sources (set GUEST_MIRROR)"
        mirrors=("deb $main $SUITE main" "deb $main $SUITE-updates main")
        [ -z "$sec" ] || mirrors+=("deb $sec $SUITE-security main")
    fi
    log "building the $SUITE root file system in $root (packages: $(packages | tr '\n' ' '))"
    "$MMDEBSTRAP" --mode=root --variant=apt --skip=cleanup/apt/lists \
        --include="$(packages | paste -sd,)" \
        --customize-hook="\"$SELF\" _customize \"\$1\" \"$tmp/id_ed25519.pub\"" \
        "$SUITE" "$root" "${mirrors[@]}" 2>&1 | tee "$tmp/mmdebstrap.log" | grep -E '^I:|^E:|^W:' >&2 ||
        true
    [ -x "$root/lib/systemd/systemd" ] || die "mmdebstrap failed: see $tmp/mmdebstrap.log"
    log "root file system done in $(since "$t0") s"
    cp -L "$root/vmlinuz" "$tmp/vmlinuz"
    cp -L "$root/initrd.img" "$tmp/initrd.img"
    basename "$(readlink -f "$root/vmlinuz")" | sed 's/^vmlinuz-//' >"$tmp/kernel-release"
    size=$(( $(du -sm "$root" | cut -f1) + 2048 ))
    truncate -s "${size}M" "$tmp/rootfs.img"
    mkfs.ext4 -q -F -L alfguest -d "$root" "$tmp/rootfs.img"
    rm -rf "$root"
    date -u +%FT%TZ >"$tmp/done"
    rm -rf "$IMG"
    mv "$tmp" "$IMG"
    log "image $IMG/rootfs.img (${size} MiB, kernel $(cat "$IMG/kernel-release")) built in $(since "$t0") s"
}

# ---------------------------------------------------------------- the host side
netns_up() {
    ip netns add "$NAME" 2>/dev/null || die "network namespace $NAME exists (guest.sh stop, or GUEST_NAME=another)"
    ip -n "$NAME" link set lo up
}
host_addresses() {  # $1: the host side's link in the netns
    ip -n "$NAME" addr add "$HOST4/24" dev "$1"
    ip -n "$NAME" addr add "$HOST4B/24" dev "$1"
    ip -n "$NAME" addr add "$HOST6/64" dev "$1" nodad
    local a
    for a in $HOST_EXTRA; do
        ip -n "$NAME" addr add "$a" dev "$1" nodad
    done
    echo "$1" >"$RUN/link"
    ip -n "$NAME" link set "$1" up
}
netns_down() {
    ip netns del "$NAME" 2>/dev/null || true
}
# One master connection, kept for 10 minutes: a key exchange under TCG takes seconds.
# ssh's connection sharing socket: a Unix socket path has at most 107 bytes, and ssh
# adds 17 to it while it sets one up, so it lives under /run (not in a checkout, whose
# path may be long), named for this checkout's run folder and the guest.
CONTROL=/run/alfguest-ssh/$(printf %s "$RUN" | md5sum | cut -c1-8)-$NAME
SSH_OPTS=(-q -i "$IMG/id_ed25519" -p "$SSH_PORT" -o BatchMode=yes -o StrictHostKeyChecking=no
    -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o ConnectTimeout=5
    -o ServerAliveInterval=10 -o ServerAliveCountMax=6
    -o ControlMaster=auto -o "ControlPath=$CONTROL" -o ControlPersist=600)
guest_ssh() {
    mkdir -p -m 700 "${CONTROL%/*}"
    ip netns exec "$NAME" ssh "${SSH_OPTS[@]}" "root@$GUEST4" "$@"
}

running() {
    case "$(cat "$RUN/route" 2>/dev/null)" in
        qemu) [ -f "$RUN/qemu.pid" ] && kill -0 "$(cat "$RUN/qemu.pid")" 2>/dev/null ;;
        nspawn) [ -f "$RUN/nspawn.pid" ] && kill -0 "$(cat "$RUN/nspawn.pid")" 2>/dev/null ;;
        *) return 1 ;;
    esac
}

start_qemu() {
    need qemu-system-x86_64 qemu-system-x86
    local accel=${GUEST_ACCEL:-auto} cpu
    if [ "$accel" = auto ]; then
        # KVM runs Debian's kernel only on hardware virtualisation (kvm_intel, kvm_amd).
        # A /dev/kvm from kvm_pvm (nested PVM, as on Firecracker hosts) boots only
        # kernels built as PVM guests: Debian's hangs after "Probing EDD".  Then TCG.
        accel=tcg
        if [ -w /dev/kvm ] && { [ -d /sys/module/kvm_intel ] || [ -d /sys/module/kvm_amd ]; }; then
            accel=kvm
        fi
    fi
    case "$accel" in
        kvm) cpu=host ;;
        tcg) cpu=max; accel=tcg,thread=multi ;;
        *) die "GUEST_ACCEL is auto, kvm or tcg, not $accel" ;;
    esac
    echo "$accel" >"$RUN/accel"
    local drive="file=$IMG/rootfs.img,if=virtio,format=raw,cache=unsafe"
    [ "${GUEST_KEEP:-0}" = 1 ] || drive="$drive,snapshot=on"
    ip -n "$NAME" tuntap add dev "$TAP" mode tap
    host_addresses "$TAP"
    # -snapshot's overlay goes to TMPDIR: keep it with the run's state.
    TMPDIR=$RUN ip netns exec "$NAME" nice -n "${GUEST_NICE:-0}" qemu-system-x86_64 -name "$NAME" \
        -machine q35 -accel "$accel" -cpu "$cpu" -smp "$CPUS" -m "$MEM" \
        -nodefaults -no-user-config -display none -vga none \
        -kernel "$IMG/vmlinuz" -initrd "$IMG/initrd.img" \
        -append "root=/dev/vda rw console=ttyS0 panic=-1 ${GUEST_APPEND:-}" \
        -no-reboot \
        -drive "$drive" \
        -netdev "tap,id=n0,ifname=$TAP,script=no,downscript=no" \
        -device virtio-net-pci,netdev=n0,mac=52:54:00:52:42:02 \
        -device virtio-rng-pci \
        -serial "file:$RUN/console.log" \
        -monitor "unix:$RUN/monitor.sock,server,nowait" \
        -pidfile "$RUN/qemu.pid" -daemonize
}

# The container's cgroup: a folder of its own in each hierarchy systemd uses, so that
# its systemd does not take the host's root cgroup as its own (another systemd there,
# a test suite's `systemd --user`, would share /init.scope and the slices with it).
cgroup_dirs() {
    if [ -d /sys/fs/cgroup/unified ] && [ -d /sys/fs/cgroup/systemd ]; then  # hybrid (v1 + v2)
        echo "/sys/fs/cgroup/systemd/alfguest-$NAME /sys/fs/cgroup/unified/alfguest-$NAME"
    elif [ -f /sys/fs/cgroup/cgroup.controllers ]; then  # unified (v2 only)
        echo "/sys/fs/cgroup/alfguest-$NAME"
    fi
}
cgroup_remove() {
    local d
    for d in $(cgroup_dirs); do
        [ ! -d "$d" ] || find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
    done
}

start_nspawn() {
    need systemd-nspawn systemd-container
    [ "$(ps -o comm= -p 1)" != systemd ] ||
        die "the nspawn route is made for hosts whose PID 1 is not systemd (there: machinectl, or the qemu route)"
    local veth=ve-$NAME
    # --image= wants the host's udev, which a host without systemd lacks: the image
    # is loop-mounted here instead, read-only under a throw-away overlay
    # (--volatile=overlay) unless GUEST_KEEP=1.
    local vol=(--volatile=overlay) ro=ro
    [ "${GUEST_KEEP:-0}" = 1 ] && { vol=(); ro=rw; }
    mkdir -p "$RUN/root"
    mount -o "loop,$ro" "$IMG/rootfs.img" "$RUN/root"
    # systemd mounts no BPF file system in a container: a fresh one of its own
    # (a new instance, not the host's /sys/fs/bpf) is bound there.
    mkdir -p "$RUN/bpf"
    mount -t bpf -o mode=700 bpf "$RUN/bpf"
    local cgroups d
    cgroups=$(cgroup_dirs)
    cgroup_remove
    for d in $cgroups; do mkdir -p "$d"; done
    # A private network (--network-veth): its host end moves into our netns.
    # CAP_BPF and CAP_PERFMON (not in nspawn's default set) and bpf(2) and
    # perf_event_open(2) (not in its default system call filter) for the filters;
    # pidfd_getfd(2) (Linux 5.6, not in nspawn 252's filter either) for the bind
    # supervisor, which takes a daemon's sockets with it.
    # systemd 256 and later (trixie's 257) refuse cgroup v1: on a hybrid host nspawn
    # would give the guest hybrid, so a v2-only hierarchy is asked for.
    local cgenv=()
    [ "$SUITE" = bookworm ] || cgenv=(SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1)
    # shellcheck disable=SC2016,SC2086
    env "${cgenv[@]}" setsid bash -c 'for d in $0; do echo $$ >"$d/cgroup.procs"; done; exec "$@"' "$cgroups" \
        systemd-nspawn --quiet --boot --directory="$RUN/root" "${vol[@]}" \
        --machine="$NAME" --register=no --keep-unit \
        --network-veth \
        --capability=CAP_BPF,CAP_PERFMON \
        --system-call-filter='bpf perf_event_open pidfd_getfd' \
        --bind="$RUN/bpf:/sys/fs/bpf" \
        ${GUEST_NSPAWN_ARGS:-} \
        </dev/null >"$RUN/console.log" 2>&1 &
    echo $! >"$RUN/nspawn.pid"
    # The host end of the veth appears once the container's network is set up.
    local i
    for i in $(seq 1 100); do
        ip link show "$veth" >/dev/null 2>&1 && break
        kill -0 "$(cat "$RUN/nspawn.pid")" 2>/dev/null || { cat "$RUN/console.log" >&2; die "systemd-nspawn exited"; }
        sleep 0.1
    done
    ip link set "$veth" netns "$NAME"
    host_addresses "$veth"
}

start() {
    need_root
    need ip iproute2
    need ssh openssh-client
    if running; then
        die "already running (guest.sh stop first)"
    fi
    build
    local t0
    t0=$(now)
    rm -rf "$RUN"
    mkdir -p "$RUN"
    echo "$ROUTE" >"$RUN/route"
    echo "$IMG" >"$RUN/image"
    netns_up
    trap 'log "start failed: cleaning up"; stop >/dev/null 2>&1 || true' EXIT
    case "$ROUTE" in
        qemu) start_qemu ;;
        nspawn) start_nspawn ;;
        *) die "GUEST_ROUTE is qemu or nspawn, not $ROUTE" ;;
    esac
    log "booting ($ROUTE); console: $RUN/console.log"
    local deadline=$(( $(date +%s) + TIMEOUT ))
    until guest_ssh true 2>/dev/null; do
        running || { tail -n 30 "$RUN/console.log" >&2; die "the guest stopped while booting"; }
        [ "$(date +%s)" -lt "$deadline" ] || { tail -n 30 "$RUN/console.log" >&2; die "no ssh after $TIMEOUT s"; }
        sleep 0.5
    done
    trap - EXIT
    log "up in $(since "$t0") s: $(guest_ssh 'echo "PID 1 $(ps -o comm= -p 1), kernel $(uname -r), $(systemctl is-system-running)"' 2>&1 || true)"
}

stop() {
    need_root
    if running; then
        guest_ssh 'systemctl poweroff' >/dev/null 2>&1 || true
        local pidfile=$RUN/$(cat "$RUN/route").pid i
        for i in $(seq 1 60); do
            running || break
            sleep 0.5
        done
        if running; then
            log "the guest did not power off in 30 s: killing $(cat "$pidfile")"
            kill "$(cat "$pidfile")" 2>/dev/null || true
            sleep 1
        fi
    fi
    ip netns exec "$NAME" ssh "${SSH_OPTS[@]}" -O exit "root@$GUEST4" >/dev/null 2>&1 || true
    netns_down
    ! mountpoint -q "$RUN/root" 2>/dev/null || umount "$RUN/root"
    ! mountpoint -q "$RUN/bpf" 2>/dev/null || umount "$RUN/bpf"
    cgroup_remove
    rm -f "$RUN/qemu.pid" "$RUN/nspawn.pid" "$RUN/monitor.sock"
}

cmd=${1:-}
[ $# -eq 0 ] || shift
case "$cmd" in
    build) build ;;
    kernel) build >&2 && echo "$IMG/vmlinuz" ;;
    start) start ;;
    run)
        running || die "not running (guest.sh start)"
        guest_ssh "$*"
        ;;
    put)
        [ $# -eq 2 ] || die "usage: guest.sh put HOSTFILE GUESTPATH"
        running || die "not running (guest.sh start)"
        guest_ssh "cat > '$2'" <"$1"
        ;;
    client)
        running || die "not running (guest.sh start)"
        ip netns exec "$NAME" sh -c "$*"
        ;;
    console) cat "$RUN/console.log" ;;
    status)
        if running; then
            echo "running ($(cat "$RUN/route")), image $IMG"
        else
            echo "stopped; image $IMG $([ -f "$IMG/done" ] && echo built || echo 'not built')"
            exit 3
        fi
        ;;
    stop) stop ;;
    clean) stop; rm -rf "$DIR/images" ;;
    _customize) customize "$@" ;;
    *) sed -n '2,/^set -euo/p' "$SELF" | sed '$d; s/^# \{0,1\}//' >&2; exit 64 ;;
esac
