package pgaudit

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/herder"
	"github.com/tidyconnect/tidyconnect/runtime/plugins"
	"github.com/tidyconnect/tidyconnect/runtime/rest"
	"github.com/tidyconnect/tidyconnect/runtime/store"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

// TestREST drives pgaudit through the REST API, the standalone herder and
// the real worker: bad configs answer 400 naming the problem with nothing
// provisioned; a good one runs, lists its resources with the password
// masked, and DELETE drops everything.
func TestREST(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "orders")+` (id int PRIMARY KEY)`)
	st := newStack(t)
	ctx := testCtx(t)
	call := st.call
	pwURL := strings.Replace(url, "postgres@", "postgres:pw123@", 1) // trust auth ignores it
	audit := auditSchemaFor(t, db)
	bad := []struct {
		name, tables, url, mention string
		edit                       func(connect.Config)
	}{
		{"missing table", s + ".nope", pwURL, "does not exist", nil},
		{"malformed list", s + ".orders,,", pwURL, "malformed", nil},
		{"unreachable", s + ".orders", "postgres://postgres:pw123@127.0.0.1:1/test?sslmode=disable&connect_timeout=2", "127.0.0.1:1", nil},
		{"blank audit schema", s + ".orders", pwURL, KeyAuditSchema, func(c connect.Config) { c[KeyAuditSchema] = "" }},
		{"unknown capture order", s + ".orders", pwURL, KeyCaptureOrder, func(c connect.Config) { c[KeyCaptureOrder] = "random" }},
		{"blank capture order", s + ".orders", pwURL, KeyCaptureOrder, func(c connect.Config) { c[KeyCaptureOrder] = "" }},
		{"unknown capture level", s + ".orders", pwURL, KeyCaptureLevel, func(c connect.Config) { c[KeyCaptureLevel] = "column" }},
		{"unknown snapshot mode", s + ".orders", pwURL, KeySnapshotMode, func(c connect.Config) { c[KeySnapshotMode] = "always" }},
		{"blank snapshot mode", s + ".orders", pwURL, KeySnapshotMode, func(c connect.Config) { c[KeySnapshotMode] = "" }},
		{"tombstones not a boolean", s + ".orders", pwURL, KeyTombstonesOnDelete, func(c connect.Config) { c[KeyTombstonesOnDelete] = "yes" }},
		{"wake-up notify not a boolean", s + ".orders", pwURL, KeyWakeupNotify, func(c connect.Config) { c[KeyWakeupNotify] = "off" }},
		{"malformed key columns", s + ".orders", pwURL, KeyMessageKeyColumns, func(c connect.Config) { c[KeyMessageKeyColumns] = s + ".orders" }},
		{"key columns of a table not captured", s + ".orders", pwURL, "is not one of tables", func(c connect.Config) { c[KeyMessageKeyColumns] = s + ".other:id" }},
		{"key column missing", s + ".orders", pwURL, `has no column \"nope\"`, func(c connect.Config) { c[KeyMessageKeyColumns] = s + ".orders:id,nope" }},
		{"excluded column missing", s + ".orders", pwURL, KeyColumnExcludeList, func(c connect.Config) { c[KeyColumnExcludeList] = s + ".orders.nope" }},
		{"excluded column of a table not captured", s + ".orders", pwURL, "is not one of tables", func(c connect.Config) { c[KeyColumnExcludeList] = s + ".other.id" }},
	}
	for _, tt := range bad {
		cfg := baseConfig(testenv.Unique("rest-bad-"), tt.url, audit, tt.tables)
		if tt.edit != nil {
			tt.edit(cfg)
		}
		code, body := call("POST", "/connectors", map[string]any{"name": cfg["name"], "config": cfg})
		if code != http.StatusBadRequest || !strings.Contains(body, tt.mention) || strings.Contains(body, "pw123") {
			t.Errorf("%s: POST /connectors = %d %s, want 400 naming %q without the password", tt.name, code, body, tt.mention)
		}
		code, body = call("PUT", "/connector-plugins/pgaudit/config/validate", cfg)
		if code != http.StatusOK || !strings.Contains(body, tt.mention) || strings.Contains(body, `"error_count":0`) {
			t.Errorf("%s: validate = %d %s", tt.name, code, body)
		}
	}
	var exists bool
	if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, audit).Scan(&exists); err != nil || exists {
		t.Fatalf("rejected configs provisioned the audit schema (%v)", err)
	}

	cfg := baseConfig(testenv.Unique("rest-"), pwURL, audit, s+".orders")
	name := cfg["name"]
	if code, body := call("POST", "/connectors", map[string]any{"name": name, "config": cfg}); code != http.StatusCreated {
		t.Fatalf("POST /connectors = %d %s", code, body)
	}
	st.awaitRunning(name)
	_, body := call("GET", "/connectors/"+name+"/resources", nil)
	for _, want := range []string{KindSchema, KindTable, KindSequence, KindFunction, KindTrigger, objectNames(name).table, objectNames(name).wakeup, objectNames(name).waiters} {
		if !strings.Contains(body, want) {
			t.Errorf("resources %s do not list %s", body, want)
		}
	}
	if _, body := call("GET", "/connectors/"+name+"/config", nil); strings.Contains(body, "pw123") {
		t.Errorf("config shows the password: %s", body)
	}
	if code, body := call("DELETE", "/connectors/"+name, nil); code != http.StatusNoContent {
		t.Fatalf("DELETE = %d %s", code, body)
	}
	if relExists(t, db, audit, objectNames(name).table) || triggerCount(t, db, s, "orders") != 0 {
		t.Error("DELETE left objects behind")
	}
	if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, audit).Scan(&exists); err != nil || exists {
		t.Errorf("DELETE left the owned audit schema (%v)", err)
	}
	awaitNoConnections(t, db, name)
}

// stack is the REST API over the standalone herder, a file store and the
// real worker, with pgaudit as the only plugin.
type stack struct {
	t     *testing.T
	seeds []string
	srv   *httptest.Server
}

func newStack(t *testing.T) *stack {
	ctx := testCtx(t)
	seeds := testenv.KafkaBrokers(t)
	reg, err := plugins.New(Plugin())
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.OpenFile(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	h, err := herder.NewStandalone(ctx, herder.WithStore(st), herder.WithPlugins(reg), herder.WithLogger(log),
		herder.WithKafkaAdmin(kadm.NewClient(cl)), herder.WithDeletionRetry(time.Hour, time.Hour),
		herder.WithWorker(func(l worker.StatusListener) (herder.Worker, error) {
			return worker.New(worker.WithID("pgaudit-test"), worker.WithPlugins(reg), worker.WithOffsetStore(st),
				worker.WithKafka(seeds), worker.WithLogger(log), worker.WithStatusListener(l))
		}))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(rest.New(h))
	t.Cleanup(func() {
		srv.Close()
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := h.Close(cctx); err != nil {
			t.Errorf("closing the herder: %v", err)
		}
		cl.Close()
		if err := st.Close(); err != nil {
			t.Errorf("closing the store: %v", err)
		}
	})
	return &stack{t: t, seeds: seeds, srv: srv}
}

func (s *stack) call(method, path string, body any) (int, string) {
	s.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, method, s.srv.URL+path, rd)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// awaitRunning waits for the connector and its task to be RUNNING.
func (s *stack) awaitRunning(name string) {
	s.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, body := s.call("GET", "/connectors/"+name+"/status", nil)
		if strings.Contains(body, `"tasks":[{`) && !strings.Contains(body, "FAILED") && strings.Count(body, `"RUNNING"`) == 2 {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("connector not RUNNING: %s", body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func contextWithTimeout(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}
