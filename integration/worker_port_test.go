package integration

import (
	"errors"
	"net"
	"net/http"
	"testing"
)

// withRESTAddr makes the worker's first start use addr for its REST API.
func withRESTAddr(addr string) workerOpt {
	return func(w *worker) { w.restAddr = addr }
}

// startWorker's answer to a port taken between choosing and binding it:
// the process exits with "address already in use" and is started again on
// another port, instead of the test failing (or talking to whatever holds
// the port).
func TestStartWorkerStartsAgainOnATakenPort(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() {
		_ = taken.Close()
		<-done
	})
	// Whatever connects is hung up on: not a REST API.
	go func() {
		defer close(done)
		for {
			c, err := taken.Accept()
			if err != nil {
				if !errors.Is(err, net.ErrClosed) {
					t.Errorf("accepting on the taken port: %v", err)
				}
				return
			}
			_ = c.Close()
		}
	}()

	w := startWorker(t, withEmbeddedKafka(), withRESTAddr(taken.Addr().String()))
	w.mu.Lock()
	starts := w.starts
	w.mu.Unlock()
	if starts != 2 {
		t.Errorf("the worker was started %d times, want 2 (one on the taken port, one on another)", starts)
	}
	if w.restAddr == taken.Addr().String() {
		t.Fatalf("the worker still uses the taken address %s", w.restAddr)
	}
	resp, err := http.Get(w.url("/"))
	if err != nil {
		t.Fatalf("the worker started again does not answer on %s: %v", w.restAddr, err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET / on the worker started again: %s", resp.Status)
	}
}
