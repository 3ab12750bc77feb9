package rest

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"github.com/tidyconnect/tidyconnect/runtime/logging"
)

// WithLogLevels serves Kafka Connect's /admin/loggers (KIP-495) over
// levels: "root" and one logger per connector name. Without it those paths
// answer 404.
func WithLogLevels(levels *logging.Levels) Option {
	return func(s *server) { s.levels = levels }
}

// healthDTO is KIP-1017's body of GET /health.
type healthDTO struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

// health answers 200 once the herder answers. The REST API opens only after
// the worker has started (Kafka's "starting" 503 cannot be seen); a herder
// that does not answer holds the request, which a probe's own timeout turns
// into "unhealthy".
func (s *server) health(w http.ResponseWriter, r *http.Request) error {
	if _, err := s.api.Connectors(r.Context()); err != nil {
		writeJSON(w, http.StatusInternalServerError, healthDTO{Status: "unhealthy", Message: "Worker is unable to handle requests: " + scrub(err.Error())})
		return nil
	}
	writeJSON(w, http.StatusOK, healthDTO{Status: "healthy", Message: "Worker has completed startup and is ready to handle requests."})
	return nil
}

// loggerDTO is one logger's level; last_modified is KIP-976's, in
// milliseconds, null for a level never set over REST.
type loggerDTO struct {
	Level        string `json:"level"`
	LastModified *int64 `json:"last_modified"`
}

func toLoggerDTO(l logging.Logger) loggerDTO {
	d := loggerDTO{Level: l.Level}
	if !l.LastModified.IsZero() {
		ms := l.LastModified.UnixMilli()
		d.LastModified = &ms
	}
	return d
}

func (s *server) requireLevels() error {
	if s.levels == nil {
		return notFound("log levels cannot be changed on this worker")
	}
	return nil
}

func (s *server) listLoggers(w http.ResponseWriter, _ *http.Request) error {
	if err := s.requireLevels(); err != nil {
		return err
	}
	out := map[string]loggerDTO{}
	for name, l := range s.levels.Loggers() {
		out[name] = toLoggerDTO(l)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// getLogger answers a logger's effective level: a connector without a
// level of its own logs at root's, if the connector exists.
func (s *server) getLogger(w http.ResponseWriter, r *http.Request) error {
	if err := s.requireLevels(); err != nil {
		return err
	}
	name := r.PathValue("logger")
	// Kafka answers a LoggerLevel here too: level and last_modified (KIP-976).
	if l, ok := s.levels.Logger(name); ok {
		writeJSON(w, http.StatusOK, toLoggerDTO(l))
		return nil
	}
	names, err := s.api.Connectors(r.Context())
	if err != nil {
		return err
	}
	for _, n := range names {
		if n == name {
			// Root's level, but never modified itself: last_modified null.
			root, _ := s.levels.Logger(logging.Root)
			writeJSON(w, http.StatusOK, toLoggerDTO(logging.Logger{Level: root.Level}))
			return nil
		}
	}
	return notFound("Logger " + name + " not found.")
}

// setLogger sets a logger's level and answers the names of the loggers it
// changed. scope=cluster is Kafka's asynchronous variant (204); with one
// worker it applies here, as scope=worker does.
func (s *server) setLogger(w http.ResponseWriter, r *http.Request) error {
	if err := s.requireLevels(); err != nil {
		return err
	}
	const want = `{"level": "DEBUG"} (one of OFF, FATAL, ERROR, WARN, INFO, DEBUG, TRACE)`
	body, err := readObject(r, want)
	if err != nil {
		return err
	}
	raw, ok := body["level"]
	if !ok || isNull(raw) {
		return badRequest("Desired 'level' parameter was not specified in request; send " + want)
	}
	var level string
	if err := json.Unmarshal(raw, &level); err != nil {
		return badRequest("field \"level\" must be a string, got " + jsonKind(raw) + "; send " + want)
	}
	changed, err := s.levels.SetLevel(r.PathValue("logger"), level)
	var unknown *logging.ErrUnknownLevel
	if errors.As(err, &unknown) {
		// Kafka answers 404 for a level it does not know.
		return notFound(err.Error())
	}
	if err != nil {
		return err
	}
	s.log.Info("log level changed", "logger", r.PathValue("logger"), "level", strings.ToUpper(strings.TrimSpace(level)), "loggers", changed)
	if strings.EqualFold(r.URL.Query().Get("scope"), "cluster") {
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	writeJSON(w, http.StatusOK, changed)
	return nil
}
