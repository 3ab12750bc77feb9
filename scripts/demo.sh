#!/usr/bin/env bash
# The walkthrough of docs/walkthrough.md, run against a running stack, with
# every check printed. `make demo` runs it.
#
# Against `docker compose up` (default): needs curl and jq on the host;
# psql and rabbitmqctl run inside the containers (`docker compose exec`), and
# messages are read through the RabbitMQ management API on :15672.
#
# Against other services, set:
#   DEMO_REST_URL             tidyconnect REST API      (default http://localhost:8083)
#   DEMO_POSTGRES_URL         psql URL for this script  (switches off compose mode)
#   DEMO_RABBITMQ_URL         AMQP URL for this script  (messages read with scripts/amqptool)
#   DEMO_WORKER_POSTGRES_URL  postgres.url the worker should use (default DEMO_POSTGRES_URL)
#   DEMO_WORKER_RABBITMQ_URL  rabbitmq.url the worker should use (default DEMO_RABBITMQ_URL)
#   DEMO_RABBITMQCTL          rabbitmqctl command       (default rabbitmqctl)
# Exit status: 0 when every check passed, 1 otherwise.
# shellcheck disable=SC2317 # helpers are called indirectly, through check and await
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

REST="${DEMO_REST_URL:-http://localhost:8083}"
SRC=pgaudit-demo
SINK=amqpsink-demo
# A queue made by hand before the sink exists: the sink delivers into it (its
# name is what rabbitmq.queue=${topic} resolves to) but never owns it, so
# deleting the sink must leave it, while demo.shop.customers, which the sink
# creates, goes.
MINE=demo.shop.orders
FAILED=0
RUN=$(date +%s) # tags this run's rows: the topics may hold earlier runs' changes

if [ -n "${DEMO_POSTGRES_URL:-}" ]; then
  MODE="env"
  psql_() { psql "$DEMO_POSTGRES_URL" -X -q -At -v ON_ERROR_STOP=1 "$@"; }
  rabbitmqctl_() { ${DEMO_RABBITMQCTL:-rabbitmqctl} "$@"; }
  : "${DEMO_RABBITMQ_URL:?set DEMO_RABBITMQ_URL too (amqp://user:pass@host:5672/)}"
else
  MODE="compose"
  psql_() { docker compose exec -T postgres psql -U postgres -d demo -X -q -At -v ON_ERROR_STOP=1 "$@"; }
  rabbitmqctl_() { docker compose exec -T rabbitmq rabbitmqctl "$@"; }
  MGMT="${DEMO_RABBITMQ_API:-http://localhost:15672/api}"
fi

for tool in curl jq; do
  command -v "$tool" >/dev/null || { echo "demo: $tool is required on the host" >&2; exit 2; }
done

step() { printf '\n== %s\n' "$*"; }
ok() { printf '  ok    %s\n' "$*"; }
fail() { printf '  FAIL  %s\n' "$*"; FAILED=1; }
check() { # check "description" command...
  local what=$1; shift
  if "$@"; then ok "$what"; else fail "$what"; fi
}

# await "description" seconds command...: poll until the command succeeds.
await() {
  local what=$1 secs=$2; shift 2
  local deadline=$((SECONDS + secs))
  while ! "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then fail "$what (not within ${secs}s)"; return 1; fi
    sleep 0.5
  done
  ok "$what"
}

api() { # api METHOD PATH [BODY]: prints the body, fails on HTTP >= 400
  local method=$1 path=$2 body=${3:-}
  if [ -n "$body" ]; then
    curl -sS -f -X "$method" -H 'Content-Type: application/json' --data "$body" "$REST$path"
  else
    curl -sS -f -X "$method" "$REST$path"
  fi
}

api_quiet() { api "$@" >/dev/null; }

# Connector bodies: the examples, pointed at this script's services.
example() {
  local f=examples/$1
  if [ "$MODE" = env ]; then
    jq --arg pg "${DEMO_WORKER_POSTGRES_URL:-$DEMO_POSTGRES_URL}" --arg mq "${DEMO_WORKER_RABBITMQ_URL:-$DEMO_RABBITMQ_URL}" '
      if .config["postgres.url"] then .config["postgres.url"] = $pg else . end |
      if .config["rabbitmq.url"] then .config["rabbitmq.url"] = $mq else . end' "$f"
  else
    cat "$f"
  fi
}

