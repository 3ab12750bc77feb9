package integration

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// tcpProxy forwards 127.0.0.1:<port> to a target; down closes the listener
// and every forwarded connection (the system is unreachable: connection
// refused), up listens on the same port again.
type tcpProxy struct {
	t      testing.TB
	target string
	addr   string

	mu    sync.Mutex
	ln    net.Listener
	conns []net.Conn
	wg    sync.WaitGroup
}

func newTCPProxy(t testing.TB, target string) *tcpProxy {
	t.Helper()
	p := &tcpProxy{t: t, target: target}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy: %v", err)
	}
	p.addr = ln.Addr().String()
	p.serve(ln)
	t.Cleanup(func() { p.down(); p.wg.Wait() })
	return p
}

func (p *tcpProxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", p.target)
			if err != nil {
				in.Close()
				continue
			}
			p.mu.Lock()
			if p.ln != ln { // went down meanwhile
				p.mu.Unlock()
				in.Close()
				out.Close()
				return
			}
			p.conns = append(p.conns, in, out)
			p.mu.Unlock()
			for _, pair := range [][2]net.Conn{{in, out}, {out, in}} {
				p.wg.Go(func() {
					_, _ = io.Copy(pair[0], pair[1])
					pair[0].Close()
					pair[1].Close()
				})
			}
		}
	})
}

func (p *tcpProxy) down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func (p *tcpProxy) up() {
	p.t.Helper()
	var ln net.Listener
	if !eventually(10*time.Second, func() bool {
		var err error
		ln, err = net.Listen("tcp", p.addr)
		return err == nil
	}) {
		p.t.Fatalf("proxy: listening on %s again failed", p.addr)
	}
	p.serve(ln)
}

// viaProxy returns the PostgreSQL URL with its host replaced by a proxy in
// front of it.
func (c *chain) viaProxy() (*tcpProxy, string) {
	c.t.Helper()
	u, err := url.Parse(c.pgURL)
	if err != nil {
		c.t.Fatalf("parsing the PostgreSQL URL: %v", err)
	}
	p := newTCPProxy(c.t, u.Host)
	u.Host = p.addr
	return p, u.String()
}

// TestDeletionWhileDatabaseDownCompletesAfterRestart: a DELETE while
// PostgreSQL is unreachable fails and leaves the connector visible, being
// deleted; the worker is stopped (SIGTERM), the database comes back, and
// the restarted worker completes the deletion: every object it owned is
// gone, the user's tables and rows stay.
func TestDeletionWhileDatabaseDownCompletesAfterRestart(t *testing.T) {
	c := newChain(t)
	proxy, pgURL := c.viaProxy()
	cfg := c.srcConfig()
	cfg["postgres.url"] = pgURL
	c.api.create(c.src, cfg)
	c.api.awaitRunning(c.src)
	if len(c.ownedObjects(c.src)) == 0 {
		t.Fatal("pgaudit owns nothing after its start")
	}
	customers := c.count("customers")

	proxy.down()
	ctx, cancel := context.WithTimeout(c.ctx, time.Minute)
	defer cancel()
	code, body, err := c.api.do(ctx, http.MethodDelete, "/connectors/"+c.src, nil)
	if err != nil || code == http.StatusNoContent || code == http.StatusOK {
		t.Fatalf("DELETE while PostgreSQL is down = %d %s, %v; want a failure", code, body, err)
	}
	s, found, err := c.api.status(c.src)
	if err != nil || !found || s.Deletion == nil || len(s.Deletion.Remaining) == 0 {
		t.Fatalf("after the failed DELETE: status %+v (found %v, %v); want it visible with its deletion and remaining objects", s, found, err)
	}

	c.w.terminate()
	proxy.up()
	c.w.restart()
	c.api.awaitGone(c.src, 60*time.Second)
	if left := c.ownedObjects(c.src); len(left) > 0 {
		t.Errorf("after the deletion completed these owned objects remain: %v", left)
	}
	if c.schemaExists(c.auditSchema) {
		t.Errorf("audit schema %s survived", c.auditSchema)
	}
	for _, tbl := range []string{"customers", "orders"} {
		if got := c.triggersOn(tbl); len(got) != 0 {
			t.Errorf("triggers left on %s: %v", tbl, got)
		}
	}
	if got := c.count("customers"); got != customers {
		t.Errorf("customers has %d rows, want %d", got, customers)
	}
}

