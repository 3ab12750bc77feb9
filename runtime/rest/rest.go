// Package rest serves Kafka Connect's REST API over a herder.API: the same
// paths, status codes and JSON field names as Apache Kafka Connect, so that
// existing clients (kafka-ui, Redpanda Console, kcctl, curl scripts) work
// unchanged. Extensions (the deletion progress of a connector, abandoned
// tasks, GET /connectors/{c}/resources) live in extra fields and paths, never
// in Kafka's enums.
//
// Every response, errors included, is JSON with Content-Type
// application/json; errors are {"error_code": <HTTP status>, "message": ...}.
// Request and response bodies are never logged: they may hold secrets.
package rest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path"
	"runtime/debug"
	"strings"
	"time"

	"github.com/tidyconnect/tidyconnect/runtime/herder"
	"github.com/tidyconnect/tidyconnect/runtime/logging"
)

// KafkaConnectVersion is the Apache Kafka release whose Connect REST API
// this package serves (up to KIP-1017's GET /health, new in 3.9). GET /
// answers it as "version", where a Kafka worker answers its own release:
// clients gate features on that field (kcctl parses major.minor and refuses
// to read offsets below 3.5; a version that is not numeric, such as a build's
// "dev" or "v0.1.0", makes its commands fail outright). The build's own
// version is in the extra field tidyconnect_version.
const KafkaConnectVersion = "3.9.0"

// DefaultDeleteTimeout bounds how long DELETE /connectors/{c} waits for the
// connector's cleanup.
const DefaultDeleteTimeout = 30 * time.Second

// maxBodyBytes caps request bodies; connector configs are small.
const maxBodyBytes = 8 << 20

// Option configures the handler.
type Option func(*server)

// WithLogger sets the logger for the access log and for server errors. The
// default discards.
func WithLogger(l *slog.Logger) Option {
	return func(s *server) {
		if l != nil {
			s.log = l
		}
	}
}

// WithDeleteTimeout bounds how long DELETE waits for cleanup before it
// answers 500 (the deletion carries on; its progress shows in the status's
// deletion field). Non-positive values keep the default of 30s.
func WithDeleteTimeout(d time.Duration) Option {
	return func(s *server) {
		if d > 0 {
			s.deleteTimeout = d
		}
	}
}

type server struct {
	api           herder.API
	log           *slog.Logger
	deleteTimeout time.Duration
	levels        *logging.Levels
	mux           *http.ServeMux
}

// New returns the REST API handler driving api.
func New(api herder.API, opts ...Option) http.Handler {
	s := &server{
		api:           api,
		log:           slog.New(slog.DiscardHandler),
		deleteTimeout: DefaultDeleteTimeout,
		mux:           http.NewServeMux(),
	}
	for _, o := range opts {
		o(s)
	}
	s.routes()
	return s
}

func (s *server) routes() {
	h := func(pattern string, fn func(w http.ResponseWriter, r *http.Request) error) {
		s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			if err := fn(w, r); err != nil {
				s.writeError(w, r, err)
			}
		})
	}
	h("GET /{$}", s.root)

	h("GET /connectors", s.listConnectors)
	h("POST /connectors", s.createConnector)
	h("GET /connectors/{c}", s.getConnector)
	h("DELETE /connectors/{c}", s.deleteConnector)
	h("GET /connectors/{c}/config", s.getConfig)
	h("PUT /connectors/{c}/config", s.putConfig)
	h("PATCH /connectors/{c}/config", s.patchConfig)
	h("GET /connectors/{c}/status", s.getStatus)
	h("GET /connectors/{c}/tasks", s.getTasks)
	h("GET /connectors/{c}/tasks-config", s.getTasksConfig)
	h("GET /connectors/{c}/tasks/{t}/status", s.getTaskStatus)
	h("POST /connectors/{c}/tasks/{t}/restart", s.restartTask)
	h("POST /connectors/{c}/restart", s.restart)
	h("PUT /connectors/{c}/pause", s.pause)
	h("PUT /connectors/{c}/resume", s.resume)
	h("PUT /connectors/{c}/stop", s.stop)
	h("GET /connectors/{c}/offsets", s.getOffsets)
	h("PATCH /connectors/{c}/offsets", s.alterOffsets)
	h("DELETE /connectors/{c}/offsets", s.resetOffsets)
	h("GET /connectors/{c}/topics", s.getTopics)
	h("PUT /connectors/{c}/topics/reset", s.resetTopics)
	h("GET /connectors/{c}/resources", s.getResources)

	h("GET /connector-plugins", s.listPlugins)
	h("GET /connector-plugins/{p}/config", s.pluginConfig)
	h("PUT /connector-plugins/{p}/config/validate", s.validate)

	h("GET /health", s.health)
	h("GET /admin/loggers", s.listLoggers)
	h("GET /admin/loggers/{logger}", s.getLogger)
	h("PUT /admin/loggers/{logger}", s.setLogger)
}

