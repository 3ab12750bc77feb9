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

// A signal that arrives while a connector file's connector is being
// validated (pgaudit reaching a database that does not answer) is a clean
// shutdown, exit code 0, not an "invalid connector file".
func TestSignalWhileCreatingConnectorsFromFiles(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never answers
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var mu sync.Mutex
	var conns []net.Conn
	accepted := make(chan struct{}, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			accepted <- struct{}{}
		}
	}()
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	}()
	dir := t.TempDir()
	f := filepath.Join(dir, "c.json")
	body := `{"name":"c","config":{"connector.class":"pgaudit","postgres.url":"postgres://u@` + ln.Addr().String() + `/db?sslmode=disable&connect_timeout=30","tables":"public.t","topic.prefix":"tc"}}`
	if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-accepted: // the validation is connecting: the signal comes now
			cancel()
		case <-time.After(60 * time.Second):
			cancel()
		}
	}()
	var stderr bytes.Buffer
	code := run(ctx, []string{"standalone", "--rest-addr=127.0.0.1:0", "--embedded-kafka-addr=127.0.0.1:0", "--data-dir=" + filepath.Join(dir, "data"), f},
		&bytes.Buffer{}, &stderr, func(string) (string, bool) { return "", false })
	if code != 0 {
		lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
		t.Errorf("a signal during start-up: exit code %d, want 0; last line: %s", code, lines[len(lines)-1])
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