declare_queue() {
  if [ "$MODE" = env ]; then
    go run ./scripts/amqptool -url "$DEMO_RABBITMQ_URL" declare "$1" quorum
  else
    curl -sS -f -u guest:guest -X PUT -H 'Content-Type: application/json' \
      --data '{"durable":true,"arguments":{"x-queue-type":"quorum"}}' "$MGMT/queues/%2F/$1" >/dev/null
  fi
}
delete_queue() {
  if [ "$MODE" = env ]; then
    go run ./scripts/amqptool -url "$DEMO_RABBITMQ_URL" delete "$1"
  else
    curl -sS -f -u guest:guest -X DELETE "$MGMT/queues/%2F/$1" >/dev/null
  fi
}
read_batch() { # read_batch QUEUE: consume what is there now, one JSON body per line
  if [ "$MODE" = env ]; then
    go run ./scripts/amqptool -url "$DEMO_RABBITMQ_URL" get "$1" 500 1s
  else
    curl -sS -f -u guest:guest -X POST -H 'Content-Type: application/json' \
      --data '{"count":500,"ackmode":"ack_requeue_false","encoding":"auto"}' \
      "$MGMT/queues/%2F/$1/get" | jq -c '.[].payload | fromjson'
  fi
}
# read_until QUEUE JQ_FILTER N: consume QUEUE until N messages match the
# filter (or 30s pass) and print the matching ones. Filtering matters: the
# topics keep older changes (an earlier run), which a new sink replays.
read_until() {
  local q=$1 filter=$2 n=$3 deadline=$((SECONDS + 30)) got=""
  while [ $SECONDS -lt $deadline ]; do
    got+=$(read_batch "$q" | jq -c "select($filter)" 2>/dev/null)$'\n'
    [ "$(printf '%s' "$got" | grep -c .)" -ge "$n" ] && break
    sleep 0.5
  done
  printf '%s' "$got" | grep .
}
queue_exists() { rabbitmqctl_ -q list_queues name | grep -qx "$1"; }
exchange_exists() { rabbitmqctl_ -q list_exchanges name | grep -qx "$1"; }
queue_absent() { rabbitmqctl_ -q list_queues name >/dev/null && ! queue_exists "$1"; }
exchange_absent() { rabbitmqctl_ -q list_exchanges name >/dev/null && ! exchange_exists "$1"; }
not_owned() { ! api GET "/connectors/$1/resources" | grep -q "\"$2\""; }
has_after_name() { printf '%s\n' "$1" | jq -s -e --arg n "$2" 'any(.[]; .after.name == $n)' >/dev/null; }

connector_running() {
  local s
  s=$(api GET "/connectors/$1/status") || return 1
  [ "$(jq -r '.connector.state' <<<"$s")" = RUNNING ] &&
    [ "$(jq '[.tasks[] | select(.state == "RUNNING")] | length' <<<"$s")" -ge 1 ] &&
    [ "$(jq '[.tasks[] | select(.state != "RUNNING")] | length' <<<"$s")" -eq 0 ]
}
connector_state_is() { [ "$(api GET "/connectors/$1/status" | jq -r '.connector.state')" = "$2" ]; }
connector_gone() { ! curl -sf "$REST/connectors/$1" >/dev/null; }

# Objects in PostgreSQL that tidyconnect marked as its own (COMMENT
# 'tidyconnect:<connector>'), plus triggers on the demo tables.
owned_pg_objects() {
  psql_ -c "
    SELECT 'schema ' || n.nspname FROM pg_namespace n
     WHERE obj_description(n.oid, 'pg_namespace') LIKE 'tidyconnect:$SRC%'
    UNION ALL SELECT 'table ' || c.oid::regclass FROM pg_class c
     WHERE obj_description(c.oid, 'pg_class') LIKE 'tidyconnect:$SRC%'
    UNION ALL SELECT 'function ' || p.oid::regprocedure FROM pg_proc p
     WHERE obj_description(p.oid, 'pg_proc') LIKE 'tidyconnect:$SRC%'
    UNION ALL SELECT 'trigger ' || t.tgname || ' on ' || t.tgrelid::regclass FROM pg_trigger t
     WHERE NOT t.tgisinternal AND t.tgrelid IN ('shop.customers'::regclass, 'shop.orders'::regclass)"
}

echo "tidyconnect demo ($MODE mode, REST at $REST)"

step "1. The worker answers"
await "GET / answers" 60 api GET /
api GET / | jq -c . 2>/dev/null | sed 's/^/        /'
plugins=$(api GET /connector-plugins | jq -r '.[].class' | tr '\n' ' ')
check "plugins listed: $plugins" grep -qi pgaudit <<<"$plugins"
check "amqpsink plugin present" grep -qi amqpsink <<<"$plugins"

step "2. A queue of your own that the sink will use but must never delete"
check "declared $MINE by hand" declare_queue "$MINE"

