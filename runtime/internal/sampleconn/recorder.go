// Package sampleconn holds sample connectors for the runtime's own tests:
// a source and a sink whose every lifecycle call is written to a Recorder,
// with configuration knobs that make them fail, block or own fake resources
// on demand.
package sampleconn

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// Call is one recorded call on one instance.
type Call struct {
	// Instance is "connector/<name>" or "task/<name>/<n>".
	Instance string
	// Method is the call with its arguments as text, e.g. "Start",
	// "Stop(true)", "Stopped", "Put(10)", "Commit(5)", "Flush".
	Method string
	// Err is the error text the call returned, if any.
	Err string
}

func (c Call) String() string { return c.Instance + " " + c.Method }

// ConnectorInstance names a connector instance as the Recorder does.
func ConnectorInstance(name string) string { return "connector/" + name }

// TaskInstance names a task instance as the Recorder does.
func TaskInstance(name string, task int) string { return fmt.Sprintf("task/%s/%d", name, task) }

// Recorder records every call made on sample instances, keeps what sinks
// received and sources got committed, and plays the external system that
// owned resources live in. It is safe for concurrent use.
type Recorder struct {
	mu        sync.Mutex
	calls     []Call
	changed   chan struct{}
	resources map[connect.Resource]bool
	sunk      map[string][]connect.SinkRecord   // by connector
	committed map[string][]connect.SourceRecord // by connector
	release   chan struct{}
	released  bool
}

// NewRecorder returns an empty recorder.
func NewRecorder() *Recorder {
	return &Recorder{
		changed:   make(chan struct{}),
		resources: map[connect.Resource]bool{},
		sunk:      map[string][]connect.SinkRecord{},
		committed: map[string][]connect.SourceRecord{},
		release:   make(chan struct{}),
	}
}

// notify wakes every Await; callers hold r.mu.
func (r *Recorder) notify() {
	close(r.changed)
	r.changed = make(chan struct{})
}

func (r *Recorder) record(instance, method string, err error) {
	c := Call{Instance: instance, Method: method}
	if err != nil {
		c.Err = err.Error()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, c)
	r.notify()
}

// Calls returns every recorded call in order.
func (r *Recorder) Calls() []Call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

// CallsOf returns the calls of one instance, in order, as "Method" strings.
func (r *Recorder) CallsOf(instance string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, c := range r.calls {
		if c.Instance == instance {
			out = append(out, c.Method)
		}
	}
	return out
}

// Count returns how many times call ("<instance> <Method>", as Call.String
// prints it) was recorded.
func (r *Recorder) Count(call string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.calls {
		if c.String() == call {
			n++
		}
	}
	return n
}

// CountPrefix returns how many recorded calls start with prefix, e.g.
// "task/x/0 Put(" for every Put.
func (r *Recorder) CountPrefix(prefix string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.calls {
		if strings.HasPrefix(c.String(), prefix) {
			n++
		}
	}
	return n
}

// Index returns the position of the first occurrence of call in the
// recording, or -1.
func (r *Recorder) Index(call string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.IndexFunc(r.calls, func(c Call) bool { return c.String() == call })
}

// LastIndex returns the position of the last occurrence of call, or -1.
func (r *Recorder) LastIndex(call string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.calls) - 1; i >= 0; i-- {
		if r.calls[i].String() == call {
			return i
		}
	}
	return -1
}

// Await waits until pred returns true (it is re-evaluated after every
// recorded change) or ctx is done; it returns ctx's error then.
func (r *Recorder) Await(ctx context.Context, pred func(r *Recorder) bool) error {
	for {
		r.mu.Lock()
		ch := r.changed
		r.mu.Unlock()
		if pred(r) {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("awaiting a recorder condition: %w", ctx.Err())
		}
	}
}

// AwaitCall waits until call has been recorded at least n times.
func (r *Recorder) AwaitCall(ctx context.Context, call string, n int) error {
	err := r.Await(ctx, func(r *Recorder) bool { return r.Count(call) >= n })
	if err != nil {
		return fmt.Errorf("%q recorded %d time(s), want %d: %w", call, r.Count(call), n, err)
	}
	return nil
}

// ReleaseBlocked releases every call blocked by sample.block=ignore-ctx, now
// and in the future.
func (r *Recorder) ReleaseBlocked() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.released {
		r.released = true
		close(r.release)
	}
}

// Resources returns the fake external resources that currently exist.
func (r *Recorder) Resources() []connect.Resource {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []connect.Resource
	for res := range r.resources {
		out = append(out, res)
	}
	slices.SortFunc(out, func(a, b connect.Resource) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// ResourceExists reports whether the fake resource named name exists.
func (r *Recorder) ResourceExists(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.resources[resource(name)]
}

// CreateResource creates a fake resource outside any connector (a resource
// that "already existed"), so tests can check it is never owned or dropped.
func (r *Recorder) CreateResource(name string) connect.Resource {
	res := resource(name)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.resources[res] = true
	r.notify()
	return res
}

func (r *Recorder) createResource(res connect.Resource) (created bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.resources[res] {
		return false
	}
	r.resources[res] = true
	r.notify()
	return true
}

func (r *Recorder) dropResource(res connect.Resource) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.resources, res)
	r.notify()
}

// Sunk returns the records sample sinks of connector received through Put.
func (r *Recorder) Sunk(connector string) []connect.SinkRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.sunk[connector])
}

// Committed returns the records sample sources of connector got through
// Commit, in order.
func (r *Recorder) Committed(connector string) []connect.SourceRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.committed[connector])
}

func (r *Recorder) addSunk(connector string, recs []connect.SinkRecord) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sunk[connector] = append(r.sunk[connector], recs...)
	r.notify()
}

func (r *Recorder) addCommitted(connector string, recs []connect.SourceRecord) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.committed[connector] = append(r.committed[connector], recs...)
	r.notify()
}

func (r *Recorder) releaseCh() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.release
}

// ResourceKind is the Kind of every fake resource.
const ResourceKind = "sample.resource"

func resource(name string) connect.Resource {
	return connect.Resource{Kind: ResourceKind, Name: name, Location: "memory"}
}
