package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
	buildDir  string
)

// TestMain removes the binary built for the tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// binary builds cmd/tidyconnect once per test binary.
func binary(tb testing.TB) string {
	tb.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "tidyconnect-bin-")
		if buildErr != nil {
			return
		}
		binPath = filepath.Join(buildDir, "tidyconnect")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", binPath, ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		tb.Fatalf("building tidyconnect: %v", buildErr)
	}
	return binPath
}

// proc is a running tidyconnect standalone.
type proc struct {
	cmd    *exec.Cmd
	addr   string
	out    *testenv.SyncBuffer
	exited chan struct{}
	err    error
}

// readyAddr returns the address of the "REST API ready" log line in out
// (JSON log format), or "".
func readyAddr(out string) string {
	for _, line := range strings.Split(out, "\n") {
		var l struct {
			Msg  string `json:"msg"`
			Addr string `json:"addr"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "REST API ready" {
			return l.Addr
		}
	}
	return ""
}

// startProc starts the binary with an embedded broker, both listening on
// a port the system picks (no other process can take it between a choice
// and the bind), reads the REST address from the "REST API ready" log line
// and waits for GET / to answer 200. The process is killed at cleanup if
// still running.
func startProc(tb testing.TB, dataDir string, extra ...string) (*proc, time.Duration) {
	tb.Helper()
	bin := binary(tb)
	p := &proc{out: &testenv.SyncBuffer{}, exited: make(chan struct{})}
	args := append([]string{"standalone", "--rest-addr", "127.0.0.1:0", "--data-dir", dataDir, "--embedded-kafka-addr", "127.0.0.1:0", "--log-format", "json"}, extra...)
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = []string{"HOME=" + dataDir, "PATH=" + os.Getenv("PATH")}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	start := time.Now()
	if err := p.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	// The reaper goroutine ends when the process exits; cleanup kills it.
	go func() { p.err = p.cmd.Wait(); close(p.exited) }()
	tb.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
				tb.Errorf("killing tidyconnect at cleanup: %v", err)
			}
			<-p.exited
		}
	})
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-p.exited:
			tb.Fatalf("tidyconnect exited during start-up (%v):\n%s", p.err, p.out.String())
		default:
		}
		if p.addr == "" {
			p.addr = readyAddr(p.out.String())
		}
		if p.addr != "" {
			resp, err := client.Get("http://" + p.addr + "/")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return p, time.Since(start)
				}
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("REST not ready after 30s:\n%s", p.out.String())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// stop sends SIGTERM and waits for the exit, bounded by limit.
func (p *proc) stop(tb testing.TB, limit time.Duration) int {
	tb.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		tb.Fatal(err)
	}
	select {
	case <-p.exited:
	case <-time.After(limit):
		tb.Fatalf("tidyconnect did not exit within %s of SIGTERM:\n%s", limit, p.out.String())
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.ExitCode()
	}
	return 0
}

func TestBinarySIGTERMExitsCleanly(t *testing.T) {
	dir := t.TempDir()
	p, _ := startProc(t, dir)
	// The REST API works, errors included.
	resp, err := http.Post("http://"+p.addr+"/connectors", "application/json", strings.NewReader(`{"name":"x","config":{"connector.class":"nope"}}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("POST with an unknown class: %d, want 400", resp.StatusCode)
	}
	if code := p.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0:\n%s", code, p.out.String())
	}
	out := p.out.String()
	for _, want := range []string{`"msg":"using the embedded Kafka broker"`, `"msg":"shutting down`, `"msg":"stopped"`, `embedded Kafka broker stopped`} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %s:\n%s", want, out)
		}
	}
	// The data dir is released: a second start on it works.
	p2, _ := startProc(t, dir)
	if code := p2.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("second run exit code %d", code)
	}
}

func TestBinaryBadInputExitsWith2(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"name":"c","config":{"tasks.max":[1]}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		args []string
		env  []string
		want []string
	}{
		{"bad flag value", []string{"standalone", "--log-format", "xml"}, nil, []string{"--log-format"}},
		{"bad env value", []string{"standalone"}, []string{"TIDYCONNECT_DELETE_TIMEOUT=forever"}, []string{"TIDYCONNECT_DELETE_TIMEOUT"}},
		{"bad connector file", []string{"standalone", "--data-dir", dir, bad}, nil, []string{bad, "config.tasks.max"}},
		{"unknown command", []string{"distribute"}, nil, []string{"unknown command"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, binary(t), tc.args...)
			cmd.Env = append([]string{"HOME=" + dir}, tc.env...)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 {
				t.Fatalf("exit: %v, want code 2:\n%s", err, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("output does not mention %q:\n%s", w, out)
				}
			}
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, binary(t), "version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "tidyconnect ") {
		t.Errorf("version: %v %s", err, out)
	}
}

// BenchmarkStartToReady measures process start to GET / answering 200, with
// the embedded broker and a fresh data directory.
func BenchmarkStartToReady(b *testing.B) {
	var total time.Duration
	for i := 0; i < b.N; i++ {
		dir := b.TempDir()
		p, d := startProc(b, dir)
		total += d
		p.stop(b, 15*time.Second)
	}
	b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms-to-ready")
}

// BenchmarkIdleRSS measures the resident memory of an idle standalone
// worker without connectors, once it has settled.
func BenchmarkIdleRSS(b *testing.B) {
	var total float64
	for i := 0; i < b.N; i++ {
		p, _ := startProc(b, b.TempDir())
		// Settled: three equal readings 200ms apart (or 5s passed).
		var last, same int
		deadline := time.Now().Add(5 * time.Second)
		for same < 3 && time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
			rss := vmRSS(b, p.cmd.Process.Pid)
			if rss == last {
				same++
			} else {
				same, last = 0, rss
			}
		}
		total += float64(last) / 1024
		p.stop(b, 15*time.Second)
	}
	b.ReportMetric(total/float64(b.N), "MB-idle-rss")
}

func vmRSS(tb testing.TB, pid int) int {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Skipf("no /proc here: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			return kb
		}
	}
	tb.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}
