#!/usr/bin/env bash
# Several listeners as one cluster, on loopback: three etcd members (built
# from the etcd Go module), three listeners sharing them, a join through
# each, a CA rotation on one that the others serve, one listener killed,
# and a join that fails over past it. See docs/cluster.md.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$PWD/bin
DEMO=$(mktemp -d /tmp/stratum-demo-ha.XXXXXX)
BASE=${STRATUM_DEMO_PORT:-19500}
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$DEMO"
}
trap cleanup EXIT
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "three etcd members on 127.0.0.1:$((BASE+1))..$((BASE+3)) (peers $((BASE+11))..$((BASE+13)))"
CLUSTER=""
for i in 1 2 3; do CLUSTER+="${CLUSTER:+,}e$i=http://127.0.0.1:$((BASE+10+i))"; done
for i in 1 2 3; do
  "$BIN/etcd" --name "e$i" --data-dir "$DEMO/etcd$i" \
    --listen-client-urls "http://127.0.0.1:$((BASE+i))" --advertise-client-urls "http://127.0.0.1:$((BASE+i))" \
    --listen-peer-urls "http://127.0.0.1:$((BASE+10+i))" --initial-advertise-peer-urls "http://127.0.0.1:$((BASE+10+i))" \
    --initial-cluster "$CLUSTER" --initial-cluster-state new --log-level error 2>"$DEMO/etcd$i.log" &
  PIDS+=($!)
done
STORE="etcd://127.0.0.1:$((BASE+1)),127.0.0.1:$((BASE+2)),127.0.0.1:$((BASE+3))/demo-ha"

EP=() SOCK=() LPID=()
for i in 1 2 3; do EP[$i]="127.0.0.1:$((BASE+20+i))"; SOCK[$i]="$DEMO/admin$i.sock"; done
serve() {
  "$BIN/stratum-listener" serve --data "$DEMO/l$1" --store "$STORE" --listen "${EP[$1]}" --admin-socket "${SOCK[$1]}" 2>>"$DEMO/l$1.log" &
  LPID[$1]=$!
  PIDS+=($!)
  for _ in $(seq 100); do STRATUM_ADMIN_SOCKET=${SOCK[$1]} "$BIN/stratum-listener" ca show >/dev/null 2>&1 && return; sleep 0.1; done
  echo "listener $1 did not start:"; cat "$DEMO/l$1.log"; exit 1
}
admin() { local i=$1; shift; STRATUM_ADMIN_SOCKET=${SOCK[$i]} "$BIN/stratum-listener" "$@"; }

say "listener 1: init makes the cluster and seals its keys into etcd"
for _ in $(seq 100); do "$BIN/stratum-listener" init --data "$DEMO/l1" --light-ksf --trust-domain ha.stratum.local --endpoint "${EP[1]}" --store "$STORE" && break; sleep 0.2; done
serve 1

say "listener 2: a plain init on the same store is refused, and says what to run"
"$BIN/stratum-listener" init --data "$DEMO/l2" --endpoint "${EP[2]}" --store "$STORE" && exit 1 || echo "(exit status $?)"

say "listeners 2 and 3: init --join with the cluster's key-encryption key"
cp "$DEMO/l1/keys/cluster.kek" "$DEMO/cluster.kek"
for i in 2 3; do
  "$BIN/stratum-listener" init --join --kek "$DEMO/cluster.kek" --store "$STORE" --data "$DEMO/l$i" --endpoint "${EP[$i]}"
  serve "$i"
done
for i in 1 2 3; do printf 'listener %s: ' "$i"; admin "$i" ca show --json | sed -n 's/.*"caFingerprint": "\(.*\)".*/\1/p'; done

join_via() { # listener-to-mint-on state endpoints...
  local m=$1 st=$2; shift 2
  admin "$m" codes create --ttl 15m --json --auto-approve --max-uses 1 >"$DEMO/code.json"
  local code; code=$(sed -n 's/.*"code": "\(.*\)".*/\1/p' "$DEMO/code.json")
  local args=(); for e in "$@"; do args+=(--endpoint "$e"); done
  # each demo node is its own machine: a DMI tree with its own product UUID
  mkdir -p "$DEMO/$st-root/sys/class/dmi/id"
  cat /proc/sys/kernel/random/uuid >"$DEMO/$st-root/sys/class/dmi/id/product_uuid"
  printf '%s\n' "$code" | "$BIN/stratum-agent" join "${args[@]}" --code - --state "$DEMO/$st" --root "$DEMO/$st-root" | sed -n '1,2p'
}
say "a code minted on listener 1 joins through listener 2, another through listener 3"
join_via 1 node-a "${EP[2]}"
join_via 1 node-b "${EP[3]}"
say "what listener 1's mint prints: every endpoint of the cluster"
admin 1 codes create --ttl 5m --auto-approve --max-uses 1 | sed -n '1,/^$/p;/stratum-agent join/p'

say "ca rotate on listener 2; listeners 1 and 3 serve the new root through the etcd watch"
NEW=$(admin 2 ca rotate --json | sed -n 's/.*"caFingerprint": "\(.*\)".*/\1/p')
echo "new root $NEW"
for i in 1 3; do
  for _ in $(seq 50); do admin "$i" ca show --json | grep -q "$NEW" && break; sleep 0.1; done
  printf 'listener %s serves ' "$i"; admin "$i" ca show --json | sed -n 's/.*"caFingerprint": "\(.*\)".*/\1/p'
done
join_via 1 node-c "${EP[3]}"

say "kill listener 1; an agent given all three endpoints joins through the next"
kill "${LPID[1]}"; wait "${LPID[1]}" 2>/dev/null || true
join_via 2 node-d "${EP[1]}" "${EP[2]}" "${EP[3]}"
admin 2 codes list --all | head -8
say "demo-ha complete"
