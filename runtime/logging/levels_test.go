package logging

import (
	"bytes"
	"errors"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// newTestLogger logs through l into a buffer, with a base handler that lets
// every level through.
func newTestLogger(l *Levels) (*slog.Logger, *bytes.Buffer) {
	var buf bytes.Buffer
	base := slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: Lowest})
	return slog.New(l.Handler(base)), &buf
}

func TestConnectorLevelsApplyToTheirConnectorOnly(t *testing.T) {
	l := NewLevels(slog.LevelInfo)
	root, buf := newTestLogger(l)
	orders := root.With(ConnectorKey, "orders").With("task", 0)
	payments := root.With(ConnectorKey, "payments")
	nested := root.WithGroup("g").With(ConnectorKey, "orders") // not the connector attribute

	if _, err := l.SetLevel("orders", "debug"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		log  *slog.Logger
		msg  string
		lvl  slog.Level
		kept bool
	}{
		{orders, "orders-debug", slog.LevelDebug, true},
		{orders, "orders-trace", slog.LevelDebug - 4, false},
		{payments, "payments-debug", slog.LevelDebug, false},
		{payments, "payments-info", slog.LevelInfo, true},
		{root, "root-debug", slog.LevelDebug, false},
		{nested, "nested-debug", slog.LevelDebug, false},
	} {
		tc.log.Log(t.Context(), tc.lvl, tc.msg)
		if got := strings.Contains(buf.String(), "msg="+tc.msg); got != tc.kept {
			t.Errorf("%s: logged %v, want %v", tc.msg, got, tc.kept)
		}
	}

	// Root set to WARN also sets every connector's level, as in Kafka.
	changed, err := l.SetLevel("ROOT", "warn")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"orders", "root"}; !slices.Equal(changed, want) {
		t.Errorf("SetLevel(root) changed %v, want %v", changed, want)
	}
	orders.Info("orders-info-after-root")
	payments.Warn("payments-warn-after-root")
	if strings.Contains(buf.String(), "orders-info-after-root") || !strings.Contains(buf.String(), "payments-warn-after-root") {
		t.Errorf("after root=WARN:\n%s", buf.String())
	}

	if _, err := l.SetLevel("payments", "OFF"); err != nil {
		t.Fatal(err)
	}
	payments.Error("payments-error-when-off")
	if strings.Contains(buf.String(), "payments-error-when-off") {
		t.Error("OFF let an ERROR through")
	}
}

func TestSetLevelNamesAndErrors(t *testing.T) {
	for _, tc := range []struct {
		level, want string
		bad         bool
	}{
		{level: "debug", want: "DEBUG"},
		{level: " Info ", want: "INFO"},
		{level: "TRACE", want: "TRACE"},
		{level: "fatal", want: "FATAL"},
		{level: "off", want: "OFF"},
		{level: "verbose", bad: true},
		{level: "", bad: true},
	} {
		l := NewLevels(slog.LevelInfo)
		changed, err := l.SetLevel("c", tc.level)
		var unknown *ErrUnknownLevel
		if tc.bad {
			if !errors.As(err, &unknown) || !strings.Contains(err.Error(), "invalid log level") {
				t.Errorf("SetLevel(%q) = %v, want an invalid log level error", tc.level, err)
			}
			if _, ok := l.Logger("c"); ok {
				t.Errorf("SetLevel(%q) failed but set the level", tc.level)
			}
			continue
		}
		if err != nil || !slices.Equal(changed, []string{"c"}) {
			t.Errorf("SetLevel(%q) = %v, %v", tc.level, changed, err)
		}
		got, ok := l.Logger("c")
		if !ok || got.Level != tc.want || got.LastModified.IsZero() {
			t.Errorf("after SetLevel(%q): Logger = %+v, %v; want level %s with a modification time", tc.level, got, ok, tc.want)
		}
	}
}

func TestLoggersListsRootAndSetConnectors(t *testing.T) {
	l := NewLevels(slog.LevelWarn)
	if got := l.Loggers(); len(got) != 1 || got[Root].Level != "WARN" || !got[Root].LastModified.IsZero() {
		t.Errorf("initial Loggers = %+v, want only root at WARN, never modified", got)
	}
	if _, ok := l.Logger("absent"); ok {
		t.Error("a connector without a level of its own was reported as set")
	}
	if _, err := l.SetLevel("a", "DEBUG"); err != nil {
		t.Fatal(err)
	}
	got := l.Loggers()
	if len(got) != 2 || got["a"].Level != "DEBUG" || got[Root].Level != "WARN" {
		t.Errorf("Loggers = %+v", got)
	}
}

func TestName(t *testing.T) {
	for lvl, want := range map[slog.Level]string{
		slog.LevelDebug - 4: "TRACE", slog.LevelDebug: "DEBUG", slog.LevelInfo: "INFO",
		slog.LevelWarn: "WARN", slog.LevelError: "ERROR", levels["OFF"]: "OFF",
	} {
		if got := Name(lvl); got != want {
			t.Errorf("Name(%v) = %s, want %s", lvl, got, want)
		}
	}
}

// Setting a logger to the level it already has is no modification: its
// last_modified stays (KIP-976; Kafka skips the update). Root sets every
// connector's level, and only those whose level changes get a new time.
func TestSetLevelKeepsLastModifiedWhenUnchanged(t *testing.T) {
	for _, tc := range []struct {
		name           string
		first, again   string // loggers set to DEBUG, then again
		logger         string // whose last_modified is checked
		wantSameAsLast bool
	}{
		{name: "connector set twice", first: "conn-same-a", again: "conn-same-a", logger: "conn-same-a", wantSameAsLast: true},
		{name: "root set twice", first: Root, again: Root, logger: Root, wantSameAsLast: true},
		{name: "root over a connector at that level", first: "conn-same-b", again: Root, logger: "conn-same-b", wantSameAsLast: true},
		{name: "root over a connector at another level", first: "conn-other", again: Root, logger: "conn-other"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLevels(slog.LevelInfo)
			if _, err := l.SetLevel(tc.first, "DEBUG"); err != nil {
				t.Fatal(err)
			}
			if !tc.wantSameAsLast {
				if _, err := l.SetLevel(tc.logger, "WARN"); err != nil {
					t.Fatal(err)
				}
			}
			before, _ := l.Logger(tc.logger)
			// Await a clock that has moved on, so a new time is told apart.
			for !time.Now().After(before.LastModified) {
				runtime.Gosched()
			}
			// DEBUG again, in another case.
			if _, err := l.SetLevel(tc.again, "debug"); err != nil {
				t.Fatal(err)
			}
			after, ok := l.Logger(tc.logger)
			if !ok || after.Level != "DEBUG" {
				t.Fatalf("after setting %s to DEBUG: %s = %+v, %v", tc.again, tc.logger, after, ok)
			}
			if same := after.LastModified.Equal(before.LastModified); same != tc.wantSameAsLast {
				t.Errorf("%s last_modified %v -> %v: unchanged %v, want %v", tc.logger, before.LastModified, after.LastModified, same, tc.wantSameAsLast)
			}
		})
	}
}
