package herder

import (
	"context"
	"testing"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/internal/sampleconn"
)

// BenchmarkConnectorInfo is GET /connectors/{c} through the herder: a
// snapshot under the herder's mutex, no operation lock.
func BenchmarkConnectorInfo(b *testing.B) {
	rec := sampleconn.NewRecorder()
	hs := newHarness(b, kindSync, b.TempDir(), rec, nil)
	ctx := context.Background()
	name := testenv.Unique("bench-")
	if _, err := hs.h.CreateConnector(ctx, name, sourceConfig("t", 4), ""); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := hs.h.ConnectorInfo(ctx, name); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCreateDelete is a create then a durable deletion (intent,
// phases, cleanup through the ledger, forget) on the file store with the
// in-test worker: the cost of the deletion's bookkeeping and fsyncs.
func BenchmarkCreateDelete(b *testing.B) {
	rec := sampleconn.NewRecorder()
	hs := newHarness(b, kindSync, b.TempDir(), rec, nil)
	ctx := context.Background()
	cfg := sourceConfig("t", 1)
	b.ReportAllocs()
	for b.Loop() {
		name := testenv.Unique("bench-")
		if _, err := hs.h.CreateConnector(ctx, name, cfg, ""); err != nil {
			b.Fatal(err)
		}
		if err := hs.h.DeleteConnector(ctx, name); err != nil {
			b.Fatal(err)
		}
	}
}
