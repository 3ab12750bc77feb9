package store

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

// Get must find what Put stored for the very partition map a task gives
// (the worker hands the task's map to both). Put keyed the partition by
// its normalized form (the shape it has after a JSON round trip) and Get
// by its raw encoding, so a partition whose encoding changes in that round
// trip (a struct value, whose fields are not sorted; a uint64 above
// MaxInt64; a json.Number such as 1.0) was never found again: the task
// restarted from the beginning after every commit, without a restart.
func TestGetFindsWhatPutStored(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	f := openT(t, dir)
	if err := f.PutConnector(ctx, ConnectorRecord{Name: "c", Config: connect.Config{"a": "1"}}); err != nil {
		t.Fatal(err)
	}
	type pos struct{ Slot, File int } // encodes as {"Slot":..,"File":..}
	parts := map[string]map[string]any{
		"struct":    {"pos": pos{Slot: 1, File: 2}},
		"uint64":    {"lsn": uint64(1 << 63)},
		"number":    {"n": json.Number("1.0")},
		"int32":     {"n": int32(7)},
		"strings":   {"tables": []string{"b", "a"}},
		"plain map": {"table": "t", "n": 3},
	}
	for name, p := range parts {
		off := map[string]any{"id": int64(42)}
		if err := f.Put(ctx, "c", []worker.SourceOffset{{Partition: p, Offset: off}}); err != nil {
			t.Fatalf("%s: Put: %v", name, err)
		}
		got, err := f.Get(ctx, "c", p)
		if err != nil || got["id"] != int64(42) {
			t.Errorf("%s: Get(%v) after Put = %v, %v; want the stored offset", name, p, got, err)
		}
	}
	f = reopen(t, f, dir)
	for name, p := range parts {
		got, err := f.Get(ctx, "c", p)
		if err != nil || got["id"] != int64(42) {
			t.Errorf("%s: Get(%v) after a restart = %v, %v; want the stored offset", name, p, got, err)
		}
	}
}

// Several tasks of one connector commit their offsets at once (each its
// own partitions, merged into one file): every task's last offset
// survives a restart, none is lost to another task's rewrite of the file.
func TestConcurrentOffsetCommitsSurviveRestart(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	f := openT(t, dir)
	if err := f.PutConnector(ctx, ConnectorRecord{Name: "c", Config: connect.Config{"a": "1"}}); err != nil {
		t.Fatal(err)
	}
	const tasks, commits = 4, 20
	var wg sync.WaitGroup
	for task := range tasks {
		wg.Go(func() {
			for i := 1; i <= commits; i++ {
				batch := []worker.SourceOffset{
					{Partition: map[string]any{"task": task, "p": "a"}, Offset: map[string]any{"n": i}},
					{Partition: map[string]any{"task": task, "p": "b"}, Offset: map[string]any{"n": i * 10}},
				}
				if err := f.Put(ctx, "c", batch); err != nil {
					t.Errorf("task %d: Put: %v", task, err)
					return
				}
				if _, err := f.Get(ctx, "c", batch[0].Partition); err != nil {
					t.Errorf("task %d: Get: %v", task, err)
					return
				}
			}
		})
	}
	wg.Wait()
	f = reopen(t, f, dir)
	for task := range tasks {
		for p, want := range map[string]int64{"a": commits, "b": commits * 10} {
			got, err := f.Get(ctx, "c", map[string]any{"task": task, "p": p})
			if err != nil || got["n"] != want {
				t.Errorf("task %d partition %s after a restart: %v, %v; want n=%d", task, p, got, err, want)
			}
		}
	}
}

// A state file cut short (an interrupted copy of the data directory, a
// full disk under a tool that wrote it in place) never starts the worker
// empty, which would forget the connector, its offsets or a pending
// deletion: the start stops with an error naming the file.
func TestTruncatedStateFileStopsTheStart(t *testing.T) {
	ctx := context.Background()
	for _, name := range []string{configFile, offsetsFile, ledgerFile, topicsFile, deletionFile} {
		for _, cut := range []string{"empty", "half"} {
			t.Run(name+"/"+cut, func(t *testing.T) {
				dir := t.TempDir()
				f := openT(t, dir)
				if err := f.PutConnector(ctx, ConnectorRecord{Name: "c", Config: connect.Config{"a": "1"}}); err != nil {
					t.Fatal(err)
				}
				if err := f.Put(ctx, "c", []worker.SourceOffset{{Partition: map[string]any{"p": 1}, Offset: map[string]any{"o": 2}}}); err != nil {
					t.Fatal(err)
				}
				if err := f.Ledger("c").Own(ctx, connect.Resource{Kind: "k", Name: "n"}); err != nil {
					t.Fatal(err)
				}
				if err := f.AddTopics(ctx, "c", []string{"t"}); err != nil {
					t.Fatal(err)
				}
				if err := f.PutIntent(ctx, DeletionIntent{Connector: "c", Config: connect.Config{"a": "1"}, Phase: PhaseStoppingTasks}); err != nil {
					t.Fatal(err)
				}
				if err := f.Close(); err != nil {
					t.Fatal(err)
				}
				p := filepath.Join(dir, "connectors", "c", name)
				data, err := os.ReadFile(p)
				if err != nil {
					t.Fatal(err)
				}
				if cut == "empty" {
					data = nil
				} else {
					data = data[:len(data)/2]
				}
				if err := os.WriteFile(p, data, 0o600); err != nil {
					t.Fatal(err)
				}
				g, err := OpenFile(dir)
				if err == nil {
					g.Close()
					t.Fatalf("OpenFile with %s %s: no error; want the start refused", cut, name)
				}
				if !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "corrupt") {
					t.Errorf("error %q does not name %s as corrupt", err, p)
				}
			})
		}
	}
}
