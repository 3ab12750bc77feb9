// Command tidyconnect is the tidyconnect runtime: `tidyconnect standalone`
// runs a single worker with a Kafka-Connect-compatible REST API, its state
// in a data directory and, unless --bootstrap-servers names a cluster, an
// embedded Kafka broker.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"github.com/tidyconnect/tidyconnect/runtime/version"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1 // the runtime failed
	exitUsage = 2 // bad command line or configuration: fix the input
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// The first signal starts a graceful shutdown; restoring the default
	// handlers lets a second one kill a shutdown that takes too long. The
	// goroutine ends with ctx, which stop cancels at the latest.
	go func() {
		<-ctx.Done()
		stop()
	}()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.LookupEnv))
}

const usage = `tidyconnect — a lightweight Kafka-Connect-style runtime

Usage:
  tidyconnect standalone [flags] [connector.json ...]   run a standalone worker
  tidyconnect version                                  print the version
  tidyconnect help                                     show this help

Run 'tidyconnect standalone --help' for the flags (each also settable by an
environment variable).
`

// usageError is bad input: exit code 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func run(ctx context.Context, args []string, stdout, stderr io.Writer, lookupEnv func(string) (string, bool)) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "standalone":
		err := runStandalone(ctx, args[1:], stdout, stderr, lookupEnv)
		var ue *usageError
		switch {
		case err == nil:
			return exitOK
		case errors.Is(err, errHelp):
			return exitOK
		case errors.As(err, &ue):
			fmt.Fprintf(stderr, "tidyconnect standalone: %v\n", err)
			return exitUsage
		default:
			fmt.Fprintf(stderr, "tidyconnect standalone: %v\n", err)
			return exitError
		}
	case "version", "--version", "-version":
		fmt.Fprintf(stdout, "tidyconnect %s (commit %s, %s)\n", version.Version, version.Commit, runtime.Version())
		return exitOK
	case "help", "--help", "-help", "-h":
		if len(args) > 1 && args[1] == "standalone" {
			fs, _ := newStandaloneFlags(io.Discard)
			fs.SetOutput(stdout)
			fs.Usage()
			return exitOK
		}
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	fmt.Fprintf(stderr, "tidyconnect: unknown command %q\n\n%s", args[0], usage)
	return exitUsage
}
