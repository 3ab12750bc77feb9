package integration

import (
	"os"
	"strings"
	"testing"
	"time"
)

// The binary serves GET /health, and PUT /admin/loggers changes what it
// logs while it runs: at root=WARN the REST access log (INFO) stops, and at
// INFO again it resumes.
func TestHealthAndLogLevelsThroughTheBinary(t *testing.T) {
	w := startWorker(t, withEmbeddedKafka())
	api := w.api()
	if got := string(api.must("GET", "/health", nil, 200)); !strings.Contains(got, `"status":"healthy"`) {
		t.Errorf("GET /health = %s", got)
	}
	accessLines := func(path string) int {
		b, err := os.ReadFile(w.logPath)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, `"msg":"rest request"`) && strings.Contains(l, `"path":"`+path+`"`) {
				n++
			}
		}
		return n
	}

	api.must("GET", "/connectors", nil, 200)
	if accessLines("/connectors") != 1 {
		t.Fatalf("the access log at INFO lacks GET /connectors:\n%s", tail(w.logPath, 20))
	}
	if got := strings.TrimSpace(string(api.must("PUT", "/admin/loggers/root", map[string]string{"level": "WARN"}, 200))); got != `["root"]` {
		t.Errorf("PUT /admin/loggers/root = %s", got)
	}
	api.must("GET", "/connectors", nil, 200)
	if n := accessLines("/connectors"); n != 1 {
		t.Errorf("at root=WARN the access log still logged GET /connectors (%d lines)", n)
	}
	api.must("PUT", "/admin/loggers/root", map[string]string{"level": "INFO"}, 200)
	api.must("GET", "/connectors", nil, 200)
	if n := accessLines("/connectors"); n != 2 {
		t.Errorf("back at root=INFO, GET /connectors logged %d times in all, want 2", n)
	}
	if got := strings.TrimSpace(string(api.must("GET", "/admin/loggers/root", nil, 200))); !strings.HasPrefix(got, `{"level":"INFO","last_modified":1`) {
		t.Errorf("GET /admin/loggers/root = %s", got)
	}
}

// PUT /admin/loggers/<connector> DEBUG turns on that connector's debug lines
// (its task's reads and deletes of audit rows) and no other's.
func TestConnectorLogLevelThroughTheBinary(t *testing.T) {
	c := newChain(t, true)
	c.deploy()
	debugOf := func(connector string) int {
		n := 0
		for _, l := range strings.Split(c.w.logLevels("DEBUG"), "\n") {
			if strings.Contains(l, `"connector":"`+connector+`"`) {
				n++
			}
		}
		return n
	}
	if got := strings.TrimSpace(string(c.api.must("PUT", "/admin/loggers/"+c.src, map[string]string{"level": "DEBUG"}, 200))); got != `["`+c.src+`"]` {
		t.Errorf("PUT /admin/loggers/%s = %s", c.src, got)
	}
	c.exec(`INSERT INTO ` + c.table("customers") + ` (name, email) VALUES ('debug-probe', 'debug@example.com')`)
	if !eventually(60*time.Second, func() bool { return c.w.logContains("deleted audit rows whose changes Kafka acknowledged") }) {
		t.Fatalf("no debug line of %s after setting its level to DEBUG:\n%s", c.src, tail(c.w.logPath, 30))
	}
	if debugOf(c.src) == 0 {
		t.Errorf("the debug lines do not carry connector %s", c.src)
	}
	if n := debugOf(c.sink); n != 0 {
		t.Errorf("%d debug lines of %s, whose level was not set:\n%s", n, c.sink, c.w.logLevels("DEBUG"))
	}
}
