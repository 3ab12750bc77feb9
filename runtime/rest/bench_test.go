package rest_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/rest"
)

// Benchmarks of the REST layer's own cost (routing, decoding, encoding,
// access log) over the in-memory fake herder:
//
//	go test -run '^$' -bench . -benchmem ./runtime/rest/
func BenchmarkREST(b *testing.B) {
	f := newFakeHerder()
	for i := range 50 {
		f.add(fmt.Sprintf("conn-%02d", i), connect.TypeSource, connect.Config{"connector.class": "sample.Source", "topic": "t", "tasks.max": "4"}, 4)
	}
	h := rest.New(f) // the default logger discards
	cases := []struct {
		name, method, path, body string
	}{
		{"GetStatus", "GET", "/connectors/conn-07/status", ""},
		{"ListExpandStatusInfo50", "GET", "/connectors?expand=status&expand=info", ""},
		{"PutConfig", "PUT", "/connectors/conn-07/config", `{"connector.class":"sample.Source","topic":"t2","tasks.max":"4"}`},
		{"NotFound", "GET", "/connectors/nope/status", ""},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var body io.Reader
				if c.body != "" {
					body = strings.NewReader(c.body)
				}
				req := httptest.NewRequest(c.method, c.path, body)
				req.Header.Set("Content-Type", "application/json")
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code >= 500 || (c.name != "NotFound" && rec.Code != http.StatusOK) {
					b.Fatalf("%s %s: %d %s", c.method, c.path, rec.Code, rec.Body)
				}
			}
		})
	}
}
