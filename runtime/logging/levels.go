// Package logging holds the log levels that Kafka Connect's /admin/loggers
// endpoints read and change while the worker runs: the root level and one
// level per connector, applied to what the connector and its tasks log.
//
// Loggers are named like Kafka's: "root" for everything, and otherwise the
// connector's name (Kafka Connect names Java classes; here a connector's
// records are told apart by the "connector" attribute its logger carries).
package logging

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Root is the name of the root logger, as in Kafka Connect.
const Root = "root"

// ConnectorKey is the attribute that names the connector a logger logs for;
// the worker adds it to every connector's and task's logger.
const ConnectorKey = "connector"

// Level names and their slog levels. TRACE is below DEBUG, as in log4j;
// OFF drops everything, FATAL is ERROR (nothing here logs above it).
var levels = map[string]slog.Level{
	"TRACE": slog.LevelDebug - 4,
	"ALL":   slog.LevelDebug - 4,
	"DEBUG": slog.LevelDebug,
	"INFO":  slog.LevelInfo,
	"WARN":  slog.LevelWarn,
	"ERROR": slog.LevelError,
	"FATAL": slog.LevelError,
	"OFF":   slog.LevelError + 1000,
}

// Lowest is the lowest level any logger can be set to: the handler that
// Handler wraps must let it through.
const Lowest = slog.LevelDebug - 4

// Logger is one logger's level: its name as set (upper case) and when
// SetLevel last changed it (zero for the level the worker started with).
type Logger struct {
	Level        string
	LastModified time.Time
}

type entry struct {
	Logger
	level slog.Level
}

type snapshot struct {
	root        entry
	byConnector map[string]entry
}

// Levels is safe for concurrent use. Enabled checks read an immutable
// snapshot, so logging takes no lock.
type Levels struct {
	mu  sync.Mutex // serialises SetLevel
	cur atomic.Pointer[snapshot]
}

// NewLevels starts with root at level (one of slog's) and no connector
// levels.
func NewLevels(root slog.Level) *Levels {
	l := &Levels{}
	l.cur.Store(&snapshot{root: entry{Logger: Logger{Level: Name(root)}, level: root}, byConnector: map[string]entry{}})
	return l
}

// Name is the Kafka (log4j) name of an slog level.
func Name(l slog.Level) string {
	switch {
	case l < slog.LevelDebug:
		return "TRACE"
	case l < slog.LevelInfo:
		return "DEBUG"
	case l < slog.LevelWarn:
		return "INFO"
	case l < slog.LevelError:
		return "WARN"
	case l < levels["OFF"]:
		return "ERROR"
	}
	return "OFF"
}

// Loggers lists root and every connector whose level was set.
func (l *Levels) Loggers() map[string]Logger {
	s := l.cur.Load()
	out := map[string]Logger{Root: s.root.Logger}
	for name, e := range s.byConnector {
		out[name] = e.Logger
	}
	return out
}

// Logger returns the level of one logger: root, or a connector's own level.
// ok is false for a connector without a level of its own.
func (l *Levels) Logger(name string) (lg Logger, ok bool) {
	s := l.cur.Load()
	if strings.EqualFold(name, Root) {
		return s.root.Logger, true
	}
	e, ok := s.byConnector[name]
	return e.Logger, ok
}

// ErrUnknownLevel is returned by SetLevel for a level name it does not know.
type ErrUnknownLevel struct{ Level string }

func (e *ErrUnknownLevel) Error() string {
	return fmt.Sprintf("invalid log level '%s'; use one of OFF, FATAL, ERROR, WARN, INFO, DEBUG, TRACE", e.Level)
}

// SetLevel sets a logger's level and returns the names of the loggers it
// changed, sorted. Setting root sets every connector's level too, as
// Kafka sets every logger below the root.
func (l *Levels) SetLevel(name, level string) ([]string, error) {
	upper := strings.ToUpper(strings.TrimSpace(level))
	lv, ok := levels[upper]
	if !ok {
		return nil, &ErrUnknownLevel{Level: level}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	old := l.cur.Load()
	now := time.Now()
	// A logger already at the level keeps its last_modified, as in Kafka
	// (KIP-976): only a change of level is a modification.
	set := func(prev entry, had bool) entry {
		if had && prev.Level == upper {
			return prev
		}
		return entry{Logger: Logger{Level: upper, LastModified: now}, level: lv}
	}
	next := &snapshot{root: old.root, byConnector: maps.Clone(old.byConnector)}
	var changed []string
	if strings.EqualFold(name, Root) {
		next.root = set(old.root, true)
		changed = append(changed, Root)
		for c, prev := range next.byConnector {
			next.byConnector[c] = set(prev, true)
			changed = append(changed, c)
		}
	} else {
		prev, had := next.byConnector[name]
		next.byConnector[name] = set(prev, had)
		changed = append(changed, name)
	}
	l.cur.Store(next)
	slices.Sort(changed)
	return changed, nil
}

func (l *Levels) enabled(connector string, level slog.Level) bool {
	s := l.cur.Load()
	if connector != "" {
		if e, ok := s.byConnector[connector]; ok {
			return level >= e.level
		}
	}
	return level >= s.root.level
}

// Handler wraps base (which must let Lowest through) so that each record is
// kept or dropped by the level of its connector, or root's.
func (l *Levels) Handler(base slog.Handler) slog.Handler {
	return &handler{levels: l, base: base}
}

type handler struct {
	levels    *Levels
	base      slog.Handler
	connector string // from WithAttrs, outside any group
	grouped   bool
}

func (h *handler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.levels.enabled(h.connector, level) && h.base.Enabled(ctx, level)
}

func (h *handler) Handle(ctx context.Context, r slog.Record) error {
	return h.base.Handle(ctx, r)
}

func (h *handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	next := *h
	next.base = h.base.WithAttrs(attrs)
	if !h.grouped {
		for _, a := range attrs {
			if a.Key == ConnectorKey {
				next.connector = a.Value.Resolve().String()
			}
		}
	}
	return &next
}

func (h *handler) WithGroup(name string) slog.Handler {
	next := *h
	next.base = h.base.WithGroup(name)
	next.grouped = next.grouped || name != ""
	return &next
}
