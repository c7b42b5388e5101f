#!/usr/bin/env bash
# The whole Stratum Join flow on loopback with the embedded (bbolt) store:
# init a listener, serve it, mint a code, join an agent, show the outcome.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$PWD/bin
DEMO=$(mktemp -d /tmp/stratum-demo.XXXXXX)
PORT=${STRATUM_DEMO_PORT:-19444}
export STRATUM_ADMIN_SOCKET=$DEMO/admin.sock
LISTENER_PID=
cleanup() {
  [ -n "$LISTENER_PID" ] && kill "$LISTENER_PID" 2>/dev/null && wait "$LISTENER_PID" 2>/dev/null || true
  rm -rf "$DEMO"
}
trap cleanup EXIT
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "init a listener in $DEMO/listener (CA, QUIC certificate, OPAQUE keys; all 0600)"
"$BIN/stratum-listener" init --data "$DEMO/listener" --trust-domain demo.stratum.local --endpoint "127.0.0.1:$PORT"

say "serve joins on udp/127.0.0.1:$PORT, admin API on $STRATUM_ADMIN_SOCKET"
"$BIN/stratum-listener" serve --data "$DEMO/listener" --listen "127.0.0.1:$PORT" --admin-socket "$STRATUM_ADMIN_SOCKET" 2>"$DEMO/listener.log" &
LISTENER_PID=$!
for _ in $(seq 50); do [ -S "$STRATUM_ADMIN_SOCKET" ] && break; sleep 0.1; done
"$BIN/stratum-listener" ca show

say "mint a join code (shown once)"
"$BIN/stratum-listener" codes create --ttl 15m --auto-approve --max-uses 1 | tee "$DEMO/mint.txt"
CODE=$(awk '/^join code/ {print $3}' "$DEMO/mint.txt")

say "join: the agent proves the code with OPAQUE over QUIC, learns and pins the CA"
printf '%s\n' "$CODE" | "$BIN/stratum-agent" join --endpoint "127.0.0.1:$PORT" --code - --state "$DEMO/agent"

say "what the node holds"
ls -l "$DEMO/agent"
"$BIN/stratum-agent" status --state "$DEMO/agent"
openssl x509 -in "$DEMO/agent/node.crt" -noout -subject -ext subjectAltName -dates
printf 'openssl verify: '
openssl verify -CAfile "$DEMO/agent/ca.pem" "$DEMO/agent/node.crt"

say "a typo is caught by the check symbol before any traffic"
TYPO=$(printf '%s' "$CODE" | tr '0123456789ABCDEFGHJKMNPQRSTVWXYZ' '123456789ABCDEFGHJKMNPQRSTVWXYZ0')
printf '%s\n' "$TYPO" | "$BIN/stratum-agent" join --endpoint "127.0.0.1:$PORT" --code - --state "$DEMO/agent2" && exit 1 || echo "(exit status $?)"

say "a revoked code: only its holder learns why it is refused"
"$BIN/stratum-listener" codes create --json --auto-approve --max-uses 1 > "$DEMO/mint2.json"
CODE2=$(sed -n 's/.*"code": "\(.*\)".*/\1/p' "$DEMO/mint2.json")
ID2=$(sed -n 's/.*"id": "\(.*\)".*/\1/p' "$DEMO/mint2.json")
"$BIN/stratum-listener" codes revoke "$ID2"
printf '%s\n' "$CODE2" | "$BIN/stratum-agent" join --endpoint "127.0.0.1:$PORT" --code - --state "$DEMO/agent3" && exit 1 || echo "(exit status $?)"

say "the listener's view"
"$BIN/stratum-listener" nodes list
"$BIN/stratum-listener" codes list --all
"$BIN/stratum-listener" events
if grep -rqF -e "$CODE" -e "$CODE2" -e "$(printf '%s' "$CODE" | tr -d -)" "$DEMO/listener.log" "$DEMO/listener" "$DEMO"/agent*; then echo "a code leaked!"; exit 1; fi
say "demo complete: the code appears in no log and no file"
