package rest_test

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/tidyconnect/tidyconnect/runtime/logging"
	"github.com/tidyconnect/tidyconnect/runtime/rest"
)

// GET /health (KIP-1017) and /admin/loggers (KIP-495, KIP-976): the same
// paths, bodies and status codes as Kafka Connect, over a real server.
func TestHealthAndLoggers(t *testing.T) {
	type step struct {
		name, method, path, body string
		status                   int
		want                     string   // exact JSON, when set
		wantMsg                  []string // substrings of the body
	}
	for _, tc := range []struct {
		name    string
		prepare func(f *fakeHerder)
		levels  bool
		steps   []step
	}{
		{name: "healthy", levels: true, steps: []step{
			{method: "GET", path: "/health", status: 200,
				want: `{"status":"healthy","message":"Worker has completed startup and is ready to handle requests."}`},
		}},
		{name: "herder failing", levels: true, prepare: func(f *fakeHerder) { f.errs["Connectors"] = errors.New("stuck") }, steps: []step{
			{method: "GET", path: "/health", status: 500, wantMsg: []string{`"status":"unhealthy"`, "stuck"}},
		}},
		{name: "loggers", levels: true, steps: []step{
			{name: "initially root only", method: "GET", path: "/admin/loggers", status: 200, want: `{"root":{"level":"INFO","last_modified":null}}`},
			{name: "root", method: "GET", path: "/admin/loggers/root", status: 200, want: `{"level":"INFO","last_modified":null}`},
			{name: "an existing connector logs at root's level", method: "GET", path: "/admin/loggers/src", status: 200, want: `{"level":"INFO","last_modified":null}`},
			{name: "unknown logger", method: "GET", path: "/admin/loggers/nope", status: 404, wantMsg: []string{"Logger nope not found."}},
			{name: "set a connector", method: "PUT", path: "/admin/loggers/src", body: `{"level":"debug"}`, status: 200, want: `["src"]`},
			{name: "read it back", method: "GET", path: "/admin/loggers/src", status: 200, wantMsg: []string{`{"level":"DEBUG","last_modified":1`}},
			{name: "listed with a time", method: "GET", path: "/admin/loggers", status: 200, wantMsg: []string{`"src":{"level":"DEBUG","last_modified":1`, `"root":{"level":"INFO","last_modified":null}`}},
			{name: "set root sets all", method: "PUT", path: "/admin/loggers/root", body: `{"level":"WARN"}`, status: 200, want: `["root","src"]`},
			{name: "cluster scope", method: "PUT", path: "/admin/loggers/other?scope=cluster", body: `{"level":"ERROR"}`, status: 204},
			{name: "cluster scope applied", method: "GET", path: "/admin/loggers/other", status: 200, wantMsg: []string{`{"level":"ERROR","last_modified":1`}},
			{name: "unknown level", method: "PUT", path: "/admin/loggers/src", body: `{"level":"LOUD"}`, status: 404, wantMsg: []string{"invalid log level 'LOUD'"}},
			{name: "no level", method: "PUT", path: "/admin/loggers/src", body: `{"lvl":"DEBUG"}`, status: 400, wantMsg: []string{"'level' parameter was not specified"}},
			{name: "level not a string", method: "PUT", path: "/admin/loggers/src", body: `{"level":3}`, status: 400, wantMsg: []string{`field \"level\" must be a string`}},
			{name: "not an object", method: "PUT", path: "/admin/loggers/src", body: `["DEBUG"]`, status: 400, wantMsg: []string{"must be a JSON object"}},
			{name: "unchanged by the bad requests", method: "GET", path: "/admin/loggers/src", status: 200, wantMsg: []string{`{"level":"WARN","last_modified":1`}},
		}},
		{name: "without levels", steps: []step{
			{method: "GET", path: "/admin/loggers", status: 404, wantMsg: []string{"cannot be changed"}},
			{method: "PUT", path: "/admin/loggers/root", body: `{"level":"DEBUG"}`, status: 404},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeHerder()
			setup(f)
			if tc.prepare != nil {
				tc.prepare(f)
			}
			var opts []rest.Option
			if tc.levels {
				opts = append(opts, rest.WithLogLevels(logging.NewLevels(slog.LevelInfo)))
			}
			srv := httptest.NewServer(rest.New(f, opts...))
			defer srv.Close()
			for _, st := range tc.steps {
				var body io.Reader
				if st.body != "" {
					body = strings.NewReader(st.body)
				}
				req, err := http.NewRequest(st.method, srv.URL+st.path, body)
				if err != nil {
					t.Fatal(err)
				}
				if body != nil {
					req.Header.Set("Content-Type", appJSON)
				}
				res, err := srv.Client().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				got, _ := io.ReadAll(res.Body)
				res.Body.Close()
				if res.StatusCode != st.status {
					t.Errorf("%s %s %s: status %d, want %d (body %s)", st.name, st.method, st.path, res.StatusCode, st.status, got)
					continue
				}
				if st.want != "" {
					jsonEqual(t, got, st.want)
				}
				for _, m := range st.wantMsg {
					if !strings.Contains(string(got), m) {
						t.Errorf("%s %s %s: body %s lacks %q", st.name, st.method, st.path, got, m)
					}
				}
			}
		})
	}
}

// GET /admin/loggers/{logger} answers Kafka's LoggerLevel, level and
// last_modified (KIP-976), as GET /admin/loggers does for each logger:
// null for a level never set over REST, else the time it was set.
func TestGetLoggerAnswersLastModified(t *testing.T) {
	f := newFakeHerder()
	setup(f)
	levels := logging.NewLevels(slog.LevelInfo)
	if _, err := levels.SetLevel("lm-set", "DEBUG"); err != nil {
		t.Fatal(err)
	}
	set, _ := levels.Logger("lm-set")
	srv := httptest.NewServer(rest.New(f, rest.WithLogLevels(levels)))
	defer srv.Close()
	for _, tc := range []struct {
		path, want string
	}{
		{"/admin/loggers/root", `{"level":"INFO","last_modified":null}`},
		{"/admin/loggers/src", `{"level":"INFO","last_modified":null}`}, // an existing connector at root's level
		{"/admin/loggers/lm-set", `{"level":"DEBUG","last_modified":` + strconv.FormatInt(set.LastModified.UnixMilli(), 10) + `}`},
	} {
		res, err := srv.Client().Get(srv.URL + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Errorf("GET %s: status %d (body %s)", tc.path, res.StatusCode, got)
			continue
		}
		jsonEqual(t, got, tc.want)
	}
}
