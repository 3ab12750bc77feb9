package rest_test

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/herder"
	"github.com/tidyconnect/tidyconnect/runtime/internal/sampleconn"
	"github.com/tidyconnect/tidyconnect/runtime/internal/syncworker"
	"github.com/tidyconnect/tidyconnect/runtime/plugins"
	"github.com/tidyconnect/tidyconnect/runtime/rest"
	"github.com/tidyconnect/tidyconnect/runtime/store"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

// The e2e tests drive the real standalone herder with syncworker, which runs
// the lifecycle calls synchronously without the Poll/Put data path.
var _ herder.Worker = (*syncworker.Worker)(nil)

// e2e is the REST API over a real standalone herder and file store, running
// the sample connectors, which record every lifecycle call.
type e2e struct {
	*harness
	rec   *sampleconn.Recorder
	h     *herder.Standalone
	seeds []string // Kafka, for newKafkaE2E
}

func newE2E(t *testing.T) *e2e {
	t.Helper()
	rec := sampleconn.NewRecorder()
	reg, err := plugins.New(sampleconn.Plugins(rec)...)
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.OpenFile(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	logs := &testenv.SyncBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := herder.NewStandalone(ctx,
		herder.WithStore(st), herder.WithPlugins(reg), herder.WithLogger(log),
		herder.WithKafkaClusterID("e2e-cluster"),
		herder.WithDeletionRetry(time.Hour, time.Hour), // retries are driven by the test's DELETEs
		herder.WithWorker(func(l worker.StatusListener) (herder.Worker, error) {
			return syncworker.New(reg, l, syncworker.WithWorkerID("e2e"), syncworker.WithoutUnassignedReports()), nil
		}),
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := h.Close(ctx); err != nil {
			t.Errorf("closing the herder: %v", err)
		}
		if err := st.Close(); err != nil {
			t.Errorf("closing the store: %v", err)
		}
		if s := logs.String(); strings.Contains(s, "hunter2") || strings.Contains(s, "pw123") {
			t.Errorf("a secret reached the log:\n%s", s)
		}
	})
	return &e2e{harness: newHarness(t, rest.New(h, rest.WithLogger(log)), logs), rec: rec, h: h}
}

// expect sends a request and fails unless the status matches.
func (e *e2e) expect(method, path, body string, status int) response {
	e.t.Helper()
	res := e.do(method, path, body, appJSON)
	if res.Status != status {
		e.t.Fatalf("%s %s: status %d, want %d; body %s", method, path, res.Status, status, res.Body)
	}
	return res
}

type wireStatus struct {
	Name      string
	Connector struct {
		State string
		Trace string
	}
	Tasks []struct {
		ID    int
		State string
		Trace string
	}
	Type     string
	Deletion *struct {
		Phase     string
		Remaining []struct{ Kind, Name, Location string }
		Error     string
		Attempts  int
	}
}

func (e *e2e) status(name string) wireStatus {
	e.t.Helper()
	var st wireStatus
	e.expect("GET", "/connectors/"+name+"/status", "", 200).json(e.t, &st)
	return st
}

func (e *e2e) states(name string) string {
	e.t.Helper()
	st := e.status(name)
	parts := []string{st.Connector.State}
	for _, t := range st.Tasks {
		parts = append(parts, t.State)
	}
	return strings.Join(parts, " ")
}

// newCalls returns the lifecycle calls recorded since mark, as strings.
func (e *e2e) callsSince(mark int) []string {
	var out []string
	for _, c := range e.rec.Calls()[mark:] {
		if strings.HasPrefix(c.Method, "TaskConfigs") {
			continue
		}
		out = append(out, c.String())
	}
	return out
}

func (e *e2e) mark() int { return len(e.rec.Calls()) }

