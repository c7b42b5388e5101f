#!/usr/bin/env bash
# The units under a real systemd PID 1: boots Debian bookworm with
# systemd-nspawn, installs Stratum Join into it and checks what the units
# promise (docs/operations.md). Run as root; CI runs it from .ci/run.
#
#   test/nspawn/run.sh [--deb dist/stratum_*.deb]
#
# Without --deb it installs with `make install DESTDIR=root`. The root is
# made with mmdebstrap in a temporary directory (never in the repository);
# NSPAWN_BASE=file.tar reuses a tarball of such a root instead. Needs
# systemd-container and mmdebstrap (apt-get install them).
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD

deb=
if [ "${1:-}" = --deb ]; then deb=$(realpath "$2"); fi

start=$(date +%s)
step() { echo "--- [$(( $(date +%s) - start ))s] $*"; }
fail() { echo "FAIL: $*" >&2; dump; exit 1; }

work=$(mktemp -d /var/tmp/stratum-nspawn.XXXXXX)
root=$work/root
nspawn_pid=
cleanup() {
  if [ -n "$nspawn_pid" ] && kill -0 "$nspawn_pid" 2>/dev/null; then
    kill -TERM "$nspawn_pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$nspawn_pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$nspawn_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

step "root file system"
mkdir "$root"
if [ -n "${NSPAWN_BASE:-}" ]; then
  tar -C "$root" -xf "$NSPAWN_BASE"
else
  mmdebstrap --quiet --variant=minbase --include=systemd,systemd-sysv,dbus bookworm "$root"
fi
echo stratum-test > "$root/etc/hostname"

step "install"
if [ -n "$deb" ]; then
  cp "$deb" "$root/root/stratum.deb"
else
  make -s install DESTDIR="$root"
fi
# test settings: a short watchdog and restart delay, so the run takes
# seconds; everything else is the unit as shipped
mkdir -p "$root/etc/systemd/system/stratum-agent.service.d"
cat > "$root/etc/systemd/system/stratum-agent.service.d/test.conf" <<'CONF'
[Service]
WatchdogSec=4s
TimeoutAbortSec=5s
RestartSec=1s
CONF

# boot ($1: log file); sets nspawn_pid and pid1
boot() {
  SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1 systemd-nspawn -q -D "$root" --register=no --keep-unit \
    --private-network --system-call-filter=bpf --capability=CAP_BPF,CAP_PERFMON \
    --console=passive -b >"$1" 2>&1 &
  nspawn_pid=$!
  pid1=
  for _ in $(seq 300); do
    for c in $(cat /proc/"$nspawn_pid"/task/*/children 2>/dev/null); do
      if grep -qE '^NSpid:.*[[:space:]]1$' /proc/"$c"/status 2>/dev/null; then pid1=$c; fi
    done
    [ -n "$pid1" ] && break
    kill -0 "$nspawn_pid" 2>/dev/null || { cat "$1"; fail "systemd-nspawn exited"; }
    sleep 0.1
  done
  [ -n "$pid1" ] || fail "no PID 1 in the container"
}
# in the container, as its root
ns() { nsenter -t "$pid1" -m -u -i -n -p -C -r -w -- env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"; }
dump() {
  [ -n "${pid1:-}" ] || return 0
  ns systemctl --no-pager status stratum-agent stratum-listener 2>&1 | tail -40 || true
  ns journalctl --no-pager -n 60 2>&1 || true
}
prop() { ns systemctl show -P "$2" "$1"; }
# wait_for SECONDS WHAT COMMAND...: until COMMAND succeeds
wait_for() {
  local n=$(( $1 * 5 )) what=$2; shift 2
  for _ in $(seq "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  fail "timed out after ${n}x0.2s waiting for $what"
}
is() { [ "$(prop "$1" "$2")" = "$3" ]; }
# jget FIELD: a top-level string member of the indented JSON on stdin
jget() { sed -n 's/^  "'"$1"'": *"\([^"]*\)".*/\1/p'; }
booted() { ns systemctl is-system-running 2>/dev/null | grep -qE '^(running|degraded)$'; }

step "boot"
boot "$work/console1.log"
wait_for 60 "boot" booted
ns systemctl --version | head -1

if [ -n "$deb" ]; then
  step "dpkg -i"
  ns dpkg -i /root/stratum.deb
  ns test -x /usr/bin/stratum-listener || fail "the package did not install /usr/bin/stratum-listener"
fi
step "units verify in the container"
ns systemd-analyze verify --man=no stratum-agent.service stratum-listener.service stratum-listener.socket stratum-listener-admin.socket

step "listener: init, then activation by the first datagram"
ns stratum-listener init --data /var/lib/stratum-listener --endpoint 127.0.0.1 --light-ksf >/dev/null
ns systemctl enable --now stratum-listener.socket stratum-listener-admin.socket
is stratum-listener.service ActiveState inactive || fail "the listener runs before anyone asked for it"
ns bash -c 'echo hello > /dev/udp/127.0.0.1/9444'
wait_for 30 "the listener activated by a datagram" is stratum-listener.service ActiveState active
prop stratum-listener.service StatusText | grep -q "serving joins" || fail "listener STATUS: $(prop stratum-listener.service StatusText)"

step "agent: joins with the code as a credential, READY only with an identity"
code=$(ns stratum-listener codes create --ttl 10m --auto-approve --max-uses 1 --json | jget code)
[ -n "$code" ] || fail "no code minted"
fp=$(ns stratum-listener ca show --json | jget caFingerprint)
[ -n "$fp" ] || fail "no CA fingerprint"
mkdir -p "$root/etc/stratum"
( umask 077; printf '%s\n' "$code" > "$root/etc/stratum/join-code" )
# no port: 9444 is the default
printf 'STRATUM_ENDPOINT=127.0.0.1\nSTRATUM_CA_FINGERPRINT=%s\n' "$fp" > "$root/etc/stratum/agent.env"
ns systemctl enable --now --no-block stratum-agent.service
wait_for 60 "the agent joined" is stratum-agent.service ActiveState active
prop stratum-agent.service StatusText | grep -q "^joined as " || fail "agent STATUS: $(prop stratum-agent.service StatusText)"
ns stratum-agent status --state /var/lib/stratum-agent >/dev/null || fail "READY=1 without an identity on disk"
[ ! -e "$root/etc/stratum/join-code" ] || fail "the join code is still on disk after the join"
journal=$(ns journalctl -u stratum-agent -o cat --no-pager)
grep -q "joining 127.0.0.1:9444" <<<"$journal" || fail "no STATUS line for the join in the journal"

step "watchdog: a stopped agent is killed and restarted"
main=$(prop stratum-agent.service MainPID)
ns bash -c "kill -STOP $main"
wait_for 60 "a restart after the watchdog" is stratum-agent.service NRestarts 1
wait_for 30 "the restarted agent up" is stratum-agent.service ActiveState active
[ "$(prop stratum-agent.service MainPID)" != "$main" ] || fail "same main PID after the watchdog restart"
journal=$(ns journalctl -u stratum-agent -o cat --no-pager)
grep -q "Failed with result 'watchdog'" <<<"$journal" || fail "no watchdog timeout in the journal"
grep -q "status=6/ABRT" <<<"$journal" || fail "the watchdog kill did not end by SIGABRT"

step "a refused code stops the unit for good"
ns systemctl stop stratum-agent.service
ns sh -c 'rm -rf /var/lib/private/stratum-agent/* /var/lib/stratum-agent/*'
minted=$(ns stratum-listener codes create --ttl 10m --auto-approve --max-uses 1 --json)
wrong=$(jget code <<<"$minted")
# a revoked code is refused for good (exit 1), as a wrong one is
ns stratum-listener codes revoke "$(jget id <<<"$minted")" >/dev/null
( umask 077; printf '%s\n' "$wrong" > "$root/etc/stratum/join-code" )
ns systemctl reset-failed stratum-agent.service || true
ns systemctl start --no-block stratum-agent.service
wait_for 60 "the agent failed" is stratum-agent.service ActiveState failed
is stratum-agent.service ExecMainStatus 1 || fail "refusal exit status $(prop stratum-agent.service ExecMainStatus), want 1"
is stratum-agent.service NRestarts 0 || fail "a refused agent was restarted"
prop stratum-agent.service StatusText | grep -q "^refused: " || fail "agent STATUS: $(prop stratum-agent.service StatusText)"

step "no code in the journal"
journal=$(ns journalctl -o cat --no-pager)
for c in "$code" "$wrong"; do
  if grep -qF "$c" <<<"$journal"; then fail "a join code is in the journal"; fi
done

step "reboot with the listener down: boot does not wait for the agent"
ns systemctl disable --now stratum-listener.socket stratum-listener-admin.socket stratum-listener.service
ns sh -c 'rm -rf /var/lib/private/stratum-agent/* /var/lib/stratum-agent/*'
( umask 077; printf '%s\n' "$code" > "$root/etc/stratum/join-code" )
ns systemctl poweroff || true
for _ in $(seq 300); do kill -0 "$nspawn_pid" 2>/dev/null || break; sleep 0.2; done
kill -0 "$nspawn_pid" 2>/dev/null && fail "the container did not power off"
wait "$nspawn_pid" || true
boot "$work/console2.log"
wait_for 60 "multi-user.target after the reboot" is multi-user.target ActiveState active
is stratum-agent.service ActiveState activating || fail "agent is $(prop stratum-agent.service ActiveState) while the listener is down, want activating"
# a join attempt times out after 30s (the agent's dial timeout), longer
# than WatchdogSec: the service loop's pings keep it alive through the
# attempt and into its retry
retried() { ns journalctl -b -u stratum-agent -o cat --no-pager | grep -c "join failed, retrying"; }
wait_for 90 "a retried join" retried
is stratum-agent.service NRestarts 0 || fail "the agent was restarted while it waited to join"
is stratum-agent.service ActiveState activating || fail "agent is $(prop stratum-agent.service ActiveState) after a retry, want activating"
prop stratum-agent.service StatusText | grep -qE "retrying|joining" || fail "agent STATUS: $(prop stratum-agent.service StatusText)"
ns stratum-agent status --state /var/lib/stratum-agent >/dev/null 2>&1 && fail "an identity without a listener"
ns systemctl poweroff || true
for _ in $(seq 300); do kill -0 "$nspawn_pid" 2>/dev/null || break; sleep 0.2; done

step "passed in $(( $(date +%s) - start ))s"
