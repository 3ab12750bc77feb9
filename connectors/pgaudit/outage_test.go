package pgaudit

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// proxy forwards a local port to PostgreSQL and can go down (refusing and
// cutting every connection) and come back on the same port: the database
// "going away" without stopping the shared server.
type proxy struct {
	t      testing.TB
	addr   string // 127.0.0.1:port
	target string

	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]struct{}
	delay  time.Duration // before a new connection is forwarded
	frozen bool          // bytes are held, not forwarded: a server that stopped answering
	held   int           // bytes held since the last freeze
	wg     sync.WaitGroup
}

// freeze holds every byte in both directions (frozen) or forwards them.
func (p *proxy) freeze(frozen bool) {
	p.mu.Lock()
	p.frozen = frozen
	if frozen {
		p.held = 0
	}
	p.mu.Unlock()
}

// hold counts n bytes read while frozen and reports whether they are to be
// held (see holding).
func (p *proxy) hold(n int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.frozen || p.ln == nil {
		return false
	}
	p.held += n
	return true
}

// heldBytes is how many bytes arrived while frozen since the last freeze.
func (p *proxy) heldBytes() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held
}

// holding reports whether bytes are to be held: frozen, and not down
// (which cuts the connections).
func (p *proxy) holding() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.frozen && p.ln != nil
}

// slow makes new connections wait d before they are forwarded, as a
// remote server's TLS handshake would.
func (p *proxy) slow(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

func newProxy(t testing.TB, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{t: t, addr: ln.Addr().String(), target: target, conns: map[net.Conn]struct{}{}}
	p.serve(ln)
	t.Cleanup(func() { p.down(); p.wg.Wait() })
	return p
}

func (p *proxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			delay := p.delay
			p.mu.Unlock()
			time.Sleep(delay)
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns[c], p.conns[up] = struct{}{}, struct{}{}
			p.mu.Unlock()
			pipe := func(dst, src net.Conn) {
				defer dst.Close()
				defer src.Close()
				buf := make([]byte, 32<<10)
				for {
					n, err := src.Read(buf)
					if n > 0 && p.hold(n) {
						for p.holding() {
							time.Sleep(5 * time.Millisecond)
						}
					}
					if n > 0 {
						if _, werr := dst.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}
			p.wg.Go(func() { pipe(up, c) })
			p.wg.Go(func() { pipe(c, up) })
		}
	})
}

// down closes the listener and cuts every forwarded connection.
func (p *proxy) down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

