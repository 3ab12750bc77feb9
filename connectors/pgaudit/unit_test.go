package pgaudit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tidyconnect/tidyconnect/internal/testenv"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

func TestParseTables(t *testing.T) {
	tests := []struct {
		in      string
		want    []tableName
		wantErr string
	}{
		{"orders", []tableName{{"public", "orders"}}, ""},
		{" shop.orders , Shop.Items ", []tableName{{"shop", "orders"}, {"Shop", "Items"}}, ""},
		{`"a.b"."c,d"`, []tableName{{"a.b", "c,d"}}, ""},
		{`"we""ird".t`, []tableName{{`we"ird`, "t"}}, ""},
		{`s.x"; DROP TABLE y; --`, []tableName{{"s", `x"; DROP TABLE y; --`}}, ""},
		{`"s"."x""; DROP TABLE y; --"`, []tableName{{"s", `x"; DROP TABLE y; --`}}, ""},
		{"a,,b", nil, "empty item"},
		{"a.b.c", nil, "3 dot-separated parts"},
		{"a.", nil, "empty name"},
		{".a", nil, "empty schema or table"},
		{`"open`, nil, "unterminated"},
		{`"x"y.z`, nil, "after a quoted name"},
		{"a, a", nil, "listed twice"},
		{"   ", nil, "no table"},
		{strings.Repeat("x", 64), nil, "63 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseTables(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseTables(%q) error = %v, want one containing %q", tt.in, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("parseTables(%q) = %v, want %v", tt.in, got, tt.want)
			}
			// formatTables round-trips.
			again, err := parseTables(formatTables(got))
			if err != nil || !reflect.DeepEqual(again, got) {
				t.Fatalf("round trip of %q: %v, %v", formatTables(got), again, err)
			}
		})
	}
}

func TestObjectNames(t *testing.T) {
	long := strings.Repeat("x", 70)
	tests := []struct{ a, b string }{
		{long + "1", long + "2"},            // differ after 63 bytes
		{"orders-sync", "orders_sync"},      // differ only in a replaced character
		{"Orders", "orders"},                // differ only in case
		{`x"; DROP TABLE y; --`, "x__drop"}, // hostile
	}
	for _, tt := range tests {
		na, nb := objectNames(tt.a), objectNames(tt.b)
		for _, n := range []names{na, nb} {
			for _, id := range []string{n.table, n.wakeup, n.waiters, n.function, n.channel, n.trigger("TRUNCATE")} {
				if len(id) > 63 {
					t.Errorf("%q is longer than 63 bytes", id)
				}
				if strings.Trim(id, "abcdefghijklmnopqrstuvwxyz0123456789_") != "" {
					t.Errorf("%q has characters outside [a-z0-9_]", id)
				}
			}
		}
		if na.table == nb.table || na.channel == nb.channel || na.trigger("INSERT") == nb.trigger("INSERT") {
			t.Errorf("%q and %q collide: %s", tt.a, tt.b, na.table)
		}
		if objectNames(tt.a) != na {
			t.Errorf("names of %q are not deterministic", tt.a)
		}
	}
	if p := ApplicationNamePrefix(long); len(ApplicationName(long, "listen-99")) > 63 || !strings.HasPrefix(p, "tidyconnect:") {
		t.Errorf("application name %q", ApplicationName(long, "listen-99"))
	}
	// pg_stat_activity is searched by prefix: no connector's prefix may
	// start another's.
	for _, pair := range [][2]string{{"orders", "orders:v2"}, {"orders:v2", "orders"}, {"a", "a:task-0"}} {
		if a, b := ApplicationNamePrefix(pair[0]), ApplicationName(pair[1], "task-0"); strings.HasPrefix(b, a) {
			t.Errorf("connector %q's connection %q has the prefix %q of connector %q", pair[1], b, a, pair[0])
		}
	}
}

