package main

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
)

// The process logger starts at --log-level, follows /admin/loggers, and
// names the level below DEBUG TRACE in both formats.
func TestNewLoggerFollowsLevels(t *testing.T) {
	for _, format := range []string{"json", "text"} {
		t.Run(format, func(t *testing.T) {
			var buf bytes.Buffer
			log, levels := newLogger(&config{logLevel: "info", logFormat: format}, &buf)
			log.Debug("hidden-at-info")
			if _, err := levels.SetLevel("root", "TRACE"); err != nil {
				t.Fatal(err)
			}
			log.Log(context.Background(), slog.LevelDebug-4, "shown-at-trace")
			out := buf.String()
			if strings.Contains(out, "hidden-at-info") || !strings.Contains(out, "shown-at-trace") {
				t.Fatalf("log:\n%s", out)
			}
			want := `"level":"TRACE"`
			if format == "text" {
				want = "level=TRACE"
			}
			if !strings.Contains(out, want) {
				t.Errorf("the TRACE line lacks %s:\n%s", want, out)
			}
		})
	}
}
