package integration

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// End-to-end benchmarks of the chain PostgreSQL -> pgaudit -> Kafka ->
// amqpsink -> RabbitMQ through a tidyconnect worker process. Run with
//
//	go test -run '^$' -bench 'Chain' -benchtime 5000x ./integration/
//
// (`make bench` runs them with the default benchtime). Figures are in
// docs/walkthrough.md.

// BenchmarkChainLatency1k writes b.N single-row inserts at a steady 1,000
// changes/s (10 rows per 10ms) and reports the
// commit-in-PostgreSQL to message-in-RabbitMQ latency percentiles.
func BenchmarkChainLatency1k(b *testing.B) {
	c := newChain(b)
	c.deploy()
	col := c.collect(c.queue("customers"))
	committed := make(map[string]time.Time, b.N) // name -> commit returned

	// 10 rows per 10ms, one INSERT statement (one transaction) per tick:
	// one commit per row would measure PostgreSQL's fsync, not the chain.
	const perTick, tick = 10, 10 * time.Millisecond
	b.ResetTimer()
	start := time.Now()
	next := start
	for i := 0; i < b.N; i += perTick {
		next = next.Add(tick)
		n := min(perTick, b.N-i)
		c.exec("INSERT INTO "+c.table("customers")+" (name, email) SELECT 'lat-' || g, 'lat-' || g || $3 FROM generate_series($1::int, $2::int) AS g",
			i, i+n-1, "-"+c.id+"@example.com")
		at := time.Now()
		for j := i; j < i+n; j++ {
			committed[fmt.Sprintf("lat-%d", j)] = at
		}
		if d := time.Until(next); d > 0 {
			time.Sleep(d) // pacing the writer is the point: a steady rate
		}
	}
	rate := float64(b.N) / time.Since(start).Seconds()
	if !eventually(2*time.Minute, func() bool { msgs, _ := col.snapshot(); return len(msgs) >= b.N }) {
		msgs, _ := col.snapshot()
		b.Fatalf("%d of %d changes arrived within 2 minutes of the last commit", len(msgs), b.N)
	}
	b.StopTimer()

	msgs, _ := col.snapshot()
	var lat []time.Duration
	seen := map[string]bool{}
	for _, m := range msgs {
		name := m.name()
		at, ok := committed[name]
		if !ok || seen[name] {
			continue
		}
		seen[name] = true
		lat = append(lat, m.at.Sub(at))
	}
	if len(lat) < b.N {
		b.Fatalf("only %d distinct changes of %d matched a commit", len(lat), b.N)
	}
	slices.Sort(lat)
	pct := func(p float64) float64 {
		return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max-ms")
	b.ReportMetric(rate, "written-changes/s") // below 1000 means PostgreSQL could not keep the pace
}

// BenchmarkChainThroughput writes b.N rows as fast as PostgreSQL takes them
// (1,000-row statements) and reports how many changes per second reach
// RabbitMQ, from the first commit to the last message.
func BenchmarkChainThroughput(b *testing.B) {
	c := newChain(b)
	c.deploy("poll.max.records", "1000") // the default batch size
	col := c.collect(c.queue("customers"))

	const batch = 1000
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i += batch {
		n := min(batch, b.N-i)
		c.exec("INSERT INTO "+c.table("customers")+" (name, email) SELECT 'tp-' || g, 'tp-' || g || $3 FROM generate_series($1::int, $2::int) AS g",
			i, i+n-1, "-"+c.id+"@example.com")
	}
	writeDone := time.Since(start)
	if !eventually(5*time.Minute, func() bool { msgs, _ := col.snapshot(); return len(msgs) >= b.N }) {
		msgs, _ := col.snapshot()
		b.Fatalf("%d of %d changes arrived within 5 minutes", len(msgs), b.N)
	}
	b.StopTimer()
	msgs, _ := col.snapshot()
	last := msgs[len(msgs)-1].at
	elapsed := last.Sub(start)
	distinct := map[string]bool{}
	for _, m := range msgs {
		if strings.HasPrefix(m.name(), "tp-") {
			distinct[m.name()] = true
		}
	}
	if len(distinct) < b.N {
		b.Fatalf("only %d distinct changes of %d arrived", len(distinct), b.N)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "changes/s")
	b.ReportMetric(float64(b.N)/writeDone.Seconds(), "pg-writes/s")
}
