package rest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/herder"
	"github.com/tidyconnect/tidyconnect/runtime/rest"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

const appJSON = "application/json"

// jsonEqual compares two JSON documents semantically.
func jsonEqual(t *testing.T, got []byte, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("response %q is not JSON: %v", got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("bad want %q: %v", want, err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Errorf("body:\n got %s\nwant %s", got, want)
	}
}

// standard setup: a running source connector "src" with 2 tasks, task 1
// FAILED, some offsets, topics and resources.
func setup(f *fakeHerder) {
	c := f.add("src", connect.TypeSource, connect.Config{
		"connector.class": "sample.Source", "tasks.max": "2", "topic": "t1",
		"db.password": "s3cret", "db.url": "postgres://app:s3cret@db:5432/app",
	}, 2)
	c.failed[1] = "boom: connection refused"
	c.offsets = []worker.SourceOffset{{Partition: map[string]any{"table": "orders"}, Offset: map[string]any{"id": float64(42)}}}
	c.topics = []string{"t2", "t1"}
	c.resources = []connect.Resource{{Kind: "postgres.table", Name: "audit_src", Location: "app.public"}}
}

func TestEndpoints(t *testing.T) {
	const srcInfo = `{"name":"src","type":"source","tasks":[{"connector":"src","task":0},{"connector":"src","task":1}],
		"config":{"connector.class":"sample.Source","tasks.max":"2","topic":"t1","name":"src","db.password":"[hidden]","db.url":"postgres://app:xxxxx@db:5432/app"}}`
	const srcStatus = `{"name":"src","type":"source","connector":{"state":"RUNNING","worker_id":"127.0.0.1:8083"},
		"tasks":[{"id":0,"state":"RUNNING","worker_id":"127.0.0.1:8083"},{"id":1,"state":"FAILED","worker_id":"127.0.0.1:8083","trace":"boom: connection refused"}]}`

	tests := []struct {
		name        string
		prepare     func(f *fakeHerder)
		method      string
		path        string
		body        string
		contentType string
		wantStatus  int
		wantBody    string   // exact JSON, when set
		wantMsg     []string // substrings of the error message
		wantHeader  map[string]string
		wantCalls   []string // the herder calls, exactly; nil means not checked
	}{
		{name: "root", method: "GET", path: "/", wantStatus: 200,
			wantBody: `{"version":"3.9.0","commit":"abc123","kafka_cluster_id":"cluster-1","tidyconnect_version":"0.1.0-test"}`},
		{name: "list", method: "GET", path: "/connectors", wantStatus: 200, wantBody: `["src"]`},
		{name: "list with trailing slash", method: "GET", path: "/connectors/", wantStatus: 200, wantBody: `["src"]`},
		{name: "list empty", prepare: func(f *fakeHerder) { delete(f.connectors, "src") }, method: "GET", path: "/connectors", wantStatus: 200, wantBody: `[]`},
		{name: "list expand status and info", method: "GET", path: "/connectors?expand=status&expand=info", wantStatus: 200,
			wantBody: `{"src":{"status":` + srcStatus + `,"info":` + srcInfo + `}}`},
		{name: "list expand info only", method: "GET", path: "/connectors/?expand=info", wantStatus: 200, wantBody: `{"src":{"info":` + srcInfo + `}}`},
		{name: "list expand unknown is ignored", method: "GET", path: "/connectors?expand=bogus", wantStatus: 200, wantBody: `{"src":{}}`},
		{name: "list expand values are exact, as in Kafka", method: "GET", path: "/connectors?expand=STATUS&expand=status,info", wantStatus: 200, wantBody: `{"src":{}}`},
		{name: "info", method: "GET", path: "/connectors/src", wantStatus: 200, wantBody: srcInfo},
		{name: "info trailing slash", method: "GET", path: "/connectors/src/", wantStatus: 200, wantBody: srcInfo},
		{name: "info unknown", method: "GET", path: "/connectors/nope", wantStatus: 404, wantMsg: []string{"nope", "not found"}},
		{name: "config", method: "GET", path: "/connectors/src/config", wantStatus: 200,
			wantBody: `{"connector.class":"sample.Source","tasks.max":"2","topic":"t1","name":"src","db.password":"[hidden]","db.url":"postgres://app:xxxxx@db:5432/app"}`},
		{name: "status", method: "GET", path: "/connectors/src/status", wantStatus: 200, wantBody: srcStatus},
		{name: "status with deletion and abandoned task", prepare: func(f *fakeHerder) {
			f.connectors["src"].deletion = &herder.Deletion{Phase: "cleanup-failed", Error: "dropping audit_src: connection refused", Attempts: 2, StartedAt: deletionStart,
				Remaining: []connect.Resource{{Kind: "postgres.table", Name: "audit_src", Location: "app.public"}}}
			delete(f.connectors["src"].failed, 1)
		}, method: "GET", path: "/connectors/src/status", wantStatus: 200,
			wantBody: `{"name":"src","type":"source","connector":{"state":"FAILED","worker_id":"127.0.0.1:8083","trace":"dropping audit_src: connection refused"},
				"tasks":[{"id":0,"state":"RUNNING","worker_id":"127.0.0.1:8083"},{"id":1,"state":"RUNNING","worker_id":"127.0.0.1:8083"}],
				"deletion":{"phase":"cleanup-failed","remaining":[{"kind":"postgres.table","name":"audit_src","location":"app.public"}],
				"error":"dropping audit_src: connection refused","attempts":2,"started_at":"2026-11-30T01:02:03Z"}}`},
		{name: "status of stopped connector", prepare: func(f *fakeHerder) { f.connectors["src"].target = worker.TargetStopped },
			method: "GET", path: "/connectors/src/status", wantStatus: 200,
			wantBody: `{"name":"src","type":"source","connector":{"state":"STOPPED","worker_id":"127.0.0.1:8083"},"tasks":[]}`},
		{name: "tasks", method: "GET", path: "/connectors/src/tasks", wantStatus: 200,
			wantBody: `[{"id":{"connector":"src","task":0},"config":{"task.id":"0","db.password":"[hidden]"}},{"id":{"connector":"src","task":1},"config":{"task.id":"1","db.password":"[hidden]"}}]`},
		{name: "task status", method: "GET", path: "/connectors/src/tasks/1/status", wantStatus: 200,
			wantBody: `{"id":1,"state":"FAILED","worker_id":"127.0.0.1:8083","trace":"boom: connection refused"}`},
		{name: "task status unknown task", method: "GET", path: "/connectors/src/tasks/7/status", wantStatus: 404, wantMsg: []string{"Task 7", "src", "not found"}},
		{name: "task status non-integer id", method: "GET", path: "/connectors/src/tasks/abc/status", wantStatus: 404, wantMsg: []string{`"abc"`, "not a task number"}, wantCalls: []string{}},
		{name: "task status negative id", method: "GET", path: "/connectors/src/tasks/-1/status", wantStatus: 404, wantMsg: []string{`"-1"`}, wantCalls: []string{}},
		{name: "task restart", method: "POST", path: "/connectors/src/tasks/1/restart", contentType: appJSON, wantStatus: 204, wantCalls: []string{"RestartTask src/1"}},
		{name: "task restart unknown connector", method: "POST", path: "/connectors/nope/tasks/0/restart", wantStatus: 404, wantMsg: []string{"nope"}},
		{name: "pause", method: "PUT", path: "/connectors/src/pause", wantStatus: 202, wantCalls: []string{"Pause src"}},
		{name: "pause bodiless with JSON content type", method: "PUT", path: "/connectors/src/pause", contentType: appJSON, wantStatus: 202, wantCalls: []string{"Pause src"}},
		{name: "pause unknown", method: "PUT", path: "/connectors/nope/pause", wantStatus: 404, wantMsg: []string{"nope"}},
		{name: "resume", method: "PUT", path: "/connectors/src/resume", contentType: appJSON, wantStatus: 202, wantCalls: []string{"Resume src"}},
		{name: "stop", method: "PUT", path: "/connectors/src/stop", contentType: appJSON, wantStatus: 204, wantCalls: []string{"Stop src"}},
		{name: "stop rebalance", prepare: func(f *fakeHerder) { f.errs["Stop"] = herder.ErrRebalance }, method: "PUT", path: "/connectors/src/stop", wantStatus: 409, wantMsg: []string{"retry"}},
		{name: "restart plain", method: "POST", path: "/connectors/src/restart", contentType: appJSON, wantStatus: 204,
			wantCalls: []string{"Restart src includeTasks=false onlyFailed=false"}},
		{name: "restart include tasks only failed", method: "POST", path: "/connectors/src/restart?includeTasks=true&onlyFailed=true", contentType: appJSON, wantStatus: 202,
			wantBody: `{"name":"src","type":"source","connector":{"state":"RUNNING","worker_id":"127.0.0.1:8083"},
				"tasks":[{"id":0,"state":"RUNNING","worker_id":"127.0.0.1:8083"},{"id":1,"state":"RESTARTING","worker_id":"127.0.0.1:8083"}]}`,
			wantCalls: []string{"Restart src includeTasks=true onlyFailed=true"}},
		{name: "restart include tasks", method: "POST", path: "/connectors/src/restart?includeTasks=true", wantStatus: 202,
			wantBody: `{"name":"src","type":"source","connector":{"state":"RESTARTING","worker_id":"127.0.0.1:8083"},
				"tasks":[{"id":0,"state":"RESTARTING","worker_id":"127.0.0.1:8083"},{"id":1,"state":"RESTARTING","worker_id":"127.0.0.1:8083"}]}`},
		{name: "restart bad boolean", method: "POST", path: "/connectors/src/restart?includeTasks=yes&onlyFailed=2", wantStatus: 400,
			wantMsg: []string{`includeTasks="yes"`, `onlyFailed="2"`}, wantCalls: []string{}},
		{name: "restart unknown", method: "POST", path: "/connectors/nope/restart", wantStatus: 404},
		{name: "delete", method: "DELETE", path: "/connectors/src", wantStatus: 204, wantCalls: []string{"DeleteConnector src"}},
		{name: "delete unknown", method: "DELETE", path: "/connectors/nope", wantStatus: 404},
		{name: "delete cleanup failed", prepare: func(f *fakeHerder) {
			f.errs["DeleteConnector"] = &herder.DeletionError{Connector: "src", Err: errors.New("connection refused"),
				Remaining: []connect.Resource{{Kind: "postgres.table", Name: "audit_src", Location: "app.public"}}}
		}, method: "DELETE", path: "/connectors/src", wantStatus: 500,
			wantBody: `{"error_code":500,"message":"deletion of connector src is incomplete; remaining: [postgres.table audit_src at app.public]: connection refused; it is retried in the background; fix the cause (if it is the configuration, e.g. a rotated password or a moved server, fix the configuration with PUT /connectors/src/config), then retry DELETE",
				"remaining":[{"kind":"postgres.table","name":"audit_src","location":"app.public"}]}`},
		{name: "offsets", method: "GET", path: "/connectors/src/offsets", wantStatus: 200,
			wantBody: `{"offsets":[{"partition":{"table":"orders"},"offset":{"id":42}}]}`},
		{name: "offsets empty", prepare: func(f *fakeHerder) { f.connectors["src"].offsets = nil }, method: "GET", path: "/connectors/src/offsets", wantStatus: 200, wantBody: `{"offsets":[]}`},
		{name: "alter offsets while running", method: "PATCH", path: "/connectors/src/offsets", contentType: appJSON,
			body: `{"offsets":[{"partition":{"table":"orders"},"offset":{"id":7}}]}`, wantStatus: 400, wantMsg: []string{"STOPPED"}},
		{name: "alter offsets stopped", prepare: func(f *fakeHerder) { f.connectors["src"].target = worker.TargetStopped }, method: "PATCH", path: "/connectors/src/offsets", contentType: appJSON,
			body: `{"offsets":[{"partition":{"table":"orders"},"offset":{"id":7}},{"partition":{"table":"x"},"offset":null}]}`, wantStatus: 200,
			wantBody: `{"message":"The Connect framework-managed offsets for this connector have been altered successfully. However, if this connector manages offsets externally, they will need to be manually altered in the system that the connector uses."}`, wantCalls: []string{"AlterOffsets src 2"}},
		{name: "alter offsets bad body", method: "PATCH", path: "/connectors/src/offsets", contentType: appJSON,
			body: `{"offsets":[{"offset":{"id":7}},{"partition":3}], "extra":1}`, wantStatus: 400,
			wantMsg: []string{"offsets[0].partition is required", "offsets[1].partition must be an object", `unknown field "extra"`}, wantCalls: []string{}},
		{name: "alter offsets missing offsets", method: "PATCH", path: "/connectors/src/offsets", contentType: appJSON, body: `{}`, wantStatus: 400, wantMsg: []string{`"offsets" is required`}},
		{name: "reset offsets while running", method: "DELETE", path: "/connectors/src/offsets", wantStatus: 400, wantMsg: []string{"must be in the STOPPED state", "'/connectors/src/stop' endpoint"}},
		{name: "reset offsets stopped", prepare: func(f *fakeHerder) { f.connectors["src"].target = worker.TargetStopped }, method: "DELETE", path: "/connectors/src/offsets", wantStatus: 200,
			wantBody: `{"message":"The Connect framework-managed offsets for this connector have been reset successfully. However, if this connector manages offsets externally, they will need to be manually reset in the system that the connector uses."}`},
		{name: "topics keyed by connector name", method: "GET", path: "/connectors/src/topics", wantStatus: 200, wantBody: `{"src":{"topics":["t1","t2"]}}`},
		{name: "topics reset", method: "PUT", path: "/connectors/src/topics/reset", contentType: appJSON, wantStatus: 202, wantCalls: []string{"ResetTopics src"}},
		{name: "alter offsets empty list", method: "PATCH", path: "/connectors/src/offsets", contentType: appJSON, body: `{"offsets":[]}`, wantStatus: 400,
			wantMsg: []string{"need to be provided"}, wantCalls: []string{}},
		{name: "resources", method: "GET", path: "/connectors/src/resources", wantStatus: 200,
			wantBody: `[{"kind":"postgres.table","name":"audit_src","location":"app.public"}]`},
		{name: "resources none", prepare: func(f *fakeHerder) { f.connectors["src"].resources = nil }, method: "GET", path: "/connectors/src/resources", wantStatus: 200, wantBody: `[]`},
		{name: "plugins", method: "GET", path: "/connector-plugins", wantStatus: 200,
			wantBody: `[{"class":"sample.Sink","type":"sink","version":"1.0.0"},{"class":"sample.Source","type":"source","version":"1.0.0"}]`},
		{name: "plugins connectorsOnly=false", method: "GET", path: "/connector-plugins/?connectorsOnly=false", wantStatus: 200,
			wantBody: `[{"class":"sample.Sink","type":"sink","version":"1.0.0"},{"class":"sample.Source","type":"source","version":"1.0.0"}]`},
		{name: "plugin config", method: "GET", path: "/connector-plugins/sample.Sink/config", wantStatus: 200,
			wantBody: `[{"name":"connector.class","type":"STRING","required":true,"importance":"HIGH","documentation":"The plugin.","group":"Common","width":"NONE","display_name":"connector.class","dependents":[],"order":0},
				{"name":"tasks.max","type":"INT","required":false,"default_value":"1","importance":"HIGH","documentation":"Maximum tasks.","group":"Common","width":"NONE","display_name":"tasks.max","dependents":[],"order":0}]`},
		{name: "plugin config unknown", method: "GET", path: "/connector-plugins/nope/config", wantStatus: 404, wantMsg: []string{"nope", "GET /connector-plugins"}},
		{name: "validate", method: "PUT", path: "/connector-plugins/sample.Source/config/validate", contentType: appJSON,
			body: `{"tasks.max":"x","db.password":"s3cret","db.url":"postgres://u:s3cret@h/db"}`, wantStatus: 200,
			wantBody: `{"name":"sample.Source","error_count":2,"groups":["Common","Source"],"configs":[
				{"definition":{"name":"connector.class","type":"STRING","required":true,"importance":"HIGH","documentation":"The plugin.","group":"Common","width":"NONE","display_name":"connector.class","dependents":[],"order":0},
				 "value":{"name":"connector.class","value":"sample.Source","recommended_values":[],"errors":[],"visible":true}},
				{"definition":{"name":"tasks.max","type":"INT","required":false,"default_value":"1","importance":"HIGH","documentation":"Maximum tasks.","group":"Common","width":"NONE","display_name":"tasks.max","dependents":[],"order":0},
				 "value":{"name":"tasks.max","value":"x","recommended_values":[],"errors":["Invalid value x for configuration tasks.max: expected int"],"visible":true}},
				{"definition":{"name":"topic","type":"STRING","required":true,"importance":"MEDIUM","documentation":"Target topic.","group":"Source","width":"NONE","display_name":"topic","dependents":[],"order":0},
				 "value":{"name":"topic","recommended_values":[],"errors":["Missing required configuration \"topic\" which has no default value."],"visible":true}},
				{"definition":{"name":"db.password","type":"PASSWORD","required":false,"default_value":"","importance":"MEDIUM","documentation":"Database password.","group":"Source","width":"NONE","display_name":"db.password","dependents":[],"order":0},
				 "value":{"name":"db.password","value":"[hidden]","recommended_values":[],"errors":[],"visible":true}},
				{"definition":{"name":"db.url","type":"STRING","required":false,"default_value":"","importance":"MEDIUM","documentation":"Database URL.","group":"Source","width":"NONE","display_name":"db.url","dependents":[],"order":0},
				 "value":{"name":"db.url","value":"postgres://u:xxxxx@h/db","recommended_values":["postgres://localhost/test"],"errors":[],"visible":true}}]}`},
		{name: "validate class mismatch", method: "PUT", path: "/connector-plugins/sample.Source/config/validate", contentType: appJSON,
			body: `{"connector.class":"sample.Sink"}`, wantStatus: 400, wantMsg: []string{"sample.Sink", "sample.Source"}, wantCalls: []string{}},
		{name: "validate non-scalar value", method: "PUT", path: "/connector-plugins/sample.Source/config/validate", contentType: appJSON,
			body: `{"tasks.max":{"n":2}}`, wantStatus: 400, wantMsg: []string{`"tasks.max"`, "must be a JSON string", "an object"}, wantCalls: []string{}},
		{name: "validate array value", method: "PUT", path: "/connector-plugins/sample.Source/config/validate", contentType: appJSON,
			body: `{"topics":["a","b"]}`, wantStatus: 400, wantMsg: []string{`"topics"`, "must be a JSON string", "an array"}, wantCalls: []string{}},
		// Kafka's JSON binding coerces numbers and booleans into its
		// string-to-string config maps; so do we, keeping the literal text.
		{name: "create with number and boolean values", method: "POST", path: "/connectors", contentType: appJSON,
			body: `{"name":"new","config":{"connector.class":"sample.Sink","tasks.max":2,"flag":true}}`, wantStatus: 201,
			wantHeader: map[string]string{"Location": "/connectors/new"},
			wantBody:   `{"name":"new","type":"sink","tasks":[{"connector":"new","task":0}],"config":{"connector.class":"sample.Sink","name":"new","tasks.max":"2","flag":"true"}}`,
			wantCalls:  []string{"CreateConnector new RUNNING"}},
		{name: "validate unknown plugin", method: "PUT", path: "/connector-plugins/nope/config/validate", contentType: appJSON, body: `{}`, wantStatus: 404},
		// As Kafka Connect: a body declared as something else than JSON is
		// 415 (curl -d without -H sends a form type); none is read as JSON.
		{name: "create with a form content type", method: "POST", path: "/connectors", contentType: "application/x-www-form-urlencoded",
			body: `{"name":"new","config":{"connector.class":"sample.Sink"}}`, wantStatus: 415, wantMsg: []string{"Content-Type: application/json"}, wantCalls: []string{}},
		{name: "put config as text", method: "PUT", path: "/connectors/src/config", contentType: "text/plain",
			body: `{"connector.class":"sample.Source"}`, wantStatus: 415, wantMsg: []string{"text/plain"}, wantCalls: []string{}},
		{name: "json with a charset", method: "PUT", path: "/connector-plugins/sample.Source/config/validate", contentType: "application/json; charset=utf-8",
			body: `{"topic":"t"}`, wantStatus: 200},

		// Creation and config changes.
		{name: "create", method: "POST", path: "/connectors", contentType: appJSON,
			body: `{"name":"new","config":{"connector.class":"sample.Sink","db.password":"pw"}}`, wantStatus: 201,
			wantHeader: map[string]string{"Location": "/connectors/new"},
			wantBody:   `{"name":"new","type":"sink","tasks":[{"connector":"new","task":0}],"config":{"connector.class":"sample.Sink","name":"new","db.password":"[hidden]"}}`,
			wantCalls:  []string{"CreateConnector new RUNNING"}},
		{name: "create trailing slash, initial state, name trimmed", method: "POST", path: "/connectors/", contentType: appJSON,
			body: `{"name":" new ","config":{"connector.class":"sample.Sink","name":"new"},"initial_state":"stopped"}`, wantStatus: 201,
			wantCalls: []string{"CreateConnector new STOPPED"}},
		{name: "create exists", method: "POST", path: "/connectors", contentType: appJSON,
			body: `{"name":"src","config":{"connector.class":"sample.Source","topic":"t"}}`, wantStatus: 409, wantMsg: []string{"src", "already exists"}},
		{name: "create invalid config lists every field", method: "POST", path: "/connectors", contentType: appJSON,
			body: `{"name":"new","config":{"connector.class":"sample.Source","tasks.max":"many"}}`, wantStatus: 400,
			wantMsg: []string{"2 error(s)", "tasks.max", "topic"}},
		{name: "create unknown class", method: "POST", path: "/connectors", contentType: appJSON,
			body: `{"name":"new","config":{"connector.class":"Nope"}}`, wantStatus: 400, wantMsg: []string{"connector.class", "Nope"}},
		{name: "create malformed JSON", method: "POST", path: "/connectors", contentType: appJSON,
			body: `{"name":"new",`, wantStatus: 400, wantMsg: []string{"malformed JSON", "byte"}, wantCalls: []string{}},
		{name: "create empty body", method: "POST", path: "/connectors", contentType: appJSON, wantStatus: 400, wantMsg: []string{"empty"}, wantCalls: []string{}},
		{name: "create not an object", method: "POST", path: "/connectors", contentType: appJSON, body: `["new"]`, wantStatus: 400, wantMsg: []string{"JSON object", "an array"}},
		{name: "create bad fields all named", method: "POST", path: "/connectors", contentType: appJSON,
			body: `{"name":"a/b","config":{"tasks.max":[2],"flag":{},"ok":"x"},"initial_state":"GONE","configs":{}}`, wantStatus: 400,
			wantMsg:   []string{"'/'", `"tasks.max"`, `"flag"`, `"GONE"`, `unknown field "configs"`},
			wantCalls: []string{}},
		{name: "create missing name and config", method: "POST", path: "/connectors", contentType: appJSON, body: `{}`, wantStatus: 400,
			wantMsg: []string{`"name" is required`, `"config" is required`}, wantCalls: []string{}},
		{name: "create empty name", method: "POST", path: "/connectors", contentType: appJSON, body: `{"name":"  ","config":{}}`, wantStatus: 400,
			wantMsg: []string{`"name" must not be empty`}, wantCalls: []string{}},
		{name: "create name mismatch", method: "POST", path: "/connectors", contentType: appJSON,
			body: `{"name":"new","config":{"connector.class":"sample.Sink","name":"other"}}`, wantStatus: 400, wantMsg: []string{"(other)", "(new)"}, wantCalls: []string{}},
		{name: "put config creates", method: "PUT", path: "/connectors/new/config", contentType: appJSON,
			body: `{"connector.class":"sample.Sink"}`, wantStatus: 201, wantHeader: map[string]string{"Location": "/connectors/new"},
			wantCalls: []string{"PutConnectorConfig new"}},
		{name: "put config updates", method: "PUT", path: "/connectors/src/config", contentType: appJSON,
			body: `{"connector.class":"sample.Source","topic":"t9","name":"src"}`, wantStatus: 200,
			wantBody: `{"name":"src","type":"source","tasks":[{"connector":"src","task":0},{"connector":"src","task":1}],"config":{"connector.class":"sample.Source","topic":"t9","name":"src"}}`},
		{name: "put config name mismatch", method: "PUT", path: "/connectors/src/config", contentType: appJSON,
			body: `{"connector.class":"sample.Source","name":"other"}`, wantStatus: 400, wantMsg: []string{"other", "src"}, wantCalls: []string{}},
		{name: "put config non-string", method: "PUT", path: "/connectors/src/config", contentType: appJSON,
			body: `{"connector.class":"sample.Source","tasks.max":[3],"x":null}`, wantStatus: 400, wantMsg: []string{`"tasks.max"`, `"x"`, "null", "an array"}, wantCalls: []string{}},
		{name: "put config with the POST body shape", method: "PUT", path: "/connectors/src/config", contentType: appJSON,
			body: `{"name":"src","config":{"connector.class":"sample.Source"}}`, wantStatus: 400, wantMsg: []string{"config object itself", "POST /connectors"}, wantCalls: []string{}},
		{name: "body too large", method: "PUT", path: "/connectors/src/config", contentType: appJSON,
			body: `{"k":"` + strings.Repeat("x", 9<<20) + `"}`, wantStatus: 413, wantMsg: []string{"8 MiB"}, wantCalls: []string{}},
		{name: "put config invalid", method: "PUT", path: "/connectors/src/config", contentType: appJSON,
			body: `{"connector.class":"sample.Source"}`, wantStatus: 400, wantMsg: []string{"topic"}},
		{name: "patch config", method: "PATCH", path: "/connectors/src/config", contentType: appJSON,
			body: `{"topic":"t5","db.url":null}`, wantStatus: 200,
			wantBody:  `{"name":"src","type":"source","tasks":[{"connector":"src","task":0},{"connector":"src","task":1}],"config":{"connector.class":"sample.Source","tasks.max":"2","topic":"t5","name":"src","db.password":"[hidden]"}}`,
			wantCalls: []string{"PatchConnectorConfig src [db.url topic]"}},
		{name: "patch config wrong type", method: "PATCH", path: "/connectors/src/config", contentType: appJSON,
			body: `{"tasks.max":{"n":3}}`, wantStatus: 400, wantMsg: []string{`"tasks.max"`, "an object"}, wantCalls: []string{}},
		{name: "patch config renames", method: "PATCH", path: "/connectors/src/config", contentType: appJSON,
			body: `{"name":"other"}`, wantStatus: 400, wantMsg: []string{"name"}, wantCalls: []string{}},

		{name: "credentials in herder errors are masked", prepare: func(f *fakeHerder) {
			f.errs["ConnectorStatus"] = errors.New("status store at postgres://app:s3cret@db/x unreachable; password=s3cret rejected")
		}, method: "GET", path: "/connectors/src/status", wantStatus: 500,
			wantBody: `{"error_code":500,"message":"status store at postgres://app:xxxxx@db/x unreachable; password=xxxxx rejected"}`},
		{name: "credentials in traces are masked", prepare: func(f *fakeHerder) {
			f.connectors["src"].failed[1] = "dial amqp://guest:s3cret@mq:5672/: refused"
		}, method: "GET", path: "/connectors/src/tasks/1/status", wantStatus: 200,
			wantBody: `{"id":1,"state":"FAILED","worker_id":"127.0.0.1:8083","trace":"dial amqp://guest:xxxxx@mq:5672/: refused"}`},
		{name: "credentials net/url cannot parse are masked in traces", prepare: func(f *fakeHerder) {
			f.connectors["src"].failed[1] = "connecting to postgres://app:S3cr#P?W@db:5432/x failed; sslpassword=k3y rejected"
		}, method: "GET", path: "/connectors/src/tasks/1/status", wantStatus: 200,
			wantBody: `{"id":1,"state":"FAILED","worker_id":"127.0.0.1:8083","trace":"connecting to postgres://app:xxxxx@db:5432/x failed; sslpassword=xxxxx rejected"}`},
		{name: "backslash-escaped DSN passwords are masked whole in traces", prepare: func(f *fakeHerder) {
			f.connectors["src"].failed[1] = `connecting to host=db password=top\ secret failed`
		}, method: "GET", path: "/connectors/src/tasks/1/status", wantStatus: 200,
			wantBody: `{"id":1,"state":"FAILED","worker_id":"127.0.0.1:8083","trace":"connecting to host=db password=xxxxx failed"}`},
		// Routing.
		{name: "unknown route", method: "GET", path: "/nope", wantStatus: 404, wantMsg: []string{"no such endpoint"}},
		{name: "unclean path is cleaned, not redirected", method: "GET", path: "/connectors//src/./tasks/../status/", wantStatus: 200, wantBody: srcStatus},
		{name: "unknown sub-route", method: "GET", path: "/connectors/src/bogus", wantStatus: 404},
		{name: "wrong method", method: "DELETE", path: "/connectors/src/status", wantStatus: 405, wantMsg: []string{"DELETE"}, wantHeader: map[string]string{"Allow": "GET, HEAD"}},
		{name: "wrong method on collection", method: "PUT", path: "/connectors", wantStatus: 405},
		{name: "herder internal error", prepare: func(f *fakeHerder) {
			f.errs["ConnectorStatus"] = errors.New("status store unreadable; check the data dir")
		},
			method: "GET", path: "/connectors/src/status", wantStatus: 500,
			wantBody: `{"error_code":500,"message":"status store unreadable; check the data dir"}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeHerder()
			setup(f)
			if tc.prepare != nil {
				tc.prepare(f)
			}
			h := newFakeHarness(t, f)
			res := h.do(tc.method, tc.path, tc.body, tc.contentType)
			if res.Status != tc.wantStatus {
				t.Fatalf("status = %d, want %d; body %s", res.Status, tc.wantStatus, res.Body)
			}
			if tc.wantBody != "" {
				jsonEqual(t, res.Body, tc.wantBody)
			}
			if tc.wantStatus == http.StatusNoContent && len(res.Body) != 0 {
				t.Errorf("204 with body %q", res.Body)
			}
			if len(tc.wantMsg) > 0 {
				var e struct{ Message string }
				res.json(t, &e)
				for _, m := range tc.wantMsg {
					if !strings.Contains(e.Message, m) {
						t.Errorf("message %q does not contain %q", e.Message, m)
					}
				}
			}
			for k, v := range tc.wantHeader {
				if got := res.Header.Get(k); got != v {
					t.Errorf("header %s = %q, want %q", k, got, v)
				}
			}
			if tc.wantCalls != nil {
				if got := f.Calls(); !slices.Equal(got, tc.wantCalls) && !(len(got) == 0 && len(tc.wantCalls) == 0) {
					t.Errorf("herder calls = %q, want %q", got, tc.wantCalls)
				}
			}
			if logs := h.logs.String(); strings.Contains(logs, "s3cret") || strings.Contains(logs, `"pw"`) {
				t.Errorf("a secret reached the log:\n%s", logs)
			}
		})
	}
}

func TestAccessLog(t *testing.T) {
	f := newFakeHerder()
	setup(f)
	h := newFakeHarness(t, f)
	h.do("POST", "/connectors", `{"name":"new","config":{"connector.class":"sample.Sink","db.password":"hunter2"}}`, appJSON)
	h.do("GET", "/connectors/nope", "", "")
	var entries []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(h.logs.String()), "\n") {
		var e map[string]any
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if e["msg"] == "rest request" {
			entries = append(entries, e)
		}
	}
	if len(entries) != 2 {
		t.Fatalf("got %d access log entries, want 2: %s", len(entries), h.logs.String())
	}
	for i, want := range []struct {
		method, path string
		status       float64
	}{{"POST", "/connectors", 201}, {"GET", "/connectors/nope", 404}} {
		e := entries[i]
		if e["method"] != want.method || e["path"] != want.path || e["status"] != want.status {
			t.Errorf("entry %d = %v, want %s %s %v", i, e, want.method, want.path, want.status)
		}
		if _, ok := e["duration"]; !ok {
			t.Errorf("entry %d has no duration: %v", i, e)
		}
	}
	if strings.Contains(h.logs.String(), "hunter2") {
		t.Errorf("the request body's secret reached the log: %s", h.logs.String())
	}
}

// DELETE waits for cleanup, bounded by WithDeleteTimeout.
func TestDeleteTimeout(t *testing.T) {
	f := newFakeHerder()
	setup(f)
	f.deleteBlock = true
	h := newFakeHarness(t, f, rest.WithDeleteTimeout(50*time.Millisecond))
	res := h.do("DELETE", "/connectors/src", "", "")
	if res.Status != http.StatusInternalServerError {
		t.Fatalf("status = %d, want 500; body %s", res.Status, res.Body)
	}
	var e struct{ Message string }
	res.json(t, &e)
	for _, want := range []string{"did not finish within 50ms", "GET /connectors/src/status", "retry DELETE"} {
		if !strings.Contains(e.Message, want) {
			t.Errorf("message %q lacks %q", e.Message, want)
		}
	}
}

// A DELETE that could not even begin (another operation held the connector
// until the timeout) is a 409 to retry, not a deletion that "carries on".
func TestDeleteThatDidNotStart(t *testing.T) {
	f := newFakeHerder()
	setup(f)
	f.errs["DeleteConnector"] = fmt.Errorf("%w: another operation on connector src is still running, so its deletion did not start; retry DELETE: %w", herder.ErrRebalance, context.DeadlineExceeded)
	h := newFakeHarness(t, f, rest.WithDeleteTimeout(50*time.Millisecond))
	res := h.do("DELETE", "/connectors/src", "", "")
	var e struct{ Message string }
	res.json(t, &e)
	if res.Status != http.StatusConflict || !strings.Contains(e.Message, "did not start") || strings.Contains(e.Message, "carries on") {
		t.Fatalf("DELETE = %d %q, want 409 saying the deletion did not start", res.Status, e.Message)
	}
}

// Over a real HTTP server: bodiless requests with a JSON content type and
// Content-Length 0, HEAD, and a keep-alive connection reused after errors.
func TestOverHTTP(t *testing.T) {
	f := newFakeHerder()
	setup(f)
	srv := httptest.NewServer(rest.New(f))
	defer srv.Close()
	cl := srv.Client()
	tests := []struct {
		method, path string
		body         io.Reader
		status       int
	}{
		{"PUT", "/connectors/src/pause", http.NoBody, 202},
		{"PUT", "/connectors/src/resume", strings.NewReader(""), 202},
		{"POST", "/connectors/src/restart", http.NoBody, 204},
		{"HEAD", "/connectors/src/status", nil, 200},
		{"GET", "/connectors/nope", nil, 404},
		{"PATCH", "/connectors/src/pause", nil, 405},
		{"GET", "/connectors/", nil, 200},
	}
	for _, tc := range tests {
		req, err := http.NewRequest(tc.method, srv.URL+tc.path, tc.body)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", appJSON)
		res, err := cl.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", tc.method, tc.path, err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != tc.status || res.Header.Get("Content-Type") != appJSON {
			t.Errorf("%s %s: %d %q, want %d application/json", tc.method, tc.path, res.StatusCode, res.Header.Get("Content-Type"), tc.status)
		}
	}
}

// Kafka's path escaping: a name with spaces and '%' round-trips, and
// Location is escaped.
func TestEscapedNames(t *testing.T) {
	f := newFakeHerder()
	h := newFakeHarness(t, f)
	res := h.do("POST", "/connectors", `{"name":"my conn%1","config":{"connector.class":"sample.Sink"}}`, appJSON)
	if res.Status != http.StatusCreated {
		t.Fatalf("create: %d %s", res.Status, res.Body)
	}
	if loc := res.Header.Get("Location"); loc != "/connectors/my%20conn%251" {
		t.Errorf("Location = %q", loc)
	}
	res = h.do("GET", "/connectors/my%20conn%251/topics", "", "")
	if res.Status != http.StatusOK {
		t.Fatalf("topics: %d %s", res.Status, res.Body)
	}
	jsonEqual(t, res.Body, `{"my conn%1":{"topics":[]}}`)
}

// Every state the worker can report maps into Kafka's enums.
func TestStatesStayInKafkaEnums(t *testing.T) {
	states := []worker.State{worker.StateUnassigned, worker.StateRunning, worker.StatePaused, worker.StateStopped,
		worker.StateFailed, worker.StateRestarting, "DELETING", ""}
	for _, cs := range states {
		for _, ts := range states {
			t.Run(fmt.Sprintf("%s/%s", cs, ts), func(t *testing.T) {
				api := &statusOnly{st: herder.ConnectorStatus{Name: "c", Type: "weird",
					Connector: worker.Status{State: cs, WorkerID: "w"},
					Tasks:     []herder.TaskStatus{{ID: 0, Status: worker.Status{State: ts, WorkerID: "w", Abandoned: true}}}}}
				h := newHarness(t, rest.New(api), &testenv.SyncBuffer{})
				res := h.do("GET", "/connectors/c/status", "", "")
				if res.Status != 200 {
					t.Fatalf("status %d %s", res.Status, res.Body)
				}
				var got struct {
					Type  string
					Tasks []struct {
						State     string
						Abandoned bool
					}
				}
				res.json(t, &got)
				if got.Type != "unknown" || !got.Tasks[0].Abandoned {
					t.Errorf("type %q abandoned %v", got.Type, got.Tasks[0].Abandoned)
				}
			})
		}
	}
}

// A panicking herder call answers a JSON 500 and is logged.
func TestPanicBecomes500(t *testing.T) {
	logs := &testenv.SyncBuffer{}
	api := &statusOnly{} // every method but ConnectorStatus panics (nil embedded API)
	h := newHarness(t, rest.New(api, rest.WithLogger(slog.New(slog.NewJSONHandler(logs, nil)))), logs)
	res := h.do("GET", "/connectors/c/config", "", "")
	if res.Status != http.StatusInternalServerError {
		t.Fatalf("status %d %s", res.Status, res.Body)
	}
	if !strings.Contains(logs.String(), "rest handler panicked") || !strings.Contains(logs.String(), `"status":500`) {
		t.Errorf("panic not logged: %s", logs.String())
	}
}

// statusOnly answers ConnectorStatus with a fixed value.
type statusOnly struct {
	herder.API
	st herder.ConnectorStatus
}

func (s *statusOnly) ConnectorStatus(_ context.Context, _ string) (herder.ConnectorStatus, error) {
	return s.st, nil
}