step "3. Deploy the connectors"
seed_customers=$(psql_ -c "SELECT count(*) FROM shop.customers")
seed_orders=$(psql_ -c "SELECT count(*) FROM shop.orders")
echo "        seed rows: $seed_customers customers, $seed_orders orders"
check "POST /connectors $SRC" api_quiet POST /connectors "$(example pgaudit-demo.json)"
check "POST /connectors $SINK" api_quiet POST /connectors "$(example amqpsink-demo.json)"
await "$SRC is RUNNING with all tasks RUNNING" 60 connector_running "$SRC"
await "$SINK is RUNNING with all tasks RUNNING" 60 connector_running "$SINK"

step "4. What each connector owns (what deleting it would drop)"
for c in "$SRC" "$SINK"; do
  res=$(api GET "/connectors/$c/resources")
  jq -r '.[] | "        \(.kind) \(.name) at \(.location)"' <<<"$res"
  check "$c owns at least one resource" test "$(jq 'length' <<<"$res")" -gt 0
done
check "$SINK does not own the hand-made queue $MINE" not_owned "$SINK" "$MINE"

step "5. Write rows and read the messages"
email="demo-$RUN@example.com"
psql_ -c "INSERT INTO shop.customers (name, email) VALUES ('Demo User', '$email')" &&
psql_ -c "UPDATE shop.customers SET name = 'Demo User (renamed)' WHERE email = '$email'" &&
psql_ -c "DELETE FROM shop.customers WHERE email = '$email'"
check "insert, update, delete of $email committed" test $? -eq 0
msgs=$(read_until demo.shop.customers "(.after.email // .before.email) == \"$email\"" 3)
printf '%s\n' "$msgs" | sed 's/^/        /'
ops=$(printf '%s\n' "$msgs" | jq -r --arg e "$email" 'select((.after.email // .before.email) == $e) | .op' | tr '\n' ' ')
check "three messages for $email, in commit order (ops: $ops)" test "$ops" = "c u d "
check "the update message carries the new name" has_after_name "$msgs" "Demo User (renamed)"

step "6. Pause and resume"
check "PUT /connectors/$SRC/pause" api_quiet PUT "/connectors/$SRC/pause"
await "$SRC is PAUSED" 30 connector_state_is "$SRC" PAUSED
psql_ -c "INSERT INTO shop.orders (customer_id, amount, status) SELECT min(id), 1.00, 'while-paused-$RUN' FROM shop.customers"
check "resources kept while paused" test "$(api GET "/connectors/$SRC/resources" | jq 'length')" -gt 0
check "PUT /connectors/$SRC/resume" api_quiet PUT "/connectors/$SRC/resume"
await "$SRC is RUNNING again" 30 connector_running "$SRC"
msgs=$(read_until "$MINE" ".after.status == \"while-paused-$RUN\"" 1)
check "the row written while paused arrived after resume" grep -q "while-paused-$RUN" <<<"$msgs"

step "7. Delete the connectors"
before_pg=$(owned_pg_objects)
printf '%s\n' "$before_pg" | sed 's/^/        before: /'
check "DELETE /connectors/$SINK" api_quiet DELETE "/connectors/$SINK"
check "DELETE /connectors/$SRC" api_quiet DELETE "/connectors/$SRC"
await "$SINK is gone from GET /connectors" 60 connector_gone "$SINK"
await "$SRC is gone from GET /connectors" 60 connector_gone "$SRC"

step "8. Exactly the owned objects are gone"
after_pg=$(owned_pg_objects)
check "no audit table, function or trigger of $SRC is left in PostgreSQL" test -z "$after_pg"
check "schema tidyconnect_audit is gone (it was created by the connector)" \
  test "$(psql_ -c "SELECT count(*) FROM pg_namespace WHERE nspname = 'tidyconnect_audit'")" = 0
check "shop.customers still has its $seed_customers seed rows" \
  test "$(psql_ -c "SELECT count(*) FROM shop.customers")" -ge "$seed_customers"
check "shop.orders still has its rows" \
  test "$(psql_ -c "SELECT count(*) FROM shop.orders")" -ge "$seed_orders"
check "queue demo.shop.customers (created by $SINK) is gone" queue_absent demo.shop.customers
check "exchange tidyconnect.demo (created by $SINK) is gone" exchange_absent tidyconnect.demo
check "your queue $MINE is still there" queue_exists "$MINE"

step "Cleanup of what the demo itself made (so it can run again)"
if delete_queue "$MINE"; then ok "deleted your queue $MINE"; else fail "deleting $MINE"; fi

echo
if [ $FAILED -eq 0 ]; then echo "demo: all checks passed"; else echo "demo: some checks FAILED"; fi
exit $FAILED
