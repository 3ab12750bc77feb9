package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// worker is a tidyconnect binary run as a subprocess: SIGTERM and SIGKILL
// are real, and a restart reuses the data dir and REST port.
type worker struct {
	t        testing.TB
	bin      string
	dataDir  string
	restAddr string
	// kafkaAddr is where the embedded broker listens ("": none).
	kafkaAddr string
	env       []string // besides the two addresses
	logPath   string

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{} // closed when the current process has been reaped
	waitErr error
	starts  int
}

type workerOpt func(*worker)

// withBrokers points the worker at an external Kafka (an in-process kfake of
// the test, or TIDYCONNECT_TEST_KAFKA_BROKERS).
func withBrokers(brokers []string) workerOpt {
	return func(w *worker) {
		w.env = append(w.env, "TIDYCONNECT_BOOTSTRAP_SERVERS="+strings.Join(brokers, ","))
	}
}

// withEmbeddedKafka makes the worker run its embedded broker, with its data
// under the worker's data dir, on a fixed free port: clients of a
// restarted worker find the broker where the previous one was.
func withEmbeddedKafka() workerOpt {
	return func(w *worker) {
		w.kafkaAddr = freeAddr(w.t)
	}
}

// startWorker starts the binary configured the way docker-compose.yml
// configures it: through TIDYCONNECT_* environment variables.
func startWorker(t testing.TB, opts ...workerOpt) *worker {
	t.Helper()
	w := &worker{
		t:        t,
		bin:      tidyconnectBinary(t),
		dataDir:  t.TempDir(),
		restAddr: freeAddr(t),
	}
	w.logPath = filepath.Join(t.TempDir(), "worker.log")
	w.env = []string{
		"HOME=" + w.dataDir,
		"PATH=" + os.Getenv("PATH"),
		"TIDYCONNECT_DATA_DIR=" + w.dataDir,
		"TIDYCONNECT_WORKER_ID=it-" + filepath.Base(w.dataDir),
		"TIDYCONNECT_LOG_FORMAT=json",
		"TIDYCONNECT_LOG_LEVEL=info",
		"TIDYCONNECT_TOPIC_PARTITIONS=1",
		"TIDYCONNECT_TOPIC_REPLICATION_FACTOR=1",
	}
	for _, o := range opts {
		o(w)
	}
	t.Cleanup(func() {
		w.shutdown()
		if t.Failed() {
			t.Logf("worker log (%s), last lines:\n%s", w.logPath, tail(w.logPath, 60))
		}
	})
	// A port chosen free may be taken (by another test package, say)
	// before the worker binds it: then it starts again on other ports.
	for attempt := 1; ; attempt++ {
		err := w.launch()
		if err == nil {
			break
		}
		if attempt == 3 {
			w.t.Fatalf("tidyconnect could not start (%d attempts): %v", attempt, err)
		}
		w.t.Logf("attempt %d: %v; starting again on other ports", attempt, err)
		w.restAddr = freeAddr(t)
		if w.kafkaAddr != "" {
			w.kafkaAddr = freeAddr(t)
		}
	}
	return w
}

// errPortTaken is launch's error when the process exited during start-up
// because a port it was to listen on was taken.
var errPortTaken = errors.New("a port chosen for the worker was taken before it could bind it")

