// Command capturecost provisions a pgaudit connector's capture objects on a
// database and stops it, keeping them: scripts/capture-cost.sh then counts
// the instructions captured statements cost on a single-user server under
// callgrind, which unlike wall-clock benchmarks gives the same figures on
// every run (docs/pgaudit.md, "Instruction counts").
//
//	go run ./scripts/capturecost -url postgres://postgres@127.0.0.1:5499/test -name cc -tables public.cap
//	go run ./scripts/capturecost -url ... -name ccrow -tables public.capr -set capture.level=row
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/tidyconnect/tidyconnect/connectors/pgaudit"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

type settings []string

func (s *settings) String() string     { return strings.Join(*s, ",") }
func (s *settings) Set(v string) error { *s = append(*s, v); return nil }

func main() {
	url := flag.String("url", "", "libpq URL of the database (required)")
	name := flag.String("name", "capturecost", "connector name")
	tables := flag.String("tables", "", "tables to capture, as the connector's tables key (required)")
	var set settings
	flag.Var(&set, "set", "another connector setting as key=value (repeatable)")
	flag.Parse()
	if *url == "" || *tables == "" {
		fmt.Fprintln(os.Stderr, "capturecost: -url and -tables are required")
		flag.Usage()
		os.Exit(2)
	}
	cfg := connect.Config{
		"name":                     *name,
		"connector.class":          pgaudit.Class,
		pgaudit.KeyURL:             *url,
		pgaudit.KeyTables:          *tables,
		pgaudit.KeyTopicPrefix:     "capturecost",
		pgaudit.KeyCleanupOnDelete: "false",
	}
	for _, kv := range set {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			fmt.Fprintf(os.Stderr, "capturecost: -set %q: want key=value\n", kv)
			os.Exit(2)
		}
		cfg[k] = v
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx = connect.WithHost(ctx, &connect.Host{Connector: *name, Task: -1, Logger: logger, Ledger: connect.NewMemoryLedger(), RequestTaskReconfiguration: func() {}})
	c := &pgaudit.Connector{}
	if errs := c.Validate(ctx, cfg); len(errs) > 0 {
		fmt.Fprintf(os.Stderr, "capturecost: invalid configuration: %v\n", errs)
		os.Exit(1)
	}
	err := c.Start(ctx, cfg)
	c.Stop(false)
	if stopErr := c.Stopped(ctx); err == nil {
		err = stopErr
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "capturecost: %v\n", err)
		os.Exit(1)
	}
}
