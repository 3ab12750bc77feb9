package rest_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// A body that starts with a UTF-8 byte order mark (PowerShell, Notepad and
// other Windows tools write one; curl -d @file.json sends it) is JSON to
// Kafka Connect: Jackson skips the mark when it reads bytes.
func TestCompatBOMBodyIsJSON(t *testing.T) {
	const bom = "\xef\xbb\xbf"
	tests := []struct {
		name, method, path, body string
		status                   int
	}{
		{"create", "POST", "/connectors", bom + `{"name":"new","config":{"connector.class":"sample.Sink"}}`, 201},
		{"put config", "PUT", "/connectors/src/config", bom + `{"connector.class":"sample.Source","topic":"t9"}`, 200},
		{"patch config", "PATCH", "/connectors/src/config", bom + `{"topic":"t9"}`, 200},
		{"validate", "PUT", "/connector-plugins/sample.Source/config/validate", bom + `{"topic":"t"}`, 200},
		{"only a mark is an empty body", "POST", "/connectors", bom + " ", 400},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeHerder()
			setup(f)
			h := newFakeHarness(t, f)
			if res := h.do(tc.method, tc.path, tc.body, appJSON); res.Status != tc.status {
				t.Errorf("%s %s: status %d, want %d; body %s", tc.method, tc.path, res.Status, tc.status, res.Body)
			}
		})
	}
}