// ServeHTTP normalises the path, routes, turns the mux's own plain-text 404
// and 405 answers into JSON errors and writes the access log.
func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rec := &statusRecorder{ResponseWriter: w}
	// Kafka (Jersey) tolerates a trailing slash on every path. Cleaning here
	// also keeps the mux from answering an unclean path with an HTML 301.
	if p := cleanPath(r.URL.Path); p != r.URL.Path {
		r2 := r.Clone(r.Context())
		r2.URL.Path = p
		if r.URL.RawPath != "" {
			r2.URL.RawPath = cleanPath(r.URL.RawPath)
		}
		r = r2
	}
	r.Body = http.MaxBytesReader(rec, r.Body, maxBodyBytes)

	h, pattern := s.mux.Handler(r)
	if pattern == "" {
		// The mux's not-found and method-not-allowed handlers write plain
		// text; keep their status and Allow header, answer in JSON.
		probe := &probeWriter{header: http.Header{}}
		h.ServeHTTP(probe, r)
		status := probe.status
		if status == 0 {
			status = http.StatusNotFound
		}
		if allow := probe.header.Get("Allow"); allow != "" {
			rec.Header().Set("Allow", allow)
		}
		switch status {
		case http.StatusMethodNotAllowed:
			s.writeError(rec, r, &httpError{status: status, msg: "HTTP method " + r.Method + " is not supported for " + r.URL.Path + "; allowed: " + probe.header.Get("Allow")})
		case http.StatusNotFound:
			s.writeError(rec, r, &httpError{status: status, msg: "no such endpoint: " + r.Method + " " + r.URL.Path + "; see GET / and the Kafka Connect REST API"})
		default:
			s.writeError(rec, r, &httpError{status: status, msg: http.StatusText(status)})
		}
	} else {
		s.serveRoute(rec, r)
	}

	status := rec.status
	if status == 0 {
		status = http.StatusOK
	}
	s.log.LogAttrs(r.Context(), slog.LevelInfo, "rest request",
		slog.String("method", r.Method),
		slog.String("path", r.URL.Path),
		slog.Int("status", status),
		slog.Duration("duration", time.Since(start)),
	)
}

// cleanPath is path.Clean without a trailing slash, rooted.
func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	if p[0] != '/' {
		p = "/" + p
	}
	return path.Clean(p)
}

// serveRoute runs the matched handler (through the mux, which sets the path
// values). A panic in a handler or the herder becomes a JSON 500 instead of
// a dropped connection, and is logged with its stack.
func (s *server) serveRoute(w *statusRecorder, r *http.Request) {
	defer func() {
		p := recover()
		if p == nil || p == http.ErrAbortHandler {
			if p != nil {
				panic(p)
			}
			return
		}
		s.log.LogAttrs(r.Context(), slog.LevelError, "rest handler panicked",
			slog.String("method", r.Method), slog.String("path", r.URL.Path),
			slog.String("panic", scrub(fmt.Sprint(p))), slog.String("stack", string(debug.Stack())))
		if w.status == 0 {
			writeJSON(w, http.StatusInternalServerError, errorBody{ErrorCode: http.StatusInternalServerError,
				Message: "internal error while handling " + r.Method + " " + r.URL.Path + "; the server log has the details"})
		}
	}()
	s.mux.ServeHTTP(w, r)
}