// TestEndToEndLifecycle drives one source connector through every REST
// verb and asserts the lifecycle calls each one caused.
func TestEndToEndLifecycle(t *testing.T) {
	e := newE2E(t)
	const name = "e2e-src"
	c0, t0, t1 := sampleconn.ConnectorInstance(name), sampleconn.TaskInstance(name, 0), sampleconn.TaskInstance(name, 1)

	res := e.expect("POST", "/connectors", `{"name":"e2e-src","config":{"connector.class":"sample-source","tasks.max":"2",
		"sample.topic":"e2e-topic","sample.resources":"audit","sample.password":"hunter2","sample.url":"postgres://app:pw123@db/app"}}`, 201)
	if loc := res.Header.Get("Location"); loc != "/connectors/e2e-src" {
		t.Errorf("Location = %q", loc)
	}
	var info struct {
		Config map[string]string
		Tasks  []struct {
			Connector string
			Task      int
		}
		Type string
	}
	res.json(t, &info)
	if info.Config["sample.password"] != "[hidden]" || info.Config["sample.url"] != "postgres://app:xxxxx@db/app" || info.Type != "source" || len(info.Tasks) != 2 {
		t.Errorf("create answered %s", res.Body)
	}
	if got, want := e.callsSince(0), []string{c0 + " Start", t0 + " Start", t1 + " Start"}; !slices.Equal(got, want) {
		t.Errorf("create: calls %q, want %q", got, want)
	}
	if got := e.states(name); got != "RUNNING RUNNING RUNNING" {
		t.Errorf("states after create: %s", got)
	}
	var resources []struct{ Kind, Name, Location string }
	e.expect("GET", "/connectors/e2e-src/resources", "", 200).json(t, &resources)
	if len(resources) != 3 { // the connector's and each task's "audit"
		t.Fatalf("resources = %+v, want 3", resources)
	}
	for _, r := range resources {
		if !e.rec.ResourceExists(r.Name) {
			t.Errorf("listed resource %s does not exist", r.Name)
		}
	}
	e.expect("GET", "/connectors?expand=status&expand=info", "", 200)
	e.expect("GET", "/connectors/e2e-src/tasks", "", 200)
	e.expect("GET", "/connectors/e2e-src/tasks/1/status", "", 200)
	e.expect("GET", "/connectors/e2e-src/topics", "", 200)

	steps := []struct {
		name, method, path string
		status             int
		wantCalls          []string
		wantStates         string
	}{
		{"pause is no stop", "PUT", "/connectors/e2e-src/pause", 202, nil, "PAUSED PAUSED PAUSED"},
		{"resume", "PUT", "/connectors/e2e-src/resume", 202, nil, "RUNNING RUNNING RUNNING"},
		{"plain restart restarts the connector only", "POST", "/connectors/e2e-src/restart", 204,
			[]string{c0 + " Stop(false)", c0 + " Stopped", c0 + " Start"}, "RUNNING RUNNING RUNNING"},
		{"restart with tasks", "POST", "/connectors/e2e-src/restart?includeTasks=true", 202,
			[]string{t0 + " Stop(false)", t0 + " Stopped", t1 + " Stop(false)", t1 + " Stopped", c0 + " Stop(false)", c0 + " Stopped", c0 + " Start", t0 + " Start", t1 + " Start"}, "RUNNING RUNNING RUNNING"},
		{"restart only failed with nothing failed", "POST", "/connectors/e2e-src/restart?includeTasks=true&onlyFailed=true", 202, nil, "RUNNING RUNNING RUNNING"},
		{"task restart", "POST", "/connectors/e2e-src/tasks/1/restart", 204, []string{t1 + " Stop(false)", t1 + " Stopped", t1 + " Start"}, "RUNNING RUNNING RUNNING"},
		{"stop", "PUT", "/connectors/e2e-src/stop", 204,
			[]string{t0 + " Stop(false)", t0 + " Stopped", t1 + " Stop(false)", t1 + " Stopped", c0 + " Stop(false)", c0 + " Stopped"}, "STOPPED"},
		{"offsets change while stopped", "PATCH", "/connectors/e2e-src/offsets", 200, nil, "STOPPED"},
		{"resume from stopped", "PUT", "/connectors/e2e-src/resume", 202, []string{c0 + " Start", t0 + " Start", t1 + " Start"}, "RUNNING RUNNING RUNNING"},
		{"offsets change while running is refused", "DELETE", "/connectors/e2e-src/offsets", 400, nil, "RUNNING RUNNING RUNNING"},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			e.t = t
			defer func() { e.t = nil }()
			mark := e.mark()
			body := ""
			if s.method == "PATCH" {
				body = `{"offsets":[{"partition":{"source":"p0"},"offset":{"position":17}}]}`
			}
			e.expect(s.method, s.path, body, s.status)
			got := e.callsSince(mark)
			if (len(got) != 0 || len(s.wantCalls) != 0) && !slices.Equal(got, s.wantCalls) {
				t.Errorf("calls %q, want %q", got, s.wantCalls)
			}
			if st := e.states(name); st != s.wantStates {
				t.Errorf("states %q, want %q", st, s.wantStates)
			}
		})
		e.t = t
	}

	var offs struct {
		Offsets []struct {
			Partition map[string]any
			Offset    map[string]any
		}
	}
	e.expect("GET", "/connectors/e2e-src/offsets", "", 200).json(t, &offs)
	if len(offs.Offsets) != 1 || offs.Offsets[0].Partition["source"] != "p0" || offs.Offsets[0].Offset["position"] != float64(17) {
		t.Errorf("offsets after PATCH: %+v", offs)
	}

	// Reconfiguration: a stop and start, never a deletion; the masked
	// secret written back keeps the stored one.
	mark := e.mark()
	e.expect("PATCH", "/connectors/e2e-src/config", `{"sample.count":"5","sample.password":"[hidden]"}`, 200)
	for _, c := range e.callsSince(mark) {
		if strings.Contains(c, "Stop(true)") {
			t.Errorf("reconfiguration delivered %s", c)
		}
	}
	if got := e.rec.Count(c0 + " Stop(false)"); got != 4 {
		t.Errorf("connector got Stop(false) %d times, want 4 (2 restarts, stop, reconfigure)", got)
	}

	// Deletion: tasks stop (Stop(true), Stopped) before the connector's
	// Stop(true); everything owned is dropped; then the connector is gone.
	mark = e.mark()
	e.expect("DELETE", "/connectors/e2e-src", "", 204)
	got := e.callsSince(mark)
	want := []string{t0 + " Stop(true)", t0 + " Stopped", t1 + " Stop(true)", t1 + " Stopped", c0 + " Stop(true)", c0 + " Stopped"}
	if !slices.Equal(got, want) {
		t.Errorf("delete: calls %q, want %q", got, want)
	}
	for _, r := range resources {
		if e.rec.ResourceExists(r.Name) {
			t.Errorf("resource %s survived the deletion", r.Name)
		}
	}
	e.expect("GET", "/connectors/e2e-src", "", 404)
	e.expect("GET", "/connectors/e2e-src/status", "", 404)
	e.expect("DELETE", "/connectors/e2e-src", "", 404)
	if got := e.expect("GET", "/connectors", "", 200); string(got.Body) != "[]\n" {
		t.Errorf("connectors after delete: %s", got.Body)
	}
}

