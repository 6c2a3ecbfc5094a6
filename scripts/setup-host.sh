#!/bin/sh
# Install what alfwrapper needs on Debian 12, idempotently: Debian packages,
# a kernel headers tree BCC can use, and the virtualenv.  Run as root.
# With --venv-only: the virtualenv alone, nothing else on the host (for make install).
# With --dev: what `make lint` and `make unit` need, and the virtualenv: a handful of
# Debian packages (DEV_PACKAGES), not the daemons, guests and tools of the other tiers.
set -eu
cd "$(dirname "$0")/.."

venv() {
    if [ ! -x .venv/bin/python ]; then
        /usr/bin/python3 -m venv --system-site-packages .venv
    fi
    # editable_mode=compat: the checkout goes on sys.path ahead of dist-packages, so an
    # installed Debian package cannot shadow it (setuptools' default editable finder
    # comes after every path entry).
    if [ ! -f .venv/.installed ] || [ pyproject.toml -nt .venv/.installed ] \
        || [ "$0" -nt .venv/.installed ]; then
        .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]' \
            --config-settings editable_mode=compat
        touch .venv/.installed
    fi
}
if [ "${1:-}" = --venv-only ]; then
    venv
    exit 0
fi
# make lint (ruff, mypy, the man pages, the commit messages) and make unit (the pure
# Python tests: the libraries alfwrapper imports, shtab for completion, mandoc).
DEV_PACKAGES="python3-venv mandoc git make python3-numpy python3-matplotlib python3-pyroute2 python3-systemd python3-setproctitle python3-shtab python3-seccomp python3-siphashc python3-requests"

PACKAGES="python3-bpfcc libbpf1 python3-venv python3-matplotlib linux-headers-amd64 iproute2 mandoc systemd make ncat util-linux lighttpd nginx-light apache2 apache2-utils redis-server haproxy dnsmasq-base postgresql nftables iptables ethtool python3-scapy adduser fail2ban python3-systemd python3-pyroute2 python3-numpy python3-setproctitle python3-shtab bash-completion bpftool debhelper dh-python pybuild-plugin-pyproject python3-setuptools lintian python3-seccomp python3-siphashc openssh-server openssh-client tftpd-hpa git curl python3-requests python3-yaml crowdsec"
# The boot tier (tests/boot: Debian 12 and 13 guests with systemd as PID 1) and the kernel
# tier (tests/kernel: Debian's own kernel in qemu, a static replayer as its init).
PACKAGES="$PACKAGES mmdebstrap systemd-container qemu-system-x86 e2fsprogs cpio gcc libc6-dev"
# install_packages LIST: the Debian packages of LIST that are missing (as root).
install_packages() {
    missing=""
    for p in $1; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
    done
    if [ -n "$missing" ]; then
        if [ "$(id -u)" != 0 ]; then
            echo "setup: missing Debian packages:$missing (run as root, or apt-get install them)" >&2
            exit 77
        fi
        echo "setup: installing$missing"
        apt-get update -qq
        # The daemons installed for the gallery's tests (sshd, in.tftpd) run behind
        # alfwrapper only: policy-rc.d(8) keeps their packages from starting them.
        guard=""
        if [ ! -e /usr/sbin/policy-rc.d ]; then
            printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
            chmod 755 /usr/sbin/policy-rc.d
            guard=/usr/sbin/policy-rc.d
        fi
        # crowdsec (the bouncer's tests run its LAPI): its postinst registers with the
        # Central API unless credentials exist, and offline that fails the install.  A
        # file that holds none keeps it local ("push and pull to Central API disabled").
        case " $missing " in
            *" crowdsec "*) mkdir -p /etc/crowdsec
                [ -s /etc/crowdsec/online_api_credentials.yaml ] ||
                    echo "# no thanks: alfwrapper's tests run this LAPI offline" \
                        >/etc/crowdsec/online_api_credentials.yaml ;;
        esac
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null || {
            [ -z "$guard" ] || rm -f "$guard"
            exit 69
        }
        [ -z "$guard" ] || rm -f "$guard"
        # The tests drive fail2ban and CrowdSec's LAPI themselves: the system's own
        # services, if this install just started them, are not wanted.
        for daemon in fail2ban crowdsec; do
            case " $missing " in
                *" $daemon "*) [ -d /run/systemd/system ] && [ "$(ps -p 1 -o comm=)" = systemd ] &&
                    systemctl disable --now "$daemon" >/dev/null 2>&1 || true ;;
            esac
        done
    fi
}

if [ "${1:-}" = --dev ]; then
    install_packages "$DEV_PACKAGES"
    venv
    exit 0
fi
install_packages "$PACKAGES"

# Pinned state lives in a BPF file system at /sys/fs/bpf (systemd mounts it at
# boot; where PID 1 is not systemd, nobody does).
if [ "$(stat -f -c %T /sys/fs/bpf 2>/dev/null)" != "bpf_fs" ]; then
    if [ "$(id -u)" = 0 ]; then
        mount -t bpf -o mode=700 bpf /sys/fs/bpf
        echo "setup: mounted a BPF file system on /sys/fs/bpf"
    else
        echo "setup: /sys/fs/bpf is not a BPF file system (run as root to mount it)" >&2
        exit 77
    fi
fi

# alfwrapper's system users (sysusers/alfwrapper.conf says what each is for).
if [ "$(id -u)" = 0 ] && ! { getent passwd alfwrapper && getent passwd alfwrapper-loader &&
        getent passwd alfwrapper-sets; } >/dev/null; then
    systemd-sysusers "$PWD/sysusers/alfwrapper.conf"
    echo "setup: created the system users alfwrapper, alfwrapper-loader and alfwrapper-sets"
fi

venv