func TestTopicName(t *testing.T) {
	tests := []struct {
		t    tableName
		want string
	}{
		{tableName{"public", "orders"}, "pre.public.orders"},
		{tableName{"Sales Q1", "ümlaut"}, "pre.Sales_Q1.__mlaut"},
		{tableName{"s", strings.Repeat("t", 300)}, "pre.s." + strings.Repeat("t", 243)},
	}
	for _, tt := range tests {
		if got := topicName("pre", tt.t); got != tt.want {
			t.Errorf("topicName(%v) = %q, want %q", tt.t, got, tt.want)
		}
	}
}

func TestMultirange(t *testing.T) {
	if got, want := multirange([]int64{7, 3, 4, 5, 10, 11, 1}), "{[1,1],[3,5],[7,7],[10,11]}"; got != want {
		t.Errorf("multirange = %s, want %s", got, want)
	}
}

func TestEnvelopeAndKey(t *testing.T) {
	task := &Task{s: settings{name: `c"1`, topicPrefix: "p"}, db: "d"}
	m := task.newMeta(tableName{"s", "t"}, []string{"b", "a"})
	v := m.envelope("u", []byte(`{"a":1,"b":"x"}`), []byte(`{"a":2,"b":"x"}`), "42", 7, 1000)
	want := `{"op":"u","before":{"a":1,"b":"x"},"after":{"a":2,"b":"x"},"source":{"connector":"c\"1","db":"d","schema":"s","table":"t","txid":42,"seq":7},"ts_ms":1000}`
	if string(v) != want {
		t.Errorf("envelope\n got %s\nwant %s", v, want)
	}
	if k, complete := m.key("d", []byte(`{"a":2,"b":"x"}`), nil); string(k) != `{"b":"x","a":2}` || !complete {
		t.Errorf("key = %s (complete %v)", k, complete)
	}
	if k, complete := m.key("d", []byte(`{"a":2,"c":"x"}`), nil); string(k) != `{"b":null,"a":2}` || complete {
		t.Errorf("key of an image without column b = %s (complete %v)", k, complete)
	}
	if k, _ := m.key("t", nil, nil); k != nil {
		t.Errorf("truncate key = %s, want nil", k)
	}
}

// TestKeyBesideDeepValues: the key is read from the image's top level
// only, so a json or jsonb value nested deeper than encoding/json accepts
// (PostgreSQL takes over 10000 levels), or holding brackets, quotes and
// spacing of its own, does not cost the change its key.
func TestKeyBesideDeepValues(t *testing.T) {
	m := (&Task{s: settings{name: "c", topicPrefix: "p"}, db: "d"}).newMeta(tableName{"s", "t"}, []string{"b", "a\"q"})
	deep := strings.Repeat("[", 10001) + strings.Repeat("]", 10001)
	for _, tt := range []struct{ img, want string }{
		{`{"j":` + deep + `,"a\"q":1,"b":"x"}`, `{"b":"x","a\"q":1}`},
		{`{"a\"q":-1.50e3,"j":{"k" : [ "]}\\\"" ,{}]} ,"b":  false  }`, `{"b":false,"a\"q":-1.50e3}`},
		{`{"b":{"x":[1,{"y":"}"}]},"a\"q":true}`, `{"b":{"x":[1,{"y":"}"}]},"a\"q":true}`},
	} {
		if k, complete := m.key("c", nil, []byte(tt.img)); string(k) != tt.want || !complete {
			t.Errorf("key of %.60s = %s (complete %v), want %s", tt.img, k, complete, tt.want)
		}
	}
	if k, complete := m.key("c", nil, []byte(`{}`)); string(k) != `{"b":null,"a\"q":null}` || complete {
		t.Errorf("key of an image without the key columns = %s (complete %v)", k, complete)
	}
	// A key column is never null: null under its name is another column.
	if _, complete := m.key("c", nil, []byte(`{"a\"q":1,"b":  null  }`)); complete {
		t.Errorf("key of an image with a null key column is complete")
	}
}