// A failing cleanup: DELETE answers 500 naming what remains, the connector
// stays visible as FAILED with a deletion field, and other calls say so.
func TestEndToEndFailedDeletion(t *testing.T) {
	e := newE2E(t)
	e.expect("POST", "/connectors", `{"name":"e2e-stuck","config":{"connector.class":"sample-sink","topics":"in","sample.resources":"q","sample.fail.stopped":"true"}}`, 201)
	res := e.expect("DELETE", "/connectors/e2e-stuck", "", 500)
	var body struct {
		ErrorCode int `json:"error_code"`
		Message   string
		Remaining []struct{ Kind, Name, Location string }
	}
	res.json(t, &body)
	if len(body.Remaining) == 0 || !strings.Contains(body.Message, body.Remaining[0].Name) || !strings.Contains(body.Message, "retry DELETE") {
		t.Errorf("failed DELETE answered %s", res.Body)
	}
	st := e.status("e2e-stuck")
	if st.Connector.State != "FAILED" || st.Connector.Trace == "" || st.Deletion == nil || st.Deletion.Phase != "cleanup-failed" ||
		len(st.Deletion.Remaining) == 0 || st.Deletion.Attempts != 1 {
		t.Errorf("status after failed delete: %+v", st)
	}
	// Visible in the list; changes other than DELETE are refused.
	e.expect("GET", "/connectors?expand=status", "", 200)
	e.expect("PUT", "/connectors/e2e-stuck/pause", "", 400)
	res = e.expect("DELETE", "/connectors/e2e-stuck", "", 500)
	if st := e.status("e2e-stuck"); st.Deletion == nil || st.Deletion.Attempts != 2 {
		t.Errorf("status after the retried delete: %+v", st)
	}
}

