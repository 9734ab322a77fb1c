#!/usr/bin/env bash
# Installs the Debian packages voiceedge needs, only those missing (idempotent, fast when done).
set -euo pipefail
packages=(mininet bridge-utils iptables conntrack iputils-ping redis-server tcpdump coturn python3-venv python3-dev gcc libsrtp2-dev libopus-dev libssl-dev espeak-ng)
# Usage: install-debian-deps.sh [base] [browsers] [fuzz]
#   base       what every command needs (above; the default)
#   browsers   Debian's chromium, for browser clients (make browsers; docs/browser.md)
#   fuzz       Debian's clang, for the media plane's fuzzer (make fuzz; docs/mediaplane.md)
# Both at once (make test) is one apt-get update and one install: on a fresh machine the
# second update of two separate calls costs as much as the first.
modes=("${@:-base}")
wanted=()
with_base=no
for mode in "${modes[@]}"; do
    case "$mode" in
        base) wanted+=("${packages[@]}"); with_base=yes ;;
        browsers) wanted+=(chromium) ;;
        fuzz) wanted+=(clang libclang-rt-14-dev) ;;   # the ASan/UBSan/libFuzzer runtimes
        *) echo "usage: $0 [base] [browsers] [fuzz]" >&2; exit 2 ;;
    esac
done
missing=()
for p in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "voiceedge: missing Debian packages: ${missing[*]} (run as root, or install them yourself)" >&2
    exit 1
fi
echo "voiceedge: installing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# --no-install-recommends: mininet would otherwise pull openvswitch-switch, unused here.
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
if [ "$with_base" = no ]; then exit 0; fi
# The package starts a system redis-server on :6379; tests run their own, so keep it from lingering.
if [ -d /run/systemd/system ]; then systemctl disable --now redis-server >/dev/null 2>&1 || true; fi
# coturn's package may start (or enable) a system turnserver on :3478; the edge runs its own
# per client region (services/turn/), so none may linger.
if [ -d /run/systemd/system ]; then systemctl disable --now coturn >/dev/null 2>&1 || true; fi
if [ -x /etc/init.d/coturn ]; then /etc/init.d/coturn stop >/dev/null 2>&1 || true; fi