func TestConfigDefMasksURL(t *testing.T) {
	masked := ConfigDef().Mask(connect.Config{KeyURL: "postgres://u:pw@h/db"})
	if strings.Contains(masked[KeyURL], "pw@") {
		t.Errorf("masked URL %q", masked[KeyURL])
	}
	_, errs := parseSettings("n", connect.Config{KeyURL: "postgres://u:pw@h/db", KeyTables: "a", KeyTopicPrefix: "p", KeyTasksMax: "0"})
	if len(errs[KeyTasksMax]) == 0 {
		t.Errorf("tasks.max=0 accepted: %v", errs)
	}
}

// TestTaskRefusesBadTaskCount: a task config whose task.count is not a
// positive number fails Start with a message naming the key, before any
// connection is made.
func TestTaskRefusesBadTaskCount(t *testing.T) {
	for _, v := range []string{"x", "0", "-2"} {
		cfg := connect.Config{"name": "n", KeyURL: "postgres://u:pw@127.0.0.1:1/db", KeyTables: "a", KeyTopicPrefix: "p", keyTaskCount: v}
		task := &Task{}
		ctx := connect.WithHost(context.Background(), testHost("n", 0, connect.NewMemoryLedger()))
		err := task.Start(ctx, cfg)
		if err == nil || !strings.Contains(err.Error(), keyTaskCount) {
			t.Errorf("task.count=%q: Start = %v, want an error naming %s", v, err, keyTaskCount)
		}
		task.Stop(false)
		_ = task.Stopped(ctx)
	}
}

// TestParseSettingsBlankAndCollidingValues: blank values of optional keys
// and tables that would share a topic are errors on the key at fault.
func TestParseSettingsBlankAndCollidingValues(t *testing.T) {
	base := func() connect.Config {
		return connect.Config{KeyURL: "postgres://x@h/db", KeyTables: "s.a,s.b", KeyTopicPrefix: "tc"}
	}
	tests := []struct {
		name    string
		edit    func(connect.Config)
		key     string
		mention string
	}{
		{"blank audit schema", func(c connect.Config) { c[KeyAuditSchema] = "  " }, KeyAuditSchema, "must not be blank"},
		{"blank capture order", func(c connect.Config) { c[KeyCaptureOrder] = " " }, KeyCaptureOrder, "must not be blank"},
		{"unknown capture order", func(c connect.Config) { c[KeyCaptureOrder] = "random" }, KeyCaptureOrder, `"commit" or "statement"`},
		{"blank capture level", func(c connect.Config) { c[KeyCaptureLevel] = " " }, KeyCaptureLevel, "must not be blank"},
		{"unknown capture level", func(c connect.Config) { c[KeyCaptureLevel] = "column" }, KeyCaptureLevel, `"statement" or "row"`},
		{"tables on one topic", func(c connect.Config) { c[KeyTables] = `s."my table",s.my_table` }, KeyTables, `would go to topics that Kafka takes for the same ("tc.s.my_table"`},
		{"topics that differ in '.' against '_'", func(c connect.Config) { c[KeyTables] = `s.my_table,s."my.table"` }, KeyTables, `would go to topics that Kafka takes for the same ("tc.s.my.table"`},
		{"names cut at the topic length", func(c connect.Config) {
			long := strings.Repeat("x", 62)
			c[KeyTables] = long + "." + long + "a," + long + "." + long + "b"
			c[KeyTopicPrefix] = strings.Repeat("p", 200)
		}, KeyTables, "would go to topics that Kafka takes for the same"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := base()
			tt.edit(cfg)
			_, errs := parseSettings("c", cfg)
			if got := strings.Join(errs[tt.key], " | "); !strings.Contains(got, tt.mention) {
				t.Errorf("errors on %s = %q, want one containing %q (all: %v)", tt.key, got, tt.mention, errs)
			}
		})
	}
	if _, errs := parseSettings("c", base()); len(errs) != 0 {
		t.Errorf("a valid configuration: %v", errs)
	}
}

