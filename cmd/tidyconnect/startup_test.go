package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// silentServer listens on a local port, accepts connections and never
// answers them; accepted receives once per connection. The listener and
// the connections are closed, and the accepting goroutine joined, when the
// test ends.
func silentServer(t *testing.T) (addr string, accepted <-chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	ch := make(chan struct{}, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String(), ch
}

// runSignalledOnAccept runs `tidyconnect standalone` with one connector
// file of body, and signals it (cancels its context) when the first
// connection reaches the silent server, or after 60 s. It returns the exit
// code, the last line of stderr and when the signal came.
func runSignalledOnAccept(t *testing.T, body string, accepted <-chan struct{}) (code int, last string, signalled time.Time) {
	t.Helper()
	dir := t.TempDir()
	f := filepath.Join(dir, "c.json")
	if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	at := make(chan time.Time, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		select {
		case <-accepted:
		case <-time.After(60 * time.Second):
		case <-ctx.Done():
		}
		at <- time.Now()
		cancel()
	})
	var stderr bytes.Buffer
	code = run(ctx, []string{"standalone", "--rest-addr=127.0.0.1:0", "--embedded-kafka-addr=127.0.0.1:0", "--data-dir=" + filepath.Join(dir, "data"), f},
		&bytes.Buffer{}, &stderr, func(string) (string, bool) { return "", false })
	cancel()
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	return code, lines[len(lines)-1], <-at
}

// A signal that arrives while a connector file's connector is being
// validated (pgaudit reaching a database that does not answer) is a clean
// shutdown, exit code 0, not an "invalid connector file".
func TestSignalWhileCreatingConnectorsFromFiles(t *testing.T) {
	addr, accepted := silentServer(t)
	body := `{"name":"c","config":{"connector.class":"pgaudit","postgres.url":"postgres://u@` + addr + `/db?sslmode=disable&connect_timeout=30","tables":"public.t","topic.prefix":"tc"}}`
	if code, last, _ := runSignalledOnAccept(t, body, accepted); code != 0 {
		t.Errorf("a signal during start-up: exit code %d, want 0; last line: %s", code, last)
	}
}

// A taken embedded-broker port exits 1 with a message naming the flag that
// moves it.
func TestEmbeddedBrokerPortTakenNamesTheFlag(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var stderr bytes.Buffer
	code := run(context.Background(), []string{"standalone", "--data-dir", t.TempDir(), "--rest-addr", "127.0.0.1:0",
		"--embedded-kafka-addr", ln.Addr().String()}, io.Discard, &stderr, func(string) (string, bool) { return "", false })
	if code != exitError || !strings.Contains(stderr.String(), "--embedded-kafka-addr") {
		t.Fatalf("exit %d, stderr %q; want %d and a message naming --embedded-kafka-addr", code, stderr.String(), exitError)
	}
}

// A signal that arrives while a connector file's connector starts (its
// Start reaching a broker that accepts and never answers) shuts down at
// once. The herder no longer ends a request's Start when the caller's
// context ends (decision 0025), so the shutdown has to interrupt it: it
// must not wait for the Start to give up by itself (here amqpsink's 15 s
// handshake bound; a pgaudit initial snapshot waiting for a lock has
// none).
func TestSignalWhileAFileConnectorStartsEndsIt(t *testing.T) {
	addr, accepted := silentServer(t)
	// amqpsink's Validate does not contact the broker: the file's
	// connector is created, and its Start dials.
	body := `{"name":"c","config":{"connector.class":"amqpsink","rabbitmq.url":"amqp://guest:guest@` + addr + `/","topics":"t"}}`
	code, last, signalled := runSignalledOnAccept(t, body, accepted)
	took := time.Since(signalled)
	if code != 0 {
		t.Errorf("a signal while a file's connector starts: exit code %d, want 0; last line: %s", code, last)
	}
	if took > 10*time.Second {
		t.Errorf("the shutdown took %v after the signal: it waited for the file connector's Start instead of interrupting it", took.Round(time.Millisecond))
	}
}
