package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/runtime/store"
)

// A connector file is a POST /connectors body, which the REST API refuses
// when anything follows the JSON object. The file reader decoded the first
// value and ignored the rest, so two connectors written into one file
// started only the first, silently, and an unknown initial_state was
// reported only once the store, the broker and the herder were up (and
// earlier files' connectors created).
func TestReadConnectorFileRejectsWhatRESTRejects(t *testing.T) {
	cases := []struct {
		name, body string
		want       []string
	}{
		{"two objects", `{"name":"c1","config":{"connector.class":"pgaudit"}}
{"name":"c2","config":{"connector.class":"pgaudit"}}`, []string{"after the JSON object", "one connector per file"}},
		{"stray brace", `{"name":"c1","config":{"connector.class":"pgaudit"}}}`, []string{"after the JSON object"}},
		{"empty", " \n", []string{"is empty"}},
		{"bad initial state", `{"name":"c1","config":{"connector.class":"pgaudit"},"initial_state":"STARTED"}`, []string{`"initial_state"`, "STARTED", "RUNNING, PAUSED or STOPPED"}},
	}
	dir := t.TempDir()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_")+".json")
			if err := os.WriteFile(p, []byte(tc.body), 0o644); err != nil {
				t.Fatal(err)
			}
			cf, err := readConnectorFile(p)
			if err == nil {
				t.Fatalf("accepted: %+v; want an error", cf)
			}
			for _, w := range append(tc.want, p) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	// Trailing white space is fine, and null is the default state, as over REST.
	p := filepath.Join(dir, "ok.json")
	if err := os.WriteFile(p, []byte(`{"name":"c1","config":{"connector.class":"pgaudit"},"initial_state":null}`+"\n\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if cf, err := readConnectorFile(p); err != nil || cf.name != "c1" || cf.initial != "" {
		t.Fatalf("valid file: %+v %v", cf, err)
	}
}

// Two connector files naming one connector: the second was silently
// ignored ("already exists; keeping the stored config") although nothing
// was stored before. It is an input error, found before anything starts.
func TestTwoConnectorFilesWithOneName(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.json"), filepath.Join(dir, "b.json")
	for p, topics := range map[string]string{a: "t1", b: "t2"} {
		body := `{"name":"same","config":{"connector.class":"amqpsink","rabbitmq.url":"amqp://127.0.0.1:1/","topics":"` + topics + `"}}`
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Bounded: with the bug the worker starts and runs until signalled.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	code := run(ctx, []string{"standalone", "--data-dir", filepath.Join(dir, "data"), "--rest-addr", "127.0.0.1:0",
		"--embedded-kafka-addr", "127.0.0.1:0", a, b}, &bytes.Buffer{}, &stderr, func(string) (string, bool) { return "", false })
	if code != exitUsage {
		t.Fatalf("exit %d, want %d; stderr:\n%s", code, exitUsage, stderr.String())
	}
	for _, w := range []string{a, b, `"same"`} {
		if !strings.Contains(stderr.String(), w) {
			t.Errorf("stderr does not mention %s:\n%s", w, stderr.String())
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "data")); err == nil {
		t.Errorf("the data directory was created: the bad input was found only after start-up began")
	}
}

// A signal that arrives while the embedded broker starts (kfake replays
// its data directory first, which takes a while on a large one) is a
// shutdown: exit 0, not exit 1 with "the embedded Kafka broker ...
// choose a free port".
func TestSignalWhileTheEmbeddedBrokerStarts(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // here: before the broker's start looked at ctx
	var stderr bytes.Buffer
	code := run(ctx, []string{"standalone", "--data-dir", filepath.Join(dir, "data"), "--rest-addr", "127.0.0.1:0",
		"--embedded-kafka-addr", "127.0.0.1:0"}, &bytes.Buffer{}, &stderr, func(string) (string, bool) { return "", false })
	if code != exitOK {
		t.Fatalf("a signal during start-up: exit %d, want 0; stderr:\n%s", code, stderr.String())
	}
	if strings.Contains(stderr.String(), "choose a free port") {
		t.Errorf("a shutdown reported as a broker failure:\n%s", stderr.String())
	}
}

// A connector file the herder cannot store (the data directory cannot
// take it: a full disk, a read-only mount; here a file where its directory
// goes) is a runtime failure, exit 1, not "fix the input" (exit 2): the
// file itself is valid.
func TestConnectorFileThatCannotBeStoredExits1(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	if err := os.MkdirAll(filepath.Join(data, "connectors"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(data, "connectors", "c"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(dir, "c.json")
	if err := os.WriteFile(f, []byte(`{"name":"c","config":{"connector.class":"amqpsink","rabbitmq.url":"amqp://127.0.0.1:1/","topics":"t"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	code := run(ctx, []string{"standalone", "--data-dir", data, "--rest-addr", "127.0.0.1:0", "--embedded-kafka-addr", "127.0.0.1:0", f},
		&bytes.Buffer{}, &stderr, func(string) (string, bool) { return "", false })
	if code != exitError {
		t.Fatalf("exit %d, want %d; stderr:\n%s", code, exitError, stderr.String())
	}
	if !strings.Contains(stderr.String(), f) {
		t.Errorf("stderr does not name the file:\n%s", stderr.String())
	}
}

// A second worker on a data directory that one already uses exits 1 with
// a message saying so (the LOCK), before it reads or writes any state.
func TestSecondWorkerOnTheSameDataDir(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	if err := os.MkdirAll(data, 0o750); err != nil {
		t.Fatal(err)
	}
	first, err := store.OpenFile(data) // the first worker
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	code := run(ctx, []string{"standalone", "--data-dir", data, "--rest-addr", "127.0.0.1:0", "--embedded-kafka-addr", "127.0.0.1:0"},
		&bytes.Buffer{}, &stderr, func(string) (string, bool) { return "", false })
	if code != exitError || !strings.Contains(stderr.String(), "in use by another tidyconnect process") {
		t.Fatalf("exit %d, stderr:\n%s\nwant %d and the data directory named as in use", code, stderr.String(), exitError)
	}
	if _, err := os.Stat(filepath.Join(data, "kafka")); err == nil {
		t.Errorf("the second worker started the embedded broker on the data directory in use")
	}
}