// Every bad field is named in one 400: a config "name" that contradicts the
// connector's name is reported also when another config value is bad.
func TestCompatNameMismatchNamedWithOtherErrors(t *testing.T) {
	tests := []struct {
		name, method, path, body string
	}{
		{"create", "POST", "/connectors", `{"name":"new","config":{"connector.class":"sample.Sink","name":"other","tasks.max":[2]}}`},
		{"put config", "PUT", "/connectors/src/config", `{"connector.class":"sample.Source","name":"other","tasks.max":[2]}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeHerder()
			setup(f)
			h := newFakeHarness(t, f)
			res := h.do(tc.method, tc.path, tc.body, appJSON)
			if res.Status != 400 {
				t.Fatalf("status %d, want 400; body %s", res.Status, res.Body)
			}
			var b struct{ Message string }
			res.json(t, &b)
			for _, want := range []string{`"tasks.max"`, "(other)"} {
				if !strings.Contains(b.Message, want) {
					t.Errorf("message %q does not name %s", b.Message, want)
				}
			}
			if calls := f.Calls(); len(calls) != 0 {
				t.Errorf("a rejected request reached the herder: %v", calls)
			}
		})
	}
}

// Validate reports a connector name that creating would refuse, as Kafka
// Connect's validate does (its "name" has the non-empty, no-control-chars
// validator): error_count 0 must mean POST /connectors accepts the config.
func TestCompatValidateChecksName(t *testing.T) {
	e := newE2E(t)
	for _, name := range []string{`a\u0001b`, `..`, ` padded `, strings.Repeat("n", 250)} {
		t.Run(name[:min(len(name), 10)], func(t *testing.T) {
			e.t = t
			defer func() { e.t = nil }()
			var v struct {
				ErrorCount int `json:"error_count"`
				Configs    []struct {
					Value struct {
						Name   string
						Errors []string
					}
				}
			}
			e.expect("PUT", "/connector-plugins/sample-source/config/validate", `{"name":"`+name+`","sample.topic":"t"}`, 200).json(t, &v)
			var nameErrs []string
			for _, c := range v.Configs {
				if c.Value.Name == "name" {
					nameErrs = c.Value.Errors
				}
			}
			if v.ErrorCount != 1 || len(nameErrs) != 1 {
				t.Errorf("error_count %d, errors of name %q; want the name's error only", v.ErrorCount, nameErrs)
			}
		})
	}
	e.t = t
	if got := e.expect("GET", "/connectors", "", 200); string(got.Body) != "[]\n" {
		t.Errorf("validate created connectors: %s", got.Body)
	}
}

// A name the herder refuses is named together with the config's errors,
// and nothing is created.
func TestCompatBadNameNamedWithConfigErrors(t *testing.T) {
	e := newE2E(t)
	long := strings.Repeat("n", 250)
	tests := []struct{ name, method, path, body string }{
		{"create", "POST", "/connectors", `{"name":"` + long + `","config":{"connector.class":"sample-source","tasks.max":"zero"}}`},
		{"put config", "PUT", "/connectors/" + long + "/config", `{"connector.class":"sample-source","tasks.max":"zero"}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e.t = t
			defer func() { e.t = nil }()
			var b struct{ Message string }
			e.expect(tc.method, tc.path, tc.body, 400).json(t, &b)
			for _, want := range []string{"249 bytes", "tasks.max", "sample.topic"} {
				if !strings.Contains(b.Message, want) {
					t.Errorf("message %q lacks %q", b.Message, want)
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

// A connector created PAUSED (KIP-980) starts nothing, as in Kafka Connect:
// its WorkerConnector goes from INIT to PAUSED without start() (suspend),
// and StandaloneHerder.updateConnectorTasks generates no task configs
// while the target is not STARTED. Start may provision (pgaudit's
// triggers and snapshot); resume starts it.
func TestCompatCreatePausedStartsNothing(t *testing.T) {
	e := newE2E(t)
	res := e.expect("POST", "/connectors", `{"name":"p","config":{"connector.class":"sample-source","sample.topic":"t","tasks.max":"2"},"initial_state":"PAUSED"}`, 201)
	var info struct{ Tasks []any }
	res.json(t, &info)
	if got, calls := e.states("p"), e.callsSince(0); got != "PAUSED" || len(calls) != 0 || len(info.Tasks) != 0 {
		t.Errorf("created PAUSED: states %q, calls %v, tasks %v; want PAUSED with no tasks, nothing called", got, calls, info.Tasks)
	}
	// Restarting a connector that never started starts nothing either.
	e.expect("POST", "/connectors/p/restart?includeTasks=true", "", 202)
	if calls := e.callsSince(0); len(calls) != 0 {
		t.Errorf("restart of the never started connector: calls %v", calls)
	}
	e.expect("PUT", "/connectors/p/resume", "", 202)
	if got := e.states("p"); got != "RUNNING RUNNING RUNNING" {
		t.Errorf("resumed: states %q, want the connector and its two tasks RUNNING", got)
	}
}

// Credentials quoted in a plugin's error are masked in every response
// (docs/rest.md): in config/validate's errors as in a create's 400.
func TestCompatValidateErrorsAreScrubbed(t *testing.T) {
	f := newFakeHerder()
	f.defs["sample.Leaky"] = connect.ConfigDef{
		{Name: "connector.class", Type: connect.TypeString, Required: true},
		{Name: "dsn", Type: connect.TypeString, Validate: func(v string) error { return fmt.Errorf("cannot reach %s (password=%s)", v, "hunter2") }},
	}
	h := newFakeHarness(t, f)
	for _, tc := range []struct{ method, path, body string }{
		{"PUT", "/connector-plugins/sample.Leaky/config/validate", `{"dsn":"postgres://app:hunter2@db/app"}`},
		{"POST", "/connectors", `{"name":"leaky","config":{"connector.class":"sample.Leaky","dsn":"postgres://app:hunter2@db/app"}}`},
	} {
		res := h.do(tc.method, tc.path, tc.body, appJSON)
		if !strings.Contains(string(res.Body), "cannot reach") {
			t.Fatalf("%s %s: the plugin's error is not in the answer: %d %s", tc.method, tc.path, res.Status, res.Body)
		}
		if strings.Contains(string(res.Body), "hunter2") {
			t.Errorf("%s %s: a credential in the answer: %s", tc.method, tc.path, res.Body)
		}
	}
}
