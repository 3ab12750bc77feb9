package store

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

// TestOwnNeverRecreatesAForgottenConnector: a late Ledger.Own or offset
// commit (a task that outlived its connector's deletion) is refused instead
// of recreating the connector's directory with an orphan ledger.
func TestOwnNeverRecreatesAForgottenConnector(t *testing.T) {
	res := connect.Resource{Kind: "q", Name: "late", Location: "/"}
	tests := []struct {
		name    string
		setup   func(ctx context.Context, f *File, name string) error
		wantErr bool
	}{
		{"never stored", func(context.Context, *File, string) error { return nil }, true},
		{"config stored", func(ctx context.Context, f *File, name string) error {
			return f.PutConnector(ctx, ConnectorRecord{Name: name})
		}, false},
		{"being deleted, config still stored", func(ctx context.Context, f *File, name string) error {
			if err := f.PutConnector(ctx, ConnectorRecord{Name: name}); err != nil {
				return err
			}
			return f.PutIntent(ctx, DeletionIntent{Connector: name, Phase: PhaseCleanupFailed})
		}, false},
		{"config forgotten, intent left (forgetting)", func(ctx context.Context, f *File, name string) error {
			if err := f.PutConnector(ctx, ConnectorRecord{Name: name}); err != nil {
				return err
			}
			if err := f.PutIntent(ctx, DeletionIntent{Connector: name, Phase: PhaseForgetting}); err != nil {
				return err
			}
			return f.DeleteConnector(ctx, name)
		}, true},
		{"fully forgotten", func(ctx context.Context, f *File, name string) error {
			if err := f.PutConnector(ctx, ConnectorRecord{Name: name}); err != nil {
				return err
			}
			return f.DeleteConnector(ctx, name)
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			f := openT(t, dir)
			const name = "c"
			if err := tt.setup(ctx, f, name); err != nil {
				t.Fatal(err)
			}
			_, statErr := os.Stat(filepath.Join(dir, "connectors", name))
			existed := statErr == nil
			err := f.Ledger(name).Own(ctx, res)
			perr := f.Put(ctx, name, []worker.SourceOffset{{Partition: map[string]any{"p": 1}, Offset: map[string]any{"o": 1}}})
			if tt.wantErr {
				if !errors.Is(err, ErrNoConnector) || !errors.Is(perr, ErrNoConnector) {
					t.Fatalf("Own = %v, Put = %v, want ErrNoConnector", err, perr)
				}
				if _, err := os.Stat(filepath.Join(dir, "connectors", name)); !existed && err == nil {
					t.Errorf("a refused Own recreated the connector's directory")
				}
				if got, _ := f.Ledger(name).List(ctx); len(got) != 0 {
					t.Errorf("ledger after a refused Own = %v", got)
				}
				return
			}
			if err != nil || perr != nil {
				t.Fatalf("Own = %v, Put = %v, want success", err, perr)
			}
			if got, _ := f.Ledger(name).List(ctx); !reflect.DeepEqual(got, []connect.Resource{res}) {
				t.Errorf("ledger = %v, want [%v]", got, res)
			}
		})
	}
}

// TestOrphanLedgers: a ledger whose connector has neither a config nor a
// deletion intent (left by an older version) is listed after a reopen;
// recreating the connector adopts it.
func TestOrphanLedgers(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	f := openT(t, dir)
	res := connect.Resource{Kind: "q", Name: "leaked", Location: "/"}
	// Orphan, deleting (intent, no config), and live connectors.
	for _, n := range []string{"orphan", "deleting", "live"} {
		if err := f.PutConnector(ctx, ConnectorRecord{Name: n}); err != nil {
			t.Fatal(err)
		}
		if err := f.Ledger(n).Own(ctx, res); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.PutIntent(ctx, DeletionIntent{Connector: "deleting"}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"orphan", "deleting"} {
		if err := f.DeleteConnector(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	f = reopen(t, f, dir)
	got, err := f.OrphanLedgers(ctx)
	if want := map[string][]connect.Resource{"orphan": {res}}; err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("OrphanLedgers = %v %v, want %v", got, err, want)
	}
	// Recreated under the same name, the connector adopts its ledger.
	if err := f.PutConnector(ctx, ConnectorRecord{Name: "orphan"}); err != nil {
		t.Fatal(err)
	}
	if got, _ := f.OrphanLedgers(ctx); len(got) != 0 {
		t.Errorf("OrphanLedgers after recreating the connector = %v, want none", got)
	}
	if l, _ := f.Ledger("orphan").List(ctx); !reflect.DeepEqual(l, []connect.Resource{res}) {
		t.Errorf("adopted ledger = %v", l)
	}
}
