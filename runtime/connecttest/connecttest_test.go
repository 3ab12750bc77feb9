package connecttest_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/connecttest"
)

// system is a fake external system: a set of named objects.
type system struct {
	mu      sync.Mutex
	objects map[string]bool
	bug     string // "drop-on-stop", "own-preexisting", "keep-on-delete"
}

func (s *system) has(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.objects[name]
}

func (s *system) set(name string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ok {
		s.objects[name] = true
	} else {
		delete(s.objects, name)
	}
}

type memConnector struct {
	sys     *system
	host    *connect.Host
	cfg     connect.Config
	deleted atomic.Bool
}

func (c *memConnector) Spec() connect.Spec { return connect.Spec{Type: connect.TypeSource} }

func (c *memConnector) Start(ctx context.Context, cfg connect.Config) error {
	c.host, c.cfg = connect.HostFrom(ctx), cfg
	if cfg["broken"] == "true" {
		return errors.New("cannot reach the system")
	}
	name := "obj-" + cfg["name"]
	r := connect.Resource{Kind: "mem.object", Name: name, Location: "mem"}
	if !c.sys.has(name) || c.sys.bug == "own-preexisting" {
		if err := c.host.Ledger.Own(ctx, r); err != nil {
			return err
		}
	}
	c.sys.set(name, true)
	return nil
}

func (c *memConnector) TaskConfigs(int) ([]connect.Config, error) {
	return []connect.Config{c.cfg}, nil
}

func (c *memConnector) Stop(deleted bool) {
	if deleted {
		c.deleted.Store(true)
	}
}

func (c *memConnector) Stopped(ctx context.Context) error {
	if !c.deleted.Load() && c.sys.bug != "drop-on-stop" {
		return nil
	}
	if c.sys.bug == "keep-on-delete" {
		return nil
	}
	rs, err := connect.HostFrom(ctx).Ledger.List(ctx)
	if err != nil {
		return err
	}
	for _, r := range rs {
		c.sys.set(r.Name, false)
		if err := connect.HostFrom(ctx).Ledger.Release(ctx, r); err != nil {
			return err
		}
	}
	return nil
}

type memTask struct {
	stop chan struct{}
	once sync.Once
}

func (t *memTask) Start(context.Context, connect.Config) error { return nil }
func (t *memTask) Stop(bool)                                   { t.once.Do(func() { close(t.stop) }) }
func (t *memTask) Stopped(context.Context) error               { return nil }
func (t *memTask) Poll(ctx context.Context) ([]connect.SourceRecord, error) {
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-t.stop:
		return nil, nil
	}
}
func (t *memTask) Commit(context.Context, []connect.SourceRecord) error { return nil }

func subject(bug string) connecttest.Subject {
	sys := &system{objects: map[string]bool{}, bug: bug}
	n := 0
	var mu sync.Mutex
	return connecttest.Subject{
		Plugin: connect.Plugin{
			Class:        "mem",
			NewConnector: func() connect.Connector { return &memConnector{sys: sys} },
			NewTask:      func() connect.Task { return &memTask{stop: make(chan struct{})} },
		},
		Config: func(t testing.TB) connect.Config {
			mu.Lock()
			defer mu.Unlock()
			n++
			return connect.Config{"name": t.Name() + string(rune('a'+n)), "tasks.max": "1"}
		},
		Exists: func(_ context.Context, r connect.Resource) (bool, error) { return sys.has(r.Name), nil },
		PreExisting: func(t testing.TB, cfg connect.Config) connect.Resource {
			name := "obj-" + cfg["name"]
			sys.set(name, true)
			return connect.Resource{Kind: "mem.object", Name: name, Location: "mem"}
		},
		BrokenConfig: func(t testing.TB) connect.Config {
			return connect.Config{"name": "broken", "broken": "true"}
		},
	}
}

func TestKitPassesCorrectConnector(t *testing.T) {
	connecttest.Run(t, subject(""))
}

// bugEnv names the bug of the connector the child process runs the kit
// against.
const bugEnv = "CONNECTTEST_BUG"

// TestMain runs the kit against a buggy connector instead of the tests when
// TestKitCatchesBugs started this binary as its child, so that no test
// shows up as skipped.
func TestMain(m *testing.M) {
	if bug := os.Getenv(bugEnv); bug != "" {
		// testing.Main runs the kit as a test and exits.
		testing.Main(func(pat, str string) (bool, error) { return regexp.MatchString(pat, str) },
			[]testing.InternalTest{{Name: "KitBuggyChild", F: func(t *testing.T) { connecttest.Run(t, subject(bug)) }}}, nil, nil)
	}
	os.Exit(m.Run())
}

// TestKitCatchesBugs runs the kit against deliberately broken connectors in a
// child process and asserts that it fails, naming the broken guarantee.
func TestKitCatchesBugs(t *testing.T) {
	tests := []struct {
		bug, want string
	}{
		{"drop-on-stop", "dropped by a plain stop"},
		{"own-preexisting", "recorded pre-existing"},
		{"keep-on-delete", "still exists after Stop(true)"},
	}
	for _, tt := range tests {
		t.Run(tt.bug, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^KitBuggyChild$", "-test.v")
			cmd.Env = append(os.Environ(), bugEnv+"="+tt.bug)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ctx.Err() != nil {
				t.Fatalf("the kit passed a connector with bug %s, or did not run (%v):\n%s", tt.bug, err, out)
			}
			if !strings.Contains(string(out), "--- FAIL: KitBuggyChild") {
				t.Fatalf("the child did not run the kit to a failure:\n%s", out)
			}
			if !strings.Contains(string(out), tt.want) {
				t.Fatalf("kit failure does not say %q:\n%s", tt.want, out)
			}
		})
	}
}
