package sampleconn

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

type mapOffsets map[string]map[string]any

func (m mapOffsets) Offset(_ context.Context, p map[string]any) (map[string]any, error) {
	return m[p["task"].(string)+"/"+p["partition"].(string)], nil
}

func hostCtx(t *testing.T, name string, task int, l connect.Ledger, offs connect.OffsetReader) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return connect.WithHost(ctx, &connect.Host{Connector: name, Task: task, Logger: slog.New(slog.DiscardHandler), Ledger: l, Offsets: offs})
}

func TestSourceLifecycleAndResources(t *testing.T) {
	tests := []struct {
		name        string
		deleted     bool
		wantDropped bool
	}{
		{"plain stop keeps resources", false, false},
		{"deletion drops resources", true, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := NewRecorder()
			p := Plugins(rec)[0]
			ledger := connect.NewMemoryLedger()
			cfg := connect.Config{"name": "src", KeyTopic: "t", KeyCount: "5", KeyBatch: "2", KeyResources: "a,b"}
			pre := rec.CreateResource("task/src/0/b") // existed before: never owned

			c := p.NewConnector()
			if err := c.Start(hostCtx(t, "src", -1, ledger, nil), cfg); err != nil {
				t.Fatal(err)
			}
			tcs, err := c.TaskConfigs(1)
			if err != nil || len(tcs) != 1 {
				t.Fatalf("TaskConfigs: %v %v", tcs, err)
			}
			task := p.NewTask().(*SourceTask)
			offs := mapOffsets{"0/0": {"position": float64(1)}} // continue after position 1
			ctx := hostCtx(t, "src", 0, ledger, offs)
			if err := task.Start(ctx, tcs[0]); err != nil {
				t.Fatal(err)
			}
			var got []int64
			for len(got) < 3 {
				recs, err := task.Poll(ctx)
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range recs {
					pos, _ := Position(r.SourceOffset)
					got = append(got, pos)
				}
				if err := task.Commit(ctx, recs); err != nil {
					t.Fatal(err)
				}
			}
			if !slices.Equal(got, []int64{2, 3, 4}) {
				t.Errorf("positions after restoring offset 1 with count 5: got %v, want [2 3 4]", got)
			}
			// Everything emitted: Poll blocks until its context ends.
			short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
			if _, err := task.Poll(short); err == nil {
				t.Error("Poll after the last record returned no error on a cancelled context")
			}
			cancel()

			owned, _ := ledger.List(ctx)
			if len(owned) != 3 { // connector a, b; task a (task b pre-existed)
				t.Fatalf("owned %v, want 3 resources", owned)
			}
			task.Stop(tc.deleted)
			task.Stop(tc.deleted)
			if err := task.Stopped(ctx); err != nil {
				t.Fatal(err)
			}
			c.Stop(tc.deleted)
			if err := c.Stopped(hostCtx(t, "src", -1, ledger, nil)); err != nil {
				t.Fatal(err)
			}
			left := rec.Resources()
			if tc.wantDropped {
				if !slices.Equal(left, []connect.Resource{pre}) {
					t.Errorf("after deletion resources %v, want only the pre-existing %v", left, pre)
				}
				if owned, _ := ledger.List(ctx); len(owned) != 0 {
					t.Errorf("ledger after deletion: %v", owned)
				}
			} else if len(left) != 4 {
				t.Errorf("after a plain stop resources %v, want all 4", left)
			}
			want := []string{"Start", "Poll(2)", "Commit(2)", "Poll(1)", "Commit(1)", "Stop(" + map[bool]string{true: "true", false: "false"}[tc.deleted] + ")"}
			calls := rec.CallsOf(TaskInstance("src", 0))
			if !slices.Equal(calls[:len(want)], want) || calls[len(calls)-1] != "Stopped" {
				t.Errorf("task calls %v", calls)
			}
			if n := rec.Count("task/src/0 Stopped"); n != 1 {
				t.Errorf("Stopped recorded %d times", n)
			}
			if rec.Index("task/src/0 Stopped") > rec.Index("connector/src Stop(true)") && tc.deleted {
				t.Error("task Stopped recorded after the connector's Stop")
			}
			if len(rec.Committed("src")) != 3 {
				t.Errorf("committed %d records, want 3", len(rec.Committed("src")))
			}
		})
	}
}

func TestSinkFlushAndKnobs(t *testing.T) {
	rec := NewRecorder()
	p := Plugins(rec)[1]
	ledger := connect.NewMemoryLedger()
	task := p.NewTask().(*SinkTask)
	ctx := hostCtx(t, "snk", 0, ledger, nil)
	if err := task.Start(ctx, connect.Config{KeyFlushUpTo: "2", KeyFailAfter: "3"}); err != nil {
		t.Fatal(err)
	}
	recs := []connect.SinkRecord{{Topic: "t", Offset: 0}, {Topic: "t", Offset: 1}, {Topic: "t", Offset: 2}}
	if err := task.Put(ctx, recs); err != nil {
		t.Fatal(err)
	}
	offs, _ := task.Flush(ctx)
	if offs[connect.TopicPartition{Topic: "t"}] != 2 {
		t.Errorf("Flush = %v, want t/0 -> 2 (limited by %s)", offs, KeyFlushUpTo)
	}
	if err := task.Put(ctx, recs[:1]); err == nil {
		t.Error("Put after 3 records with fail.after=3 did not fail")
	}

	blocked := p.NewTask().(*SinkTask)
	bctx, cancel := context.WithCancel(hostCtx(t, "snk", 1, ledger, nil))
	if err := blocked.Start(bctx, connect.Config{KeyBlock: BlockIgnoreCtx}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() { done <- blocked.Put(bctx, recs) }()
	if err := rec.AwaitCall(ctx, "task/snk/1 Put blocking", 1); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case <-done:
		t.Fatal("ignore-ctx Put returned on cancel")
	case <-time.After(20 * time.Millisecond):
	}
	rec.ReleaseBlocked()
	if err := <-done; err == nil {
		t.Error("released Put on a cancelled context returned nil")
	}
}

func TestConfigDefValidation(t *testing.T) {
	errs := SourceConfigDef().Validate(connect.Config{KeyBatch: "0", KeyBlock: "sometimes", KeyCount: "x"})
	for _, k := range []string{KeyTopic, KeyBatch, KeyBlock, KeyCount} {
		if len(errs[k]) == 0 {
			t.Errorf("no error for %s in %v", k, errs)
		}
	}
	rec := NewRecorder()
	c := Plugins(rec)[0].NewConnector()
	err := c.Start(hostCtx(t, "bad", -1, connect.NewMemoryLedger(), nil), connect.Config{KeyFailStart: "true", KeyTopic: "t"})
	if err == nil {
		t.Fatal("Start with sample.fail.start=true succeeded")
	}
	if got := rec.Calls(); len(got) != 1 || got[0].Err == "" {
		t.Errorf("calls %v", got)
	}
}