// freeAddr returns an address with a port that was free a moment ago:
// the worker binds it later, so startWorker retries when it was taken.
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("finding a free port: %v", err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

func (w *worker) url(path string) string { return "http://" + w.restAddr + path }

// start runs the process and waits until the REST API answers.
func (w *worker) start() {
	w.t.Helper()
	if err := w.launch(); err != nil {
		w.t.Fatal(err)
	}
}

// launch runs the process and waits until the REST API answers. It fails
// the test, except when the process exits during start-up because one of
// its ports is taken: then it returns errPortTaken.
func (w *worker) launch() error {
	w.t.Helper()
	var logFrom int64
	if fi, err := os.Stat(w.logPath); err == nil {
		logFrom = fi.Size()
	}
	logf, err := os.OpenFile(w.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		w.t.Fatalf("opening the worker log: %v", err)
	}
	cmd := exec.Command(w.bin, "standalone")
	cmd.Env = append(slices.Clone(w.env), "TIDYCONNECT_REST_ADDR="+w.restAddr)
	if w.kafkaAddr != "" {
		cmd.Env = append(cmd.Env, "TIDYCONNECT_EMBEDDED_KAFKA_ADDR="+w.kafkaAddr)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		w.t.Fatalf("starting %s: %v", w.bin, err)
	}
	exited := make(chan struct{})
	w.mu.Lock()
	w.cmd, w.exited, w.waitErr = cmd, exited, nil
	w.starts++
	w.mu.Unlock()
	// The reaper: owned by the worker, ended by the process's exit, which
	// shutdown (registered with t.Cleanup) guarantees.
	go func() {
		err := cmd.Wait()
		_ = logf.Close()
		w.mu.Lock()
		w.waitErr = err
		w.mu.Unlock()
		close(exited)
	}()

	client := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-exited:
			if b, err := os.ReadFile(w.logPath); err == nil && int64(len(b)) >= logFrom &&
				bytes.Contains(b[logFrom:], []byte("address already in use")) {
				return fmt.Errorf("%w (%v); log:\n%s", errPortTaken, w.exitErr(), tail(w.logPath, 10))
			}
			w.t.Fatalf("tidyconnect exited during startup (%v); log:\n%s", w.exitErr(), tail(w.logPath, 40))
		default:
		}
		resp, err := client.Get(w.url("/"))
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("tidyconnect REST API on %s did not answer within 60s (last error %v); log:\n%s", w.restAddr, err, tail(w.logPath, 40))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (w *worker) exitErr() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.waitErr
}

// signal sends sig and waits up to d for the process to exit; it reports
// whether it exited.
func (w *worker) signal(sig syscall.Signal, d time.Duration) bool {
	w.mu.Lock()
	cmd, exited := w.cmd, w.exited
	w.mu.Unlock()
	if cmd == nil {
		return true
	}
	select {
	case <-exited:
		return true
	default:
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-exited:
		return true
	case <-time.After(d):
		return false
	}
}

// terminate stops the worker gracefully (SIGTERM) and fails the test if it
// does not exit in time or exits with an error.
func (w *worker) terminate() {
	w.t.Helper()
	if !w.signal(syscall.SIGTERM, 90*time.Second) {
		w.signal(syscall.SIGKILL, 10*time.Second)
		w.t.Fatalf("tidyconnect did not exit within 90s of SIGTERM; log:\n%s", tail(w.logPath, 40))
	}
	if err := w.exitErr(); err != nil {
		w.t.Errorf("tidyconnect exited with %v after SIGTERM, want a clean exit; log:\n%s", err, tail(w.logPath, 40))
	}
}

// kill stops the worker with SIGKILL: no cleanup of any kind runs.
func (w *worker) kill() {
	w.t.Helper()
	if !w.signal(syscall.SIGKILL, 30*time.Second) {
		w.t.Fatalf("tidyconnect survived SIGKILL for 30s")
	}
}

// restart starts the worker again on the same data dir and port.
func (w *worker) restart() { w.t.Helper(); w.start() }

// shutdown is the cleanup: SIGTERM, then SIGKILL if it hangs.
func (w *worker) shutdown() {
	if !w.signal(syscall.SIGTERM, 60*time.Second) {
		w.t.Errorf("tidyconnect did not exit within 60s of SIGTERM at cleanup; killing it")
		w.signal(syscall.SIGKILL, 10*time.Second)
	}
}

// logContains reports whether the worker's log contains s.
func (w *worker) logContains(s string) bool {
	b, err := os.ReadFile(w.logPath)
	return err == nil && bytes.Contains(b, []byte(s))
}

// logLevels returns the log lines at the given levels (JSON log format).
func (w *worker) logLevels(levels ...string) string {
	b, err := os.ReadFile(w.logPath)
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		for _, lv := range levels {
			if strings.Contains(l, `"level":"`+lv+`"`) {
				out = append(out, l)
			}
		}
	}
	return strings.Join(out, "\n")
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(reading %s: %v)", path, err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// --- REST client --------------------------------------------------------

type restClient struct {
	t    testing.TB
	base string
	http *http.Client
}

func (w *worker) api() *restClient {
	return &restClient{t: w.t, base: "http://" + w.restAddr, http: &http.Client{Timeout: 3 * time.Minute}}
}