// statusRecorder remembers the status for the access log.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// probeWriter captures what the mux's fallback handlers answer.
type probeWriter struct {
	header http.Header
	status int
}

func (p *probeWriter) Header() http.Header { return p.header }
func (p *probeWriter) Write(b []byte) (int, error) {
	if p.status == 0 {
		p.status = http.StatusOK
	}
	return len(b), nil
}
func (p *probeWriter) WriteHeader(code int) {
	if p.status == 0 {
		p.status = code
	}
}

// httpError is an error with a fixed status, made by the REST layer itself.
type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return e.msg }

func badRequest(msg string) error { return &httpError{status: http.StatusBadRequest, msg: msg} }

func notFound(msg string) error { return &httpError{status: http.StatusNotFound, msg: msg} }

// errorBody is Kafka Connect's ErrorMessage, plus remaining for a failed
// deletion.
type errorBody struct {
	ErrorCode int           `json:"error_code"`
	Message   string        `json:"message"`
	Remaining []resourceDTO `json:"remaining,omitempty"`
}

func (s *server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	body := errorBody{ErrorCode: http.StatusInternalServerError, Message: err.Error()}
	var (
		he   *httpError
		ce   *herder.ConfigError
		be   *herder.BadRequestError
		de   *herder.DeletionError
		mbe  *http.MaxBytesError
		conn = r.PathValue("c")
	)
	switch {
	case errors.As(err, &he):
		body.ErrorCode = he.status
	case errors.As(err, &de):
		body.ErrorCode = http.StatusInternalServerError
		body.Remaining = resourcesDTO(de.Remaining)
	case errors.As(err, &ce):
		body.ErrorCode = http.StatusBadRequest
		body.Message = configErrorMessage(ce)
	case errors.As(err, &be):
		body.ErrorCode = http.StatusBadRequest
	case errors.As(err, &mbe):
		body.ErrorCode = http.StatusRequestEntityTooLarge
		body.Message = "request body is larger than the limit of 8 MiB; send a smaller body"
	case errors.Is(err, herder.ErrNotFound):
		body.ErrorCode = http.StatusNotFound
		if err == herder.ErrNotFound && conn != "" {
			body.Message = "Connector " + conn + " not found"
		}
	case errors.Is(err, herder.ErrAlreadyExists):
		body.ErrorCode = http.StatusConflict
		if err == herder.ErrAlreadyExists && conn != "" {
			body.Message = "Connector " + conn + " already exists"
		}
	case errors.Is(err, herder.ErrRebalance):
		body.ErrorCode = http.StatusConflict
		if err == herder.ErrRebalance {
			body.Message = "Cannot complete request momentarily due to stale configuration (typically caused by a concurrent config change); retry the request"
		}
	case errors.Is(err, herder.ErrNotStopped):
		body.ErrorCode = http.StatusBadRequest
		if conn != "" {
			// Kafka Connect's sentence first (clients match it), then the
			// herder's detail when it has one (tasks that did not return).
			msg := "Connectors must be in the STOPPED state before their offsets can be modified. This can be done for the specified connector by issuing a 'PUT' request to the '/connectors/" + conn + "/stop' endpoint"
			if err != herder.ErrNotStopped && strings.Contains(err.Error(), "did not return") {
				msg += "; " + err.Error()
			}
			body.Message = msg
		}
	case errors.Is(err, context.DeadlineExceeded):
		body.ErrorCode = http.StatusInternalServerError
		body.Message = "Request timed out: " + err.Error()
	}
	body.Message = scrub(body.Message)
	// A client that went away is no server error.
	if body.ErrorCode >= 500 && r.Context().Err() == nil {
		attrs := []slog.Attr{
			slog.String("method", r.Method), slog.String("path", r.URL.Path),
			slog.Int("status", body.ErrorCode), slog.String("error", body.Message),
		}
		if conn != "" {
			attrs = append(attrs, slog.String("connector", conn))
		}
		s.log.LogAttrs(r.Context(), slog.LevelError, "rest request failed", attrs...)
	}
	writeJSON(w, body.ErrorCode, body)
}
