package amqpsink

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestNullValues: a record with a null value (a tombstone, as pgaudit's
// tombstones.on.delete sends after a delete) between two ordinary ones,
// under each behavior.on.null.values: publish sends a message with an
// empty body and the record's key header; ignore sends nothing; fail
// reports it under errors.tolerance (tolerated: to the error handler;
// none: the task fails naming the key). Where the task goes on, Flush's
// offset passes all three records.
func TestNullValues(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	b := newBroker(t, u)
	for _, tc := range []struct {
		behavior  string // "" for the default
		tolerate  bool
		delivered []string // message ids
		reported  string
		fails     bool
	}{
		{behavior: "", delivered: []string{"nv-0-0", "nv-0-1", "nv-0-2"}, reported: "[]"},
		{behavior: nullPublish, delivered: []string{"nv-0-0", "nv-0-1", "nv-0-2"}, reported: "[]"},
		{behavior: nullIgnore, delivered: []string{"nv-0-0", "nv-0-2"}, reported: "[]"},
		{behavior: "IGNORE", delivered: []string{"nv-0-0", "nv-0-2"}, reported: "[]"},
		{behavior: nullFail, tolerate: true, delivered: []string{"nv-0-0", "nv-0-2"}, reported: "[1]"},
		{behavior: nullFail, fails: true},
	} {
		t.Run(fmt.Sprintf("%s tolerate=%v", tc.behavior, tc.tolerate), func(t *testing.T) {
			cfg := baseConfig(t, u, "nv")
			if tc.behavior != "" {
				cfg[KeyNullValues] = tc.behavior
			}
			name := cfg["name"]
			q := name + ".nv"
			cleanupByName(t, b, name, q)
			rep := &reporter{tolerate: tc.tolerate}
			s := startSink(t, cfg, connect.NewMemoryLedger(), rep)
			defer func() { _ = s.stop(true) }()

			tomb := rec("nv", 0, 1, "k1", "")
			tomb.Value = nil
			recs := []connect.SinkRecord{rec("nv", 0, 0, "k0", "v0"), tomb, rec("nv", 0, 2, "k2", "v2")}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := s.task.Put(ctx, recs)
			if err == nil {
				var offs map[connect.TopicPartition]int64
				offs, err = s.task.Flush(ctx)
				if err == nil {
					if o := offs[connect.TopicPartition{Topic: "nv", Partition: 0}]; o != 3 {
						t.Errorf("flushed offset %d, want 3", o)
					}
				}
			}
			if tc.fails {
				if err == nil || !strings.Contains(err.Error(), KeyNullValues) {
					t.Fatalf("Put/Flush: %v; want the task to fail naming %s", err, KeyNullValues)
				}
				return
			}
			if err != nil {
				t.Fatalf("Put/Flush: %v", err)
			}
			var reported []int64
			for _, r := range rep.got() {
				reported = append(reported, r.rec.Offset)
			}
			if fmt.Sprint(reported) != tc.reported {
				t.Errorf("reported offsets %v, want %s", reported, tc.reported)
			}
			// Every message was confirmed before Flush returned: the queue
			// holds exactly what was published.
			if n := b.messages(q); n != len(tc.delivered) {
				t.Errorf("%d messages in the queue, want %d", n, len(tc.delivered))
			}
			got := map[string]string{}
			for _, d := range b.drainDistinct(q, len(tc.delivered)) {
				got[d.MessageId] = fmt.Sprintf("%q key %s", d.Body, d.Headers[HeaderKey])
			}
			if len(got) != len(tc.delivered) {
				t.Errorf("delivered %v, want exactly %v", got, tc.delivered)
			}
			for _, id := range tc.delivered {
				if _, ok := got[id]; !ok {
					t.Errorf("delivered %v, want %s among them", got, id)
				}
			}
			if body, ok := got["nv-0-1"]; ok && body != `"" key k1` {
				t.Errorf("the null value's message: %s, want an empty body with key k1", body)
			}
		})
	}
}

// failingReporter tolerates every record but cannot report any (a
// dead-letter topic that cannot be written).
type failingReporter struct{}

func (failingReporter) Report(context.Context, connect.SinkRecord, error) error {
	return errors.New("dead-letter topic unreachable")
}

// TestFailedReportIsNamedAsSuch: when the error handler tolerates a record
// but its report fails, the task's error says so, and does not advise
// errors.tolerance=all (which is already set); a refusal under none keeps
// that advice.
func TestFailedReportIsNamedAsSuch(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	b := newBroker(t, u)
	for _, tc := range []struct {
		errs        connect.ErrantRecordReporter
		want, avoid string
	}{
		{failingReporter{}, "reporting it to the error handler failed: dead-letter topic unreachable", "set errors.tolerance=all"},
		{&reporter{}, "set errors.tolerance=all", "reporting it to the error handler failed"},
	} {
		cfg := baseConfig(t, u, "rf")
		cfg[KeyNullValues] = nullFail
		cleanupByName(t, b, cfg["name"], cfg["name"]+".rf")
		s := startSink(t, cfg, connect.NewMemoryLedger(), tc.errs)
		tomb := rec("rf", 0, 0, "k", "")
		tomb.Value = nil
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := s.task.Put(ctx, []connect.SinkRecord{tomb})
		cancel()
		_ = s.stop(true)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), tc.avoid) {
			t.Errorf("Put: %v; want an error saying %q and not %q", err, tc.want, tc.avoid)
		}
	}
}