// do sends a request and returns the status and body; transport errors are
// returned, not fatal, because a killed worker is part of some tests.
func (c *restClient) do(ctx context.Context, method, path string, body any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// must sends a request and fails the test unless the status is one of want.
func (c *restClient) must(method, path string, body any, want ...int) []byte {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	status, b, err := c.do(ctx, method, path, body)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	for _, s := range want {
		if status == s {
			return b
		}
	}
	c.t.Fatalf("%s %s = %d %s, want %v", method, path, status, b, want)
	return nil
}

type connectorStatus struct {
	Name      string `json:"name"`
	Connector struct {
		State string `json:"state"`
		Trace string `json:"trace"`
	} `json:"connector"`
	Tasks []struct {
		ID    int    `json:"id"`
		State string `json:"state"`
		Trace string `json:"trace"`
	} `json:"tasks"`
	Deletion *struct {
		Phase     string     `json:"phase"`
		Remaining []resource `json:"remaining"`
		Error     string     `json:"error"`
	} `json:"deletion"`
}

type resource struct {
	Kind     string `json:"kind"`
	Name     string `json:"name"`
	Location string `json:"location"`
}

// status returns the connector's status, or ok=false on 404.
func (c *restClient) status(name string) (connectorStatus, bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code, b, err := c.do(ctx, http.MethodGet, "/connectors/"+name+"/status", nil)
	if err != nil {
		return connectorStatus{}, false, err
	}
	if code == http.StatusNotFound {
		return connectorStatus{}, false, nil
	}
	if code != http.StatusOK {
		return connectorStatus{}, false, fmt.Errorf("GET /connectors/%s/status = %d %s", name, code, b)
	}
	var s connectorStatus
	if err := json.Unmarshal(b, &s); err != nil {
		return s, false, fmt.Errorf("decoding the status of %s: %w (%s)", name, err, b)
	}
	return s, true, nil
}

// awaitState waits until the connector is in state and every task (at least
// one) is in taskState.
func (c *restClient) awaitState(name, state, taskState string) connectorStatus {
	c.t.Helper()
	var last connectorStatus
	var lastErr error
	ok := eventually(90*time.Second, func() bool {
		s, found, err := c.status(name)
		last, lastErr = s, err
		if err != nil || !found || s.Connector.State != state {
			return false
		}
		if taskState == "" {
			return true
		}
		if len(s.Tasks) == 0 {
			return false
		}
		for _, tk := range s.Tasks {
			if tk.State != taskState {
				return false
			}
		}
		return true
	})
	if !ok {
		c.t.Fatalf("connector %s did not reach %s (tasks %s) within 90s; last status %+v, error %v", name, state, taskState, last, lastErr)
	}
	return last
}

func (c *restClient) awaitRunning(name string) {
	c.t.Helper()
	c.awaitState(name, "RUNNING", "RUNNING")
}

// awaitGone waits until GET /connectors/{name} answers 404.
func (c *restClient) awaitGone(name string, within time.Duration) {
	c.t.Helper()
	var last connectorStatus
	ok := eventually(within, func() bool {
		s, found, err := c.status(name)
		last = s
		return err == nil && !found
	})
	if !ok {
		c.t.Fatalf("connector %s still exists after %s; last status %+v", name, within, last)
	}
}

func (c *restClient) create(name string, cfg map[string]string) {
	c.t.Helper()
	c.must(http.MethodPost, "/connectors", map[string]any{"name": name, "config": cfg}, http.StatusCreated)
}

func (c *restClient) resources(name string) []resource {
	c.t.Helper()
	var rs []resource
	b := c.must(http.MethodGet, "/connectors/"+name+"/resources", nil, http.StatusOK)
	if err := json.Unmarshal(b, &rs); err != nil {
		c.t.Fatalf("GET /connectors/%s/resources: %v (%s)", name, err, b)
	}
	return rs
}

func (c *restClient) delete(name string) {
	c.t.Helper()
	c.must(http.MethodDelete, "/connectors/"+name, nil, http.StatusNoContent, http.StatusOK)
}

// deleteEventually deletes and waits until the connector is gone. A DELETE
// that answers 500 because cleanup outlasted the REST timeout is accepted
// (logged): the deletion is durable and carries on.
func (c *restClient) deleteEventually(name string, within time.Duration) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	code, b, err := c.do(ctx, http.MethodDelete, "/connectors/"+name, nil)
	switch {
	case err != nil:
		c.t.Fatalf("DELETE /connectors/%s: %v", name, err)
	case code == http.StatusNoContent || code == http.StatusOK:
	case code == http.StatusInternalServerError:
		c.t.Logf("DELETE /connectors/%s answered 500 (cleanup still running): %s", name, b)
	default:
		c.t.Fatalf("DELETE /connectors/%s = %d %s", name, code, b)
	}
	c.awaitGone(name, within)
}

// eventually polls cond every 100ms until it is true or d has passed.
func eventually(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
}
