package kafka

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
)

// awaitNoNewFranzGoroutines waits until no goroutine started since before
// runs franz-go code (the embedded broker's or a client's).
func awaitNoNewFranzGoroutines(t *testing.T, before map[string]bool, what string) {
	t.Helper()
	testenv.AwaitNoNewGoroutines(t, before, what, 15*time.Second, func(g string) bool {
		return strings.Contains(g, "twmb/franz-go")
	})
}

// The embedded broker, used and closed, and a start that fails (its port
// is taken) leave no goroutine of the broker behind.
func TestLeakEmbeddedBroker(t *testing.T) {
	logger := slog.New(slog.DiscardHandler)
	before := testenv.GoroutineIDs()
	e, err := StartEmbedded(testCtx(t), t.TempDir(), "127.0.0.1:0", WithEmbeddedLogger(logger))
	if err != nil {
		t.Fatal(err)
	}
	cl, err := NewClient(e.Addrs(), nil, kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(testCtx(t), &kgo.Record{Topic: "leak", Value: []byte("v")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cl.Close()

	// A second broker on the same port fails to start.
	_, port, _ := net.SplitHostPort(e.Addrs()[0])
	if e2, err := StartEmbedded(testCtx(t), t.TempDir(), "127.0.0.1:"+port, WithEmbeddedLogger(logger)); err == nil {
		e2.Close()
		t.Fatal("a second broker on a taken port started")
	}
	e.Close()
	awaitNoNewFranzGoroutines(t, before, "the embedded broker's Close")

	// Started with a context that ends at once.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := StartEmbedded(ctx, t.TempDir(), "127.0.0.1:0", WithEmbeddedLogger(logger)); err == nil {
		t.Fatal("StartEmbedded with an ended context succeeded")
	}
	awaitNoNewFranzGoroutines(t, before, "a failed start")
}
