package store

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

func openT(t *testing.T, dir string) *File {
	t.Helper()
	f, err := OpenFile(dir)
	if err != nil {
		t.Fatalf("OpenFile: %v", err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// reopen closes f and opens the same directory again, as a process restart
// does.
func reopen(t *testing.T, f *File, dir string) *File {
	t.Helper()
	if err := f.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	return openT(t, dir)
}

func TestPersistsAcrossReopen(t *testing.T) {
	ctx := context.Background()
	names := []string{"plain", "with space", "dots.in.name", ".hidden", "ünïcode", "a%2Fb", strings.Repeat("é", 120)}
	for _, name := range names {
		t.Run(name[:min(len(name), 20)], func(t *testing.T) {
			dir := t.TempDir()
			f := openT(t, dir)
			now := time.Now().UTC().Truncate(time.Second)
			rec := ConnectorRecord{
				Name: name, Config: connect.Config{"connector.class": "X", "k": "v"},
				Target: worker.TargetPaused, Tasks: []connect.Config{{"t": "0"}, {"t": "1"}},
				CreatedAt: now, UpdatedAt: now,
			}
			if err := f.PutConnector(ctx, rec); err != nil {
				t.Fatal(err)
			}
			part := map[string]any{"table": "t1", "n": 3}
			if err := f.Put(ctx, name, []worker.SourceOffset{{Partition: part, Offset: map[string]any{"id": 42}}}); err != nil {
				t.Fatal(err)
			}
			res := connect.Resource{Kind: "k", Name: "n", Location: "l"}
			if err := f.Ledger(name).Own(ctx, res); err != nil {
				t.Fatal(err)
			}
			if err := f.AddTopics(ctx, name, []string{"b", "a", "b"}); err != nil {
				t.Fatal(err)
			}
			in := DeletionIntent{Connector: name, Config: rec.Config, Phase: PhasePending, Attempts: 1, StartedAt: now, UpdatedAt: now}
			if err := f.PutIntent(ctx, in); err != nil {
				t.Fatal(err)
			}

			f = reopen(t, f, dir)

			got, ok, err := f.Connector(ctx, name)
			if err != nil || !ok {
				t.Fatalf("Connector after reopen: ok=%v err=%v", ok, err)
			}
			if !reflect.DeepEqual(got, rec) {
				t.Errorf("record after reopen = %+v, want %+v", got, rec)
			}
			// The partition is found whatever its key order and number type.
			off, err := f.Get(ctx, name, map[string]any{"n": float64(3), "table": "t1"})
			if err != nil || off["id"] != int64(42) {
				t.Errorf("offset after reopen = %v, %v; want id 42", off, err)
			}
			led, _ := f.Ledger(name).List(ctx)
			if !reflect.DeepEqual(led, []connect.Resource{res}) {
				t.Errorf("ledger after reopen = %v", led)
			}
			tops, _ := f.Topics(ctx, name)
			if !reflect.DeepEqual(tops, []string{"a", "b"}) {
				t.Errorf("topics after reopen = %v", tops)
			}
			gotIn, ok, _ := f.Intent(ctx, name)
			if !ok || !reflect.DeepEqual(gotIn, in) {
				t.Errorf("intent after reopen = %+v (ok %v), want %+v", gotIn, ok, in)
			}

			// Forgetting everything removes the connector's directory.
			for _, step := range []func() error{
				func() error { return f.DeleteOffsets(ctx, name) },
				func() error { return f.DeleteLedger(ctx, name) },
				func() error { return f.ResetTopics(ctx, name) },
				func() error { return f.DeleteConnector(ctx, name) },
				func() error { return f.DeleteIntent(ctx, name) },
			} {
				if err := step(); err != nil {
					t.Fatal(err)
				}
			}
			entries, _ := os.ReadDir(filepath.Join(dir, "connectors"))
			if len(entries) != 0 {
				t.Errorf("connectors dir still holds %v after forgetting everything", entries)
			}
			f = reopen(t, f, dir)
			if recs, _ := f.Connectors(ctx); len(recs) != 0 {
				t.Errorf("Connectors after forget and reopen = %v", recs)
			}
		})
	}
}

func TestLeftoverTempFileIgnored(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	f := openT(t, dir)
	rec := ConnectorRecord{Name: "c", Config: connect.Config{"a": "1"}, Target: worker.TargetRunning}
	if err := f.PutConnector(ctx, rec); err != nil {
		t.Fatal(err)
	}
	cdir := filepath.Join(dir, "connectors", "c")
	// A crash after writing a temp file but before the rename leaves a
	// half-written file next to the real one.
	tmp := filepath.Join(cdir, "."+configFile+tmpMarker+"123")
	if err := os.WriteFile(tmp, []byte(`{"name":"c","config":{"a":"2"`), 0o644); err != nil {
		t.Fatal(err)
	}
	f = reopen(t, f, dir)
	got, ok, err := f.Connector(ctx, "c")
	if err != nil || !ok || got.Config["a"] != "1" {
		t.Fatalf("after a crash mid-write: %+v ok=%v err=%v; want the old config a=1", got, ok, err)
	}
	if _, err := os.Stat(tmp); !os.IsNotExist(err) {
		t.Errorf("leftover temp file was not removed: %v", err)
	}
}

func TestCorruptFileIsAClearError(t *testing.T) {
	dir := t.TempDir()
	cdir := filepath.Join(dir, "connectors", "c")
	if err := os.MkdirAll(cdir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cdir, configFile), []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := OpenFile(dir)
	if err == nil || !strings.Contains(err.Error(), "corrupt") || !strings.Contains(err.Error(), configFile) {
		t.Fatalf("OpenFile on a corrupt file: %v; want an error naming the file", err)
	}
}

func TestDataDirLocked(t *testing.T) {
	dir := t.TempDir()
	f := openT(t, dir)
	if _, err := OpenFile(dir); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second OpenFile: %v; want in-use error", err)
	}
	f.Close()
	g, err := OpenFile(dir)
	if err != nil {
		t.Fatalf("OpenFile after Close: %v", err)
	}
	g.Close()
}

func TestOffsetsMergeAndTombstone(t *testing.T) {
	ctx := context.Background()
	f := openT(t, t.TempDir())
	if err := f.PutConnector(ctx, ConnectorRecord{Name: "c"}); err != nil {
		t.Fatal(err)
	}
	p1, p2 := map[string]any{"p": "1"}, map[string]any{"p": "2"}
	steps := []struct {
		name string
		put  []worker.SourceOffset
		want []worker.SourceOffset
	}{
		{"first", []worker.SourceOffset{{Partition: p1, Offset: map[string]any{"o": "a"}}},
			[]worker.SourceOffset{{Partition: p1, Offset: map[string]any{"o": "a"}}}},
		{"merge", []worker.SourceOffset{{Partition: p2, Offset: map[string]any{"o": "b"}}},
			[]worker.SourceOffset{{Partition: p1, Offset: map[string]any{"o": "a"}}, {Partition: p2, Offset: map[string]any{"o": "b"}}}},
		{"overwrite", []worker.SourceOffset{{Partition: p1, Offset: map[string]any{"o": "c"}}},
			[]worker.SourceOffset{{Partition: p1, Offset: map[string]any{"o": "c"}}, {Partition: p2, Offset: map[string]any{"o": "b"}}}},
		{"tombstone", []worker.SourceOffset{{Partition: p1, Offset: nil}},
			[]worker.SourceOffset{{Partition: p2, Offset: map[string]any{"o": "b"}}}},
	}
	for _, s := range steps {
		if err := f.Put(ctx, "c", s.put); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		got, _ := f.AllOffsets(ctx, "c")
		if !reflect.DeepEqual(got, s.want) {
			t.Errorf("%s: offsets = %v, want %v", s.name, got, s.want)
		}
	}
	var _ worker.OffsetStore = f
}

func TestLedgerDurableOnReturn(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	f := openT(t, dir)
	if err := f.PutConnector(ctx, ConnectorRecord{Name: "c"}); err != nil {
		t.Fatal(err)
	}
	l := f.Ledger("c")
	a := connect.Resource{Kind: "q", Name: "a", Location: "/"}
	b := connect.Resource{Kind: "q", Name: "b", Location: "/"}
	for _, r := range []connect.Resource{a, b, a} {
		if err := l.Own(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	// Read the file directly: what Own returned for must be on disk.
	var doc ledgerDoc
	if ok, err := readJSON(filepath.Join(dir, "connectors", "c"), ledgerFile, &doc); !ok || err != nil {
		t.Fatalf("ledger file: ok=%v err=%v", ok, err)
	}
	if !reflect.DeepEqual(doc.Resources, []connect.Resource{a, b}) {
		t.Errorf("ledger on disk = %v, want [a b] once each", doc.Resources)
	}
	if err := l.Release(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx, a); err != nil {
		t.Fatalf("second Release must be a no-op: %v", err)
	}
	f = reopen(t, f, dir)
	got, _ := f.Ledger("c").List(ctx)
	if !reflect.DeepEqual(got, []connect.Resource{b}) {
		t.Errorf("ledger after release and reopen = %v, want [b]", got)
	}
}

func TestEscapeNameDistinct(t *testing.T) {
	seen := map[string]string{}
	long1, long2 := strings.Repeat("x", 300)+"1", strings.Repeat("x", 300)+"2"
	for _, n := range []string{"a b", "a%20b", "a_b", ".", "..", "a.b", "a/b", "A", long1, long2, strings.Repeat("ü", 200)} {
		e := escapeName(n)
		if strings.ContainsAny(e, "/ ") || e == "." || e == ".." || strings.HasPrefix(e, ".") || len(e) > maxDirName {
			t.Errorf("escapeName(%q) = %q is not a safe directory name", n, e)
		}
		if prev, ok := seen[e]; ok {
			t.Errorf("escapeName(%q) = escapeName(%q) = %q", n, prev, e)
		}
		seen[e] = n
	}
}

// Whole numbers in source partitions and offsets come back exact, also past
// 2^53 (a UnixNano watermark, a large sequence value) and after a reopen:
// rounding them to float64 re-delivered or skipped records, and a partition
// holding one was not found again after a restart.
func TestOffsetsKeepWholeNumbersExact(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	f := openT(t, dir)
	if err := f.PutConnector(ctx, ConnectorRecord{Name: "c", Config: connect.Config{"connector.class": "X"}}); err != nil {
		t.Fatal(err)
	}
	const ts, shard int64 = 1700000000123456789, 9007199254740993
	part := map[string]any{"shard": shard, "table": "t"}
	off := map[string]any{"ts_ns": ts, "ratio": 0.5, "nested": map[string]any{"ids": []any{ts, 1}}}
	if err := f.Put(ctx, "c", []worker.SourceOffset{{Partition: part, Offset: off}}); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		got, err := f.Get(ctx, "c", part)
		if err != nil || got == nil {
			t.Fatalf("%s: offset of %v: %v, %v", when, part, got, err)
		}
		if got["ts_ns"] != ts || got["ratio"] != 0.5 {
			t.Errorf("%s: offset %v (%T), want ts_ns=%d exactly and ratio 0.5", when, got, got["ts_ns"], ts)
		}
		if ids := got["nested"].(map[string]any)["ids"].([]any); ids[0] != ts || ids[1] != int64(1) {
			t.Errorf("%s: nested %v, want [%d 1] as int64", when, ids, ts)
		}
	}
	check("before a reopen")
	f = reopen(t, f, dir)
	check("after a reopen")
	if err := f.Put(ctx, "c", []worker.SourceOffset{{Partition: part, Offset: map[string]any{"ts_ns": ts + 1}}}); err != nil {
		t.Fatal(err)
	}
	all, err := f.AllOffsets(ctx, "c")
	if err != nil || len(all) != 1 || all[0].Offset["ts_ns"] != ts+1 || all[0].Partition["shard"] != shard {
		t.Errorf("after another commit: %v (%v), want one entry with ts_ns=%d", all, err, ts+1)
	}
}

// A corrupt ledger says what removing it would cost.
func TestCorruptLedgerSaysWhatRemovingItCosts(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	f := openT(t, dir)
	if err := f.PutConnector(ctx, ConnectorRecord{Name: "c", Config: connect.Config{"connector.class": "X"}}); err != nil {
		t.Fatal(err)
	}
	if err := f.Ledger("c").Own(ctx, connect.Resource{Kind: "k", Name: "n"}); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	matches, _ := filepath.Glob(filepath.Join(dir, "connectors", "*", "ledger.json"))
	if len(matches) != 1 {
		t.Fatalf("ledger files: %v", matches)
	}
	if err := os.WriteFile(matches[0], []byte(`{"connector":"c","resources":[`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := OpenFile(dir)
	if err == nil || !strings.Contains(err.Error(), "ledger.json") || !strings.Contains(err.Error(), "drop those by hand") {
		t.Errorf("opening with a corrupt ledger: %v, want the file named and the cost of removing it", err)
	}
}
