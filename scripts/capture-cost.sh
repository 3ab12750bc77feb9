#!/usr/bin/env bash
# Counts the instructions pgaudit's capture adds to single-row statements,
# with callgrind on a throwaway single-user PostgreSQL server: the same
# figures on every run, however busy the machine (docs/pgaudit.md,
# "Instruction counts"). Wall-clock ratios are `make bench`'s job.
#
#   scripts/capture-cost.sh [N]
#
# For each table it runs N and 2N single-row INSERTs (then UPDATEs), each its
# own transaction, and reports the difference per statement, so start-up and
# the first statements' cache misses cancel out. Tables: plain (no trigger),
# empty (a statement-level trigger with transition tables whose function
# does nothing: the floor of any trigger), by_statement (pgaudit's defaults)
# and by_row (capture.level=row). Needs valgrind, PostgreSQL's server binaries
# (PG_BIN, default: pg_config --bindir) and Go; as root it runs the server
# as the postgres user.
set -euo pipefail
N=${1:-1000}
PG_BIN=${PG_BIN:-$(pg_config --bindir)}
PORT=${PORT:-55499}
here=$(cd "$(dirname "$0")/.." && pwd)
dir=$(mktemp -d /tmp/capture-cost.XXXXXX)
as_pg() { if [ "$(id -u)" = 0 ]; then su postgres -c "$*"; else bash -c "$*"; fi; }
[ "$(id -u)" = 0 ] && chown postgres "$dir"
cleanup() { as_pg "'$PG_BIN/pg_ctl' -D '$dir/data' -m immediate stop" >/dev/null 2>&1 || true; rm -rf "$dir"; }
trap cleanup EXIT
command -v valgrind >/dev/null || { echo "capture-cost: valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }

as_pg "'$PG_BIN/initdb' -D '$dir/data' -A trust -U postgres" >/dev/null
as_pg "'$PG_BIN/pg_ctl' -D '$dir/data' -o '-p $PORT -k $dir -c listen_addresses=127.0.0.1 -c fsync=off' -l '$dir/log' -w start" >/dev/null
url="postgres://postgres@127.0.0.1:$PORT/postgres?sslmode=disable"
cols='(id int PRIMARY KEY, a int NOT NULL, b text NOT NULL, c numeric(12,2) NOT NULL, d timestamptz NOT NULL)'
psql -q -v ON_ERROR_STOP=1 "$url" <<SQL
CREATE TABLE plain $cols;
CREATE TABLE empty $cols;
CREATE TABLE by_statement $cols;
CREATE TABLE by_row $cols;
CREATE FUNCTION empty_capture() RETURNS trigger LANGUAGE plpgsql AS \$\$BEGIN RETURN NULL; END\$\$;
CREATE TRIGGER empty_ins AFTER INSERT ON empty REFERENCING NEW TABLE AS n FOR EACH STATEMENT EXECUTE FUNCTION empty_capture();
CREATE TRIGGER empty_upd AFTER UPDATE ON empty REFERENCING OLD TABLE AS o NEW TABLE AS n FOR EACH STATEMENT EXECUTE FUNCTION empty_capture();
SQL
(cd "$here" && go run ./scripts/capturecost -url "$url" -name cost -tables public.by_statement &&
	go run ./scripts/capturecost -url "$url" -name costrow -tables public.by_row -set capture.level=row)
audits=$(psql -qAt "$url" -c "SELECT string_agg(format('%I.%I', schemaname, tablename), ', ') FROM pg_tables WHERE tablename LIKE '%\_audit'")
as_pg "'$PG_BIN/pg_ctl' -D '$dir/data' -w stop" >/dev/null

# script TABLE OP COUNT: TRUNCATE, then COUNT single-row statements.
script() {
	printf 'TRUNCATE %s;\nTRUNCATE %s;\n' "$1" "$audits"
	if [ "$2" = insert ]; then
		printf "PREPARE s(int) AS INSERT INTO %s VALUES (\$1, \$1 %% 1000, 'name', 1.25, now());\n" "$1"
	else
		printf "INSERT INTO %s SELECT g, g %% 1000, 'name', 1.25, now() FROM generate_series(0, %d) g;\n" "$1" $((2 * N))
		printf 'PREPARE s(int) AS UPDATE %s SET a = a + 1 WHERE id = $1;\n' "$1"
	fi
	seq 0 $(($3 - 1)) | sed 's/.*/EXECUTE s(&);/'
}
# count TABLE OP COUNT: instructions of the whole single-user run.
count() {
	script "$@" >"$dir/in.sql"
	chmod a+r "$dir/in.sql"
	as_pg "valgrind --tool=callgrind --callgrind-out-file='$dir/out.cg' '$PG_BIN/postgres' --single -D '$dir/data' -c fsync=off postgres <'$dir/in.sql' >'$dir/out.txt' 2>&1"
	if grep -q ERROR "$dir/out.txt"; then
		echo "capture-cost: $1 $2: $(grep -m1 ERROR "$dir/out.txt")" >&2
		exit 1
	fi
	awk '/^totals:/ {print $2}' "$dir/out.cg"
}
printf '%-13s %-7s %12s %12s %8s\n' table op 'instr/stmt' 'extra' 'ratio'
for op in insert update; do
	base=0
	for t in plain empty by_statement by_row; do
		per=$((($(count $t $op $((2 * N))) - $(count $t $op "$N")) / N))
		[ $t = plain ] && base=$per
		printf '%-13s %-7s %12d %12d %7.2fx\n' $t $op $per $((per - base)) "$(awk -v a="$per" -v b="$base" 'BEGIN {print a / b}')"
	done
done