// TestSIGKILLDuringBlockedProvisioning: the worker is killed while a
// connector's Start is blocked on a lock half-way through provisioning (a
// create, a reconfiguration adding a table, one removing a table). After a
// restart the connector runs with the stored config, the ledger lists
// exactly the capture triggers the catalogs show, and a deletion drops
// every object it owned.
func TestSIGKILLDuringBlockedProvisioning(t *testing.T) {
	for _, tc := range []struct {
		name    string
		initial string // tables of a connector created first ("": none)
		// lock is taken on orders, in a transaction held until the kill,
		// so that the operation's CREATE or DROP TRIGGER waits for it.
		lock   func(c *chain) string
		tables string // of the operation
		want   map[string]bool
	}{
		{"create", "", func(c *chain) string {
			return "INSERT INTO " + c.table("orders") + " (customer_id, amount) SELECT min(id), 1 FROM " + c.table("customers")
		}, "customers,orders",
			map[string]bool{"customers": true, "orders": true}},
		{"reconfiguration adding a table", "customers", func(c *chain) string {
			return "INSERT INTO " + c.table("orders") + " (customer_id, amount) SELECT min(id), 1 FROM " + c.table("customers")
		}, "customers,orders",
			map[string]bool{"customers": true, "orders": true}},
		{"reconfiguration removing a table", "customers,orders", func(c *chain) string { return "LOCK TABLE " + c.table("orders") + " IN ACCESS SHARE MODE" }, "customers",
			map[string]bool{"customers": true, "orders": false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newChain(t)
			tables := func(list string) string {
				var out []string
				for _, tbl := range strings.Split(list, ",") {
					out = append(out, c.schema+"."+tbl)
				}
				return strings.Join(out, ",")
			}
			cfg := c.srcConfig()
			if tc.initial != "" {
				cfg["tables"] = tables(tc.initial)
				c.api.create(c.src, cfg)
				c.api.awaitRunning(c.src)
			}

			blocker, err := c.pg.Begin(c.ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer blocker.Rollback(context.Background()) //nolint:errcheck // released below on the normal path
			if _, err := blocker.Exec(c.ctx, tc.lock(c)); err != nil {
				t.Fatal(err)
			}

			cfg["tables"] = tables(tc.tables)
			var wg sync.WaitGroup
			defer wg.Wait()
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				// Cut off by the kill: that is the point.
				if tc.initial == "" {
					_, _, _ = c.api.do(ctx, http.MethodPost, "/connectors", map[string]any{"name": c.src, "config": cfg})
				} else {
					_, _, _ = c.api.do(ctx, http.MethodPut, "/connectors/"+c.src+"/config", cfg)
				}
			})
			if !eventually(30*time.Second, func() bool {
				var waiting int
				_ = c.pg.QueryRow(c.ctx, "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = $1::regclass", c.table("orders")).Scan(&waiting)
				return waiting > 0
			}) {
				t.Fatal("the operation never waited for the lock on orders")
			}
			c.w.kill()
			if err := blocker.Rollback(c.ctx); err != nil {
				t.Fatal(err)
			}

			c.w.restart()
			c.api.awaitRunning(c.src)
			rs := c.api.resources(c.src)
			for tbl, want := range tc.want {
				got := c.triggersOn(tbl)
				if want != (len(got) > 0) {
					t.Errorf("triggers on %s after the restart: %v, want some: %v", tbl, got, want)
				}
				var listed []string
				for _, r := range rs {
					if r.Kind == "postgres.trigger" && strings.HasSuffix(r.Location, `."`+tbl+`"`) {
						listed = append(listed, r.Name)
					}
				}
				slices.Sort(listed)
				if !slices.Equal(listed, got) {
					t.Errorf("the ledger lists triggers %v on %s, the catalogs show %v", listed, tbl, got)
				}
			}

			c.api.delete(c.src)
			c.api.awaitGone(c.src, 30*time.Second)
			if left := c.ownedObjects(c.src); len(left) > 0 {
				t.Errorf("after the deletion these owned objects remain: %v", left)
			}
			if c.schemaExists(c.auditSchema) {
				t.Errorf("audit schema %s survived", c.auditSchema)
			}
			for _, tbl := range []string{"customers", "orders"} {
				if got := c.triggersOn(tbl); len(got) != 0 {
					t.Errorf("triggers left on %s: %v", tbl, got)
				}
			}
		})
	}
}