// Bad input through the real herder: nothing is half-created.
func TestEndToEndBadInput(t *testing.T) {
	e := newE2E(t)
	tests := []struct {
		name, method, path, body string
		status                   int
		wantMsg                  []string
	}{
		{"unknown class", "POST", "/connectors", `{"name":"x","config":{"connector.class":"nope"}}`, 400, []string{"connector.class", "nope", "sample-source"}},
		{"missing required and bad types", "POST", "/connectors", `{"name":"x","config":{"connector.class":"sample-source","tasks.max":"zero","sample.count":"-5"}}`, 400,
			[]string{"sample.topic", "tasks.max", "sample.count"}},
		{"sink without topics", "PUT", "/connectors/x/config", `{"connector.class":"sample-sink"}`, 400, []string{"topics"}},
		{"name with slash", "POST", "/connectors", `{"name":"a/b","config":{"connector.class":"sample-sink","topics":"t"}}`, 400, []string{"'/'"}},
		{"unknown connector", "PUT", "/connectors/x/stop", "", 404, nil},
		{"task of an unknown connector", "GET", "/connectors/x/tasks/0/status", "", 404, []string{"Connector x not found"}},
		{"task restart of an unknown connector", "POST", "/connectors/x/tasks/0/restart", "", 404, []string{"Connector x not found"}},
		{"unknown plugin", "GET", "/connector-plugins/nope/config", "", 404, []string{"nope"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e.t = t
			res := e.expect(tc.method, tc.path, tc.body, tc.status)
			var b struct{ Message string }
			res.json(t, &b)
			for _, m := range tc.wantMsg {
				if !strings.Contains(b.Message, m) {
					t.Errorf("message %q lacks %q", b.Message, m)
				}
			}
		})
	}
	e.t = t
	if got := e.expect("GET", "/connectors", "", 200); string(got.Body) != "[]\n" {
		t.Errorf("bad input created connectors: %s", got.Body)
	}
	if calls := e.rec.Calls(); len(calls) != 0 {
		t.Errorf("bad input reached connectors: %v", calls)
	}
}

// Plugins, plugin config and validate over the real herder, contract-checked.
func TestEndToEndPlugins(t *testing.T) {
	e := newE2E(t)
	var ps []struct{ Class, Type, Version string }
	e.expect("GET", "/connector-plugins", "", 200).json(t, &ps)
	if len(ps) != 2 || ps[0].Class != "sample-sink" || ps[0].Type != "sink" || ps[1].Type != "source" {
		t.Errorf("plugins %+v", ps)
	}
	e.expect("GET", "/connector-plugins/sample-source/config", "", 200)
	var v struct {
		ErrorCount int `json:"error_count"`
		Configs    []struct {
			Value struct {
				Name   string
				Value  *string
				Errors []string
			}
		}
	}
	e.expect("PUT", "/connector-plugins/sample-source/config/validate", `{"tasks.max":"0","sample.password":"hunter2"}`, 200).json(t, &v)
	bad := map[string]bool{}
	for _, c := range v.Configs {
		if len(c.Value.Errors) > 0 {
			bad[c.Value.Name] = true
		}
		if c.Value.Name == "sample.password" && (c.Value.Value == nil || *c.Value.Value != "[hidden]") {
			t.Errorf("password value shown as %v", c.Value.Value)
		}
	}
	if !bad["sample.topic"] || !bad["tasks.max"] || v.ErrorCount < 2 {
		t.Errorf("validate: error_count %d, keys with errors %v", v.ErrorCount, bad)
	}
	var root map[string]string
	e.expect("GET", "/", "", 200).json(t, &root)
	if root["kafka_cluster_id"] != "e2e-cluster" || root["version"] == "" {
		t.Errorf("root %v", root)
	}
}

