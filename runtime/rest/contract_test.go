package rest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/rest"
)

// The contract test: every response a test in this package receives is
// checked against contracts/kafka-connect-api.yaml, the OpenAPI description
// kafka-ui generates its client from (see docs/decisions/0030).

var (
	contractOnce   sync.Once
	contractRouter routers.Router
	contractErr    error
)

func loadContract() (routers.Router, error) {
	contractOnce.Do(func() {
		loader := openapi3.NewLoader()
		doc, err := loader.LoadFromFile("../../contracts/kafka-connect-api.yaml")
		if err != nil {
			contractErr = err
			return
		}
		if err := doc.Validate(context.Background()); err != nil {
			contractErr = err
			return
		}
		// Its one server is "/localhost", a placeholder; match paths as they are.
		doc.Servers = nil
		// ConnectorConfig says additionalProperties {type: object}, which the
		// generated Java client reads as Map<String, Object>. Kafka writes
		// every value as a string, so check exactly that: stricter than "any".
		cc := doc.Components.Schemas["ConnectorConfig"].Value
		cc.AdditionalProperties = openapi3.AdditionalProperties{Schema: openapi3.NewStringSchema().NewRef()}
		contractRouter, contractErr = legacy.NewRouter(doc)
	})
	return contractRouter, contractErr
}

// response is what a test request got back.
type response struct {
	Status int
	Header http.Header
	Body   []byte
}

func (r response) json(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.Body, v); err != nil {
		t.Fatalf("decoding response body %s: %v", r.Body, err)
	}
}

// harness drives the handler and checks every response against the
// contract and the house rules (JSON content type, error body shape).
type harness struct {
	t       *testing.T
	handler http.Handler
	logs    *testenv.SyncBuffer
}

func newHarness(t *testing.T, h http.Handler, logs *testenv.SyncBuffer) *harness {
	return &harness{t: t, handler: h, logs: logs}
}

func newFakeHarness(t *testing.T, f *fakeHerder, opts ...rest.Option) *harness {
	logs := &testenv.SyncBuffer{}
	opts = append([]rest.Option{rest.WithLogger(slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))}, opts...)
	return newHarness(t, rest.New(f, opts...), logs)
}

// do sends a request; contentType "" sends none.
func (h *harness) do(method, target, body, contentType string) response {
	h.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, target, rd)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	rec := httptest.NewRecorder()
	h.handler.ServeHTTP(rec, req)
	res := response{Status: rec.Code, Header: rec.Header(), Body: rec.Body.Bytes()}
	h.check(req, res)
	return res
}

func (h *harness) check(req *http.Request, res response) {
	t := h.t
	t.Helper()
	if ct := res.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s %s: Content-Type = %q, want application/json", req.Method, req.URL, ct)
	}
	if res.Status >= 400 {
		var e map[string]any
		if err := json.Unmarshal(res.Body, &e); err != nil {
			t.Fatalf("%s %s: error body %q is not JSON: %v", req.Method, req.URL, res.Body, err)
		}
		if code, _ := e["error_code"].(float64); int(code) != res.Status {
			t.Errorf("%s %s: error_code = %v, want the HTTP status %d", req.Method, req.URL, e["error_code"], res.Status)
		}
		if msg, _ := e["message"].(string); msg == "" {
			t.Errorf("%s %s: error body %s has no message", req.Method, req.URL, res.Body)
		}
	} else if res.Status != http.StatusNoContent && len(res.Body) > 0 && !json.Valid(res.Body) {
		t.Errorf("%s %s: body %q is not JSON", req.Method, req.URL, res.Body)
	}
	if err := validateContract(req, res); err != nil {
		t.Errorf("%s %s -> %d %s: violates contracts/kafka-connect-api.yaml: %v", req.Method, req.URL, res.Status, res.Body, err)
	}
}

// validateContract checks a response against the contract. Paths the
// contract lacks (our extensions, PATCH config, ...) have nothing to check.
// Status leniency only: where the contract says 200 and Kafka answers
// 201/202/204, the body is checked against the 200 schema.
func validateContract(req *http.Request, res response) error {
	if res.Status == http.StatusNoContent && len(res.Body) != 0 {
		return &contractError{"204 with a body"}
	}
	router, err := loadContract()
	if err != nil {
		return err
	}
	route, params, err := router.FindRoute(req)
	if err != nil {
		return nil // not in the contract
	}
	// Kafka answers a plain GET /connectors with an array of names; the
	// contract only describes the expanded form kafka-ui asks for.
	if req.Method == http.MethodGet && route.Path == "/connectors" && len(req.URL.Query()["expand"]) == 0 {
		var names []string
		return json.Unmarshal(res.Body, &names)
	}
	status := res.Status
	if status >= 400 && route.Operation.Responses.Status(status) == nil {
		return nil // undocumented error: the shape was checked above
	}
	if status >= 200 && status < 300 && route.Operation.Responses.Status(status) == nil {
		if route.Operation.Responses.Status(http.StatusOK) == nil {
			return &contractError{"status " + http.StatusText(status) + " is neither documented nor a Kafka variant of 200"}
		}
		switch status {
		case http.StatusCreated, http.StatusAccepted:
			status = http.StatusOK
		case http.StatusNoContent:
			return nil
		default:
			return &contractError{"undocumented status"}
		}
	}
	return openapi3filter.ValidateResponse(context.Background(), &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route},
		Status:                 status,
		Header:                 res.Header,
		Body:                   io.NopCloser(bytes.NewReader(res.Body)),
		Options:                &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	})
}

type contractError struct{ msg string }

func (e *contractError) Error() string { return e.msg }

// TestContractValidatorCatchesViolations proves the validator can fail: a
// new enum value, a non-string config value and a wrong field type are
// rejected.
func TestContractValidatorCatchesViolations(t *testing.T) {
	tests := []struct {
		name, method, path, body string
		status                   int
	}{
		{"connector state outside the enum", "GET", "/connectors/a/status", `{"name":"a","connector":{"state":"DELETING","worker_id":"w"},"tasks":[],"type":"source"}`, 200},
		{"task state STOPPED", "GET", "/connectors/a/status", `{"name":"a","connector":{"state":"STOPPED","worker_id":"w"},"tasks":[{"id":0,"state":"STOPPED","worker_id":"w"}],"type":"source"}`, 200},
		{"numeric config value", "GET", "/connectors/a/config", `{"tasks.max":1}`, 200},
		{"type outside the enum", "GET", "/connectors/a", `{"name":"a","config":{},"tasks":[],"type":"both"}`, 200},
		{"task id as a string", "GET", "/connectors/a/tasks/0/status", `{"id":"0","state":"RUNNING","worker_id":"w"}`, 200},
		{"no-content status with a body", "PUT", "/connectors/a/stop", `{}`, 204},
		{"undocumented success status", "GET", "/", `{}`, 206},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(tc.method, tc.path, nil)
			res := response{Status: tc.status, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(tc.body)}
			if err := validateContract(req, res); err == nil {
				t.Fatalf("validator accepted %s", tc.body)
			}
		})
	}
}