func TestServerVersionProblem(t *testing.T) {
	for _, tt := range []struct {
		num     int
		version string
		mention string
	}{
		{90624, "9.6.24", "PostgreSQL 9.6.24; pgaudit needs 14 or later"},
		{130015, "13.15 (Debian 13.15-1)", "PostgreSQL 13.15 (Debian 13.15-1); pgaudit needs 14 or later"},
		{140000, "14.0", ""},
		{170002, "17.2", ""},
	} {
		err := serverVersionProblem(tt.num, tt.version)
		if (err == nil) != (tt.mention == "") || (err != nil && !strings.Contains(err.Error(), tt.mention)) {
			t.Errorf("serverVersionProblem(%d) = %v, want %q", tt.num, err, tt.mention)
		}
	}
}

func TestByteBatches(t *testing.T) {
	img := func(n int) []byte { return make([]byte, n) }
	sizes := func(batches [][][]byte) [][]int {
		var out [][]int
		for _, b := range batches {
			var s []int
			for _, i := range b {
				s = append(s, len(i))
			}
			out = append(out, s)
		}
		return out
	}
	tests := []struct {
		name  string
		imgs  [][]byte
		limit int
		want  [][]int
	}{
		{"none", nil, 10, nil},
		{"all fit", [][]byte{img(3), img(3), img(4)}, 10, [][]int{{3, 3, 4}}},
		{"split at the limit", [][]byte{img(6), img(4), img(1), img(9)}, 10, [][]int{{6, 4}, {1, 9}}},
		{"an image over the limit goes alone", [][]byte{img(2), img(30), img(2)}, 10, [][]int{{2}, {30}, {2}}},
		{"empty images", [][]byte{img(0), img(0)}, 0, [][]int{{0, 0}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := byteBatches(tt.imgs, tt.limit)
			if !reflect.DeepEqual(sizes(got), tt.want) {
				t.Errorf("batches of %v", sizes(got))
			}
			var n int
			for _, b := range got {
				n += len(b)
			}
			if n != len(tt.imgs) {
				t.Errorf("%d images in the batches, want %d", n, len(tt.imgs))
			}
		})
	}
}

// TestOversizedMessageIsNotTransient: pgx refuses a message over 1 GB before
// sending it; retrying sends the same message, so it is no outage.
func TestOversizedMessageIsNotTransient(t *testing.T) {
	if transient(fmt.Errorf("reading: %w", errors.New("write failed: message body too large"))) {
		t.Error("an oversized message counts as a lost connection")
	}
	if !transient(fmt.Errorf("reading: %w", &pgconn.PgError{Code: "57P01"})) {
		t.Error("an admin shutdown does not count as a lost connection")
	}
}

// TestTransientConnectErrors: a server that accepts connections but never
// answers (a blackholed host, a stuck failover) times the connect out; that
// is worth retrying. What the server answers while connecting decides:
// a database that does not exist is not.
func TestTransientConnectErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held sync.WaitGroup
	held.Go(func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c) // never answered
		}
	})
	defer func() { ln.Close(); held.Wait() }()
	cc, err := pgx.ParseConfig("postgres://u@" + ln.Addr().String() + "/db?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	cc.ConnectTimeout = 300 * time.Millisecond
	_, err = pgx.ConnectConfig(context.Background(), cc)
	if err == nil || !transient(err) {
		t.Errorf("a connect timeout: %v, transient %v", err, transient(err))
	}

	url := testenv.PostgresURL(t)
	cc, err = pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cc.Database = "no_such_database_" + strings.ReplaceAll(testenv.Unique("x"), "-", "_")
	if _, err = pgx.ConnectConfig(context.Background(), cc); err == nil || transient(err) {
		t.Errorf("a database that does not exist: %v, transient %v", err, err != nil && transient(err))
	}
}

func TestTablesPhrase(t *testing.T) {
	for _, tc := range []struct {
		quoted []string
		want   string
	}{
		{[]string{`"s"."a"`}, `table "s"."a" is`},
		{[]string{`"s"."a"`, `"s"."b"`}, `tables "s"."a", "s"."b" are`},
	} {
		if got := tablesPhrase(tc.quoted, "is", "are"); got != tc.want {
			t.Errorf("tablesPhrase(%q) = %q, want %q", tc.quoted, got, tc.want)
		}
	}
}