// Restarting a STOPPED connector starts nothing; the 202 answer shows it
// RESTARTING, as Kafka Connect's restart plan does, and it reads STOPPED
// again afterwards.
func TestEndToEndRestartStopped(t *testing.T) {
	e := newE2E(t)
	e.expect("POST", "/connectors", `{"name":"s","config":{"connector.class":"sample-source","sample.topic":"t"},"initial_state":"STOPPED"}`, 201)
	mark := e.mark()
	res := e.expect("POST", "/connectors/s/restart?includeTasks=true", "", 202)
	if !strings.Contains(string(res.Body), `"state":"RESTARTING"`) {
		t.Errorf("202 body %s, want the connector RESTARTING", res.Body)
	}
	if calls := e.callsSince(mark); len(calls) != 0 {
		t.Errorf("restarting a STOPPED connector called %v", calls)
	}
	if got := e.states("s"); got != "STOPPED" {
		t.Errorf("states after the restart: %q, want STOPPED", got)
	}
}

// Pausing a STOPPED connector starts nothing (no Start, which may
// provision, and no tasks), as Kafka Connect's WorkerConnector only changes
// its state; resume starts it.
func TestEndToEndPauseStopped(t *testing.T) {
	e := newE2E(t)
	e.expect("POST", "/connectors", `{"name":"p","config":{"connector.class":"sample-source","sample.topic":"t","tasks.max":"2"},"initial_state":"STOPPED"}`, 201)
	mark := e.mark()
	e.expect("PUT", "/connectors/p/pause", "", 202)
	if got, calls := e.states("p"), e.callsSince(mark); got != "PAUSED" || len(calls) != 0 {
		t.Errorf("STOPPED then paused: states %q, calls %v; want PAUSED with no tasks, nothing called", got, calls)
	}
	e.expect("PUT", "/connectors/p/resume", "", 202)
	if got := e.states("p"); got != "RUNNING RUNNING RUNNING" {
		t.Errorf("resumed: states %q, want the connector and its two tasks RUNNING", got)
	}
	// Stopped after it ran, then paused: PAUSED too, not what the worker
	// last reported of the stopped instance.
	e.expect("PUT", "/connectors/p/stop", "", 204)
	mark = e.mark()
	e.expect("PUT", "/connectors/p/pause", "", 202)
	if got, calls := e.states("p"), e.callsSince(mark); got != "PAUSED" || len(calls) != 0 {
		t.Errorf("stopped after running, then paused: states %q, calls %v; want PAUSED, nothing called", got, calls)
	}
}

// A plugin's class and its alias are the same plugin to validate, either
// way round; another plugin is still a 400.
func TestEndToEndValidateAlias(t *testing.T) {
	e := newE2E(t)
	for _, c := range []struct {
		path, class string
		status      int
	}{
		{"sample-source", "SampleSource", 200},
		{"SampleSource", "sample-source", 200},
		{"sample-source", "sample-sink", 400},
	} {
		res := e.do("PUT", "/connector-plugins/"+c.path+"/config/validate", `{"connector.class":"`+c.class+`","sample.topic":"t","name":"x"}`, appJSON)
		if res.Status != c.status {
			t.Errorf("path %s, connector.class %s: %d %s, want %d", c.path, c.class, res.Status, res.Body, c.status)
		}
	}
}
