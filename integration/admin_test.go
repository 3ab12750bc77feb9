package integration

import (
	"os"
	"strings"
	"testing"
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
	if got := strings.TrimSpace(string(api.must("GET", "/admin/loggers/root", nil, 200))); got != `{"level":"INFO"}` {
		t.Errorf("GET /admin/loggers/root = %s", got)
	}
}