// up listens again on the same port.
func (p *proxy) up() {
	deadline := time.Now().Add(10 * time.Second)
	for {
		ln, err := net.Listen("tcp", p.addr)
		if err == nil {
			p.serve(ln)
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("re-listening on %s: %v", p.addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestOutageThroughRuntime: the database goes away while the connector runs
// in the real herder and worker: the task retries and loses nothing. A
// DELETE while it is away fails, leaves the connector visible (FAILED, its
// deletion naming what remains) and completes when retried after the
// database is back.
func TestOutageThroughRuntime(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "orders")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY)`)
	st := newStack(t)
	px := newProxy(t, "127.0.0.1:5432")
	if !strings.Contains(url, "127.0.0.1:5432") {
		testenv.Skip(t, "the outage test proxies 127.0.0.1:5432; %s points elsewhere", testenv.PostgresEnv)
	}
	pURL := strings.Replace(url, "127.0.0.1:5432", px.addr, 1)
	cfg := baseConfig(testenv.Unique("outage-rt-"), pURL, auditSchemaFor(t, db), s+".orders")
	name := cfg["name"]
	if code, body := st.call("POST", "/connectors", map[string]any{"name": name, "config": cfg}); code != http.StatusCreated {
		t.Fatalf("POST = %d %s", code, body)
	}
	st.awaitRunning(name)

	cl, err := kgo.NewClient(kgo.SeedBrokers(st.seeds...), kgo.ConsumeTopics("tc."+s+".orders"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	seen := map[int]bool{}
	consume := func(want int) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for len(seen) < want {
			if time.Now().After(deadline) {
				t.Fatalf("consumed %d distinct rows, want %d", len(seen), want)
			}
			fctx, cancel := contextWithTimeout(5 * time.Second)
			fs := cl.PollFetches(fctx)
			cancel()
			fs.EachRecord(func(r *kgo.Record) {
				var k struct{ ID int }
				if err := json.Unmarshal(r.Key, &k); err == nil {
					seen[k.ID] = true
				}
			})
		}
	}
	mustExec(t, db, `INSERT INTO `+tbl+` SELECT g FROM generate_series(1, 100) g`)
	consume(100)

	px.down()
	mustExec(t, db, `INSERT INTO `+tbl+` SELECT g FROM generate_series(101, 300) g`) // written while away
	time.Sleep(500 * time.Millisecond)                                               // let the task notice and back off; not an assertion
	px.up()
	consume(300)

	// Deletion while the database is away.
	px.down()
	code, body := st.call("DELETE", "/connectors/"+name, nil)
	if code != http.StatusInternalServerError || !strings.Contains(body, "remaining") || strings.Contains(body, "secret") {
		t.Fatalf("DELETE while away = %d %s, want 500 naming what remains", code, body)
	}
	_, status := st.call("GET", "/connectors/"+name+"/status", nil)
	n := objectNames(name)
	remaining := []string{n.table, n.wakeup, n.waiters, n.function, cfg[KeyAuditSchema]}
	for _, e := range triggerEvents {
		remaining = append(remaining, n.trigger(e))
	}
	if !strings.Contains(status, `"deletion"`) || !strings.Contains(status, `"FAILED"`) {
		t.Errorf("status during the failed deletion is not FAILED with its deletion progress: %s", status)
	}
	for _, obj := range remaining {
		if !strings.Contains(status, obj) {
			t.Errorf("status during the failed deletion does not name the remaining %s: %s", obj, status)
		}
	}
	if !relExists(t, db, cfg[KeyAuditSchema], objectNames(name).table) {
		t.Fatal("the audit table vanished although the database was unreachable")
	}
	px.up()
	if code, body := st.call("DELETE", "/connectors/"+name, nil); code != http.StatusNoContent {
		t.Fatalf("retried DELETE = %d %s", code, body)
	}
	if relExists(t, db, cfg[KeyAuditSchema], objectNames(name).table) || triggerCount(t, db, s, "orders") != 0 {
		t.Error("objects survived the retried deletion")
	}
}

// TestInterruptedPollGivesUpOnAServerThatStoppedAnswering: a Poll goes on
// reading its batch when interrupted, but not past interruptGrace: a
// server that stopped answering (packets dropped, a stuck failover) must
// not hold a pause back.
func TestInterruptedPollGivesUpOnAServerThatStoppedAnswering(t *testing.T) {
	override(t, &interruptGrace, 300*time.Millisecond)
	db, url := admin(t)
	if !strings.Contains(url, "127.0.0.1:5432") {
		testenv.Skip(t, "the test proxies 127.0.0.1:5432; %s points elsewhere", testenv.PostgresEnv)
	}
	px := newProxy(t, "127.0.0.1:5432")
	s := newSchema(t, db)
	tbl := qualified(s, "t")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY)`)
	cfg := baseConfig(testenv.Unique("frozen-"), strings.Replace(url, "127.0.0.1:5432", px.addr, 1), auditSchemaFor(t, db), s+".t")
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()
	defer px.freeze(false)
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (1)`)

	px.freeze(true)
	ctx, cancel := context.WithCancel(testCtx(t))
	done := make(chan error, 1)
	go func() {
		_, err := r.tasks[0].Poll(ctx)
		done <- err
	}()
	// The Poll is reading from the frozen server once its query is held.
	await(t, 10*time.Second, func() (bool, string, error) {
		return px.heldBytes() > 0, "the Poll sent nothing to the frozen server within 10s", nil
	})
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Error("the interrupted Poll returned no error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("an interrupted Poll still reads from a server that stopped answering after 10 s")
	}
	px.freeze(false)
	if got := r.collect(1, true); got[0].Op != "c" {
		t.Errorf("after the server answers again: %+v", got[0])
	}
}
