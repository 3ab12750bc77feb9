package sampleconn

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// Plugin classes.
const (
	SourceClass = "sample-source"
	SinkClass   = "sample-sink"
)

// Configuration keys understood by the sample connectors and tasks.
const (
	KeyTopic        = "sample.topic"         // source: topic to produce to (required)
	KeyCount        = "sample.count"         // source: records per source partition; -1 = unbounded
	KeyBatch        = "sample.batch.size"    // source: records per Poll
	KeyRate         = "sample.rate"          // source: records/s per task; 0 = unlimited
	KeyPartitions   = "sample.partitions"    // source: source partitions per task
	KeyValueSize    = "sample.value.size"    // source: bytes per value (0 = a short text)
	KeyFailStart    = "sample.fail.start"    // connector and tasks: Start returns an error
	KeyFailTask     = "sample.fail.task"     // with fail.start/fail.after: only this task number (-1 = all)
	KeyFailAfter    = "sample.fail.after"    // Poll/Put fails once this many records went through; -1 = never
	KeyBlock        = "sample.block"         // none | until-ctx | ignore-ctx: how Poll/Put blocks
	KeyBlockAfter   = "sample.block.after"   // block once this many records went through
	KeyBlockStart   = "sample.block.start"   // none | until-ctx | ignore-ctx: how Start blocks
	KeyResources    = "sample.resources"     // fake resources owned at Start (list)
	KeyFailStopped  = "sample.fail.stopped"  // Stopped returns an error (resources kept)
	KeyFlushUpTo    = "sample.flush.upto"    // sink: Flush reports offsets below this one only; -1 = all
	KeyFlushAhead   = "sample.flush.ahead"   // sink: Flush reports this much past what it was given (a buggy task)
	KeyErrant       = "sample.errant.value"  // sink: records with this value go to Host.Errors.Report
	KeyBlockFlush   = "sample.block.flush"   // sink: Flush after Stop blocks until the test releases it (ignores ctx)
	KeyFailOpen     = "sample.fail.open"     // sink: PartitionAware.Open returns an error
	KeyBlockStopped = "sample.block.stopped" // connector and tasks: Stopped blocks until the test releases it (ignores ctx)
	KeyBlockStop    = "sample.block.stop"    // connector and tasks: Stop blocks until the test releases it (a buggy plugin)
	KeyPanic        = "sample.panic"         // connector and tasks: this call panics (a buggy plugin); see PanicCalls
	KeyTaskID       = "sample.task.id"       // set by TaskConfigs
	KeyPassword     = "sample.password"      // a secret, for masking tests
	KeyURL          = "sample.url"           // a URL that may hold credentials
)

// Block modes.
const (
	BlockNone      = "none"
	BlockUntilCtx  = "until-ctx"
	BlockIgnoreCtx = "ignore-ctx"
)

func nonNegative(v string) error {
	n, err := strconv.Atoi(v)
	if err == nil && n < 0 {
		return errors.New("must be 0 or more")
	}
	return nil
}

func atLeast(min int) func(string) error {
	return func(v string) error {
		n, err := strconv.Atoi(v)
		if err == nil && n < min {
			return fmt.Errorf("must be %d or more", min)
		}
		return nil
	}
}

func oneOf(vals ...string) func(string) error {
	return func(v string) error {
		for _, ok := range vals {
			if v == ok {
				return nil
			}
		}
		return fmt.Errorf("must be one of %v", vals)
	}
}

func commonDef() connect.ConfigDef {
	return connect.ConfigDef{
		{Name: KeyFailStart, Type: connect.TypeBoolean, Default: "false", Doc: "Start returns an error.", Importance: connect.ImportanceLow},
		{Name: KeyFailTask, Type: connect.TypeInt, Default: "-1", Doc: "Limits sample.fail.* and sample.block to this task number; -1 means every task.", Importance: connect.ImportanceLow, Validate: atLeast(-1)},
		{Name: KeyFailAfter, Type: connect.TypeInt, Default: "-1", Doc: "Poll/Put returns an error once this many records went through; -1 never.", Importance: connect.ImportanceLow, Validate: atLeast(-1)},
		{Name: KeyBlock, Type: connect.TypeString, Default: BlockNone, Doc: "How Poll/Put blocks: none, until-ctx (until its context is cancelled) or ignore-ctx (until the test releases it).", Importance: connect.ImportanceLow, Recommended: []string{BlockNone, BlockUntilCtx, BlockIgnoreCtx}, Validate: oneOf(BlockNone, BlockUntilCtx, BlockIgnoreCtx)},
		{Name: KeyBlockStart, Type: connect.TypeString, Default: BlockNone, Doc: "How Start blocks: none, until-ctx (until its context is cancelled, then fails) or ignore-ctx (until the test releases it, then succeeds).", Importance: connect.ImportanceLow, Recommended: []string{BlockNone, BlockUntilCtx, BlockIgnoreCtx}, Validate: oneOf(BlockNone, BlockUntilCtx, BlockIgnoreCtx)},
		{Name: KeyBlockAfter, Type: connect.TypeInt, Default: "0", Doc: "Blocking starts once this many records went through.", Importance: connect.ImportanceLow, Validate: nonNegative},
		{Name: KeyResources, Type: connect.TypeList, Doc: "Names of fake resources each instance owns from Start; dropped in Stopped after Stop(true).", Importance: connect.ImportanceMedium},
		{Name: KeyFailStopped, Type: connect.TypeBoolean, Default: "false", Doc: "Stopped returns an error and keeps its resources.", Importance: connect.ImportanceLow},
		{Name: KeyBlockStopped, Type: connect.TypeBoolean, Default: "false", Doc: "Stopped blocks, ignoring its context, until the test releases it (a slow cleanup).", Importance: connect.ImportanceLow},
		{Name: KeyBlockStop, Type: connect.TypeBoolean, Default: "false", Doc: "Stop blocks until the test releases it, against the contract (limited by sample.fail.task).", Importance: connect.ImportanceLow},
		{Name: KeyPanic, Type: connect.TypeString, Default: "", Doc: "The call that panics (limited by sample.fail.task): one of " + strings.Join(PanicCalls, ", ") + ", or empty for none.", Importance: connect.ImportanceLow, Validate: oneOf(append([]string{""}, PanicCalls...)...)},
		{Name: KeyPassword, Type: connect.TypePassword, Doc: "A secret that must never be shown.", Importance: connect.ImportanceLow},
		{Name: KeyURL, Type: connect.TypeString, Secret: true, Doc: "A URL whose credentials must be masked.", Importance: connect.ImportanceLow},
	}
}

// SourceConfigDef is the configuration of sample-source.
func SourceConfigDef() connect.ConfigDef {
	return append(connect.ConfigDef{
		{Name: KeyTopic, Type: connect.TypeString, Required: true, Doc: "Topic the records go to.", Importance: connect.ImportanceHigh},
		{Name: KeyCount, Type: connect.TypeLong, Default: "100", Doc: "Records per source partition; -1 for unbounded.", Importance: connect.ImportanceMedium, Validate: atLeast(-1)},
		{Name: KeyBatch, Type: connect.TypeInt, Default: "10", Doc: "Records per Poll.", Importance: connect.ImportanceLow, Validate: atLeast(1)},
		{Name: KeyRate, Type: connect.TypeInt, Default: "0", Doc: "Records per second per task; 0 for unlimited.", Importance: connect.ImportanceLow, Validate: nonNegative},
		{Name: KeyPartitions, Type: connect.TypeInt, Default: "1", Doc: "Source partitions per task.", Importance: connect.ImportanceLow, Validate: atLeast(1)},
		{Name: KeyValueSize, Type: connect.TypeInt, Default: "0", Doc: "Value size in bytes; 0 for a short text.", Importance: connect.ImportanceLow, Validate: nonNegative},
	}, commonDef()...)
}

// SinkConfigDef is the configuration of sample-sink.
func SinkConfigDef() connect.ConfigDef {
	return append(connect.ConfigDef{
		{Name: KeyFlushUpTo, Type: connect.TypeLong, Default: "-1", Doc: "Flush reports offsets only below this one (per partition); -1 for everything put.", Importance: connect.ImportanceLow, Validate: atLeast(-1)},
		{Name: KeyFlushAhead, Type: connect.TypeLong, Default: "0", Doc: "Flush reports offsets this far past what was put (a buggy task, for tests).", Importance: connect.ImportanceLow, Validate: atLeast(0)},
		{Name: KeyBlockFlush, Type: connect.TypeBoolean, Default: "false", Doc: "A Flush after Stop blocks, ignoring its context, until the test releases it (a slow final flush).", Importance: connect.ImportanceLow},
		{Name: KeyFailOpen, Type: connect.TypeBoolean, Default: "false", Doc: "PartitionAware.Open returns an error (limited by sample.fail.task).", Importance: connect.ImportanceLow},
		{Name: KeyErrant, Type: connect.TypeString, Doc: "Records with exactly this value are reported as errant (Host.Errors) instead of stored.", Importance: connect.ImportanceLow},
	}, commonDef()...)
}

// Plugins returns sample-source and sample-sink, recording to rec.
func Plugins(rec *Recorder) []connect.Plugin {
	return []connect.Plugin{
		{
			Class:        SourceClass,
			Aliases:      []string{"SampleSource"},
			NewConnector: func() connect.Connector { return &Connector{lifecycle: lifecycle{rec: rec}, typ: connect.TypeSource} },
			NewTask:      func() connect.Task { return &SourceTask{baseTask: baseTask{lifecycle: lifecycle{rec: rec}}} },
		},
		{
			Class:        SinkClass,
			Aliases:      []string{"SampleSink"},
			NewConnector: func() connect.Connector { return &Connector{lifecycle: lifecycle{rec: rec}, typ: connect.TypeSink} },
			NewTask:      func() connect.Task { return &SinkTask{baseTask: baseTask{lifecycle: lifecycle{rec: rec}}} },
		},
	}
}

// PanicCalls are the calls sample.panic can name.
var PanicCalls = []string{"Start", "TaskConfigs", "Poll", "Commit", "Put", "Flush", "Stop", "Stopped"}

// knobs are the parsed settings shared by connectors and tasks.
type knobs struct {
	failStart, failStopped bool
	blockStopped           bool
	blockStop              bool
	panicAt                string
	failTask               int
	failAfter              int
	block                  string
	blockAfter             int
	blockStart             string
	resources              []string
}

func parseKnobs(def connect.ConfigDef, cfg connect.Config) (knobs, error) {
	if errs := def.Validate(cfg); len(errs) > 0 {
		return knobs{}, fmt.Errorf("sample connector config is invalid: %v", errs)
	}
	cfg = def.WithDefaults(cfg)
	var k knobs
	k.failStart, _ = cfg.Bool(KeyFailStart, false)
	k.failStopped, _ = cfg.Bool(KeyFailStopped, false)
	k.blockStopped, _ = cfg.Bool(KeyBlockStopped, false)
	k.blockStop, _ = cfg.Bool(KeyBlockStop, false)
	k.panicAt = cfg.String(KeyPanic)
	k.failTask, _ = cfg.Int(KeyFailTask, -1)
	k.failAfter, _ = cfg.Int(KeyFailAfter, -1)
	k.block = cfg.String(KeyBlock)
	k.blockAfter, _ = cfg.Int(KeyBlockAfter, 0)
	k.blockStart = cfg.String(KeyBlockStart)
	k.resources = cfg.List(KeyResources)
	return k, nil
}

// applies says whether the fail/block knobs apply to task number task (-1 is
// the connector, to which only fail.start and fail.stopped apply).
func (k knobs) applies(task int) bool { return k.failTask < 0 || k.failTask == task }

// lifecycle is the Start/Stop/Stopped part shared by connectors and tasks.
type lifecycle struct {
	rec *Recorder
	// instance and host are set at the top of Start, before anything can
	// call Stop (which may then run concurrently with the rest of Start).
	instance string
	host     *connect.Host
	knobs    knobs

	mu         sync.Mutex
	deleted    bool
	stopCalled bool     // Stop was called
	prefix     []string // name prefixes of the fake resources Stopped drops
}

func (l *lifecycle) start(ctx context.Context, instance string, def connect.ConfigDef, cfg connect.Config, prefix string, drop ...string) error {
	l.mu.Lock()
	l.host = connect.HostFrom(ctx)
	l.instance = instance
	l.prefix = append([]string{prefix}, drop...)
	l.mu.Unlock()
	k, err := parseKnobs(def, cfg)
	if err != nil {
		l.rec.record(instance, "Start", err)
		return err
	}
	l.mu.Lock()
	l.knobs = k // under mu: Stop may run concurrently with Start
	l.mu.Unlock()
	l.maybePanic("Start")
	if k.failStart && k.applies(l.host.Task) {
		err := fmt.Errorf("%s: Start failed as %s asked", instance, KeyFailStart)
		l.rec.record(instance, "Start", err)
		return err
	}
	if k.applies(l.host.Task) {
		switch k.blockStart {
		case BlockUntilCtx:
			l.rec.record(instance, "Start blocking", nil)
			<-ctx.Done()
			err := fmt.Errorf("%s: Start interrupted: %w", instance, ctx.Err())
			l.rec.record(instance, "Start", err)
			return err
		case BlockIgnoreCtx:
			l.rec.record(instance, "Start blocking", nil)
			<-l.rec.releaseCh()
		}
	}
	// Own before create, and only what we create (contract rule 1).
	if !l.host.CleanupOnly {
		for _, name := range k.resources {
			res := resource(prefix + name)
			if l.rec.ResourceExists(res.Name) {
				continue
			}
			if err := l.host.Ledger.Own(ctx, res); err != nil {
				err = fmt.Errorf("%s: owning %v: %w", instance, res, err)
				l.rec.record(instance, "Start", err)
				return err
			}
			l.rec.createResource(res)
		}
	}
	l.rec.record(instance, "Start", nil)
	return nil
}

func (l *lifecycle) stop(deleted bool) {
	l.mu.Lock()
	if deleted {
		l.deleted = true
	}
	l.stopCalled = true
	inst, k, host := l.instance, l.knobs, l.host
	l.mu.Unlock()
	l.rec.record(inst, fmt.Sprintf("Stop(%t)", deleted), nil)
	if host != nil && k.applies(host.Task) {
		if k.blockStop {
			l.rec.record(inst, "Stop blocking", nil)
			<-l.rec.releaseCh()
		}
		if k.panicAt == "Stop" {
			panic(fmt.Sprintf("%s: Stop panics as %s asked", inst, KeyPanic))
		}
	}
}

// maybePanic panics if sample.panic names call (for this instance). Only
// after Start parsed the knobs; Stop has its own check.
func (l *lifecycle) maybePanic(call string) {
	if l.knobs.panicAt == call && l.knobs.applies(l.host.Task) {
		l.rec.record(l.instance, call+" panicking", nil)
		panic(fmt.Sprintf("%s: %s panics as %s asked", l.instance, call, KeyPanic))
	}
}

func (l *lifecycle) stopped(ctx context.Context) error {
	if l.host != nil {
		l.maybePanic("Stopped")
	}
	if l.knobs.blockStopped {
		l.rec.record(l.instance, "Stopped blocking", nil)
		<-l.rec.releaseCh()
	}
	l.mu.Lock()
	deleted := l.deleted
	l.mu.Unlock()
	var err error
	switch {
	case l.knobs.failStopped:
		err = fmt.Errorf("%s: Stopped failed as %s asked", l.instance, KeyFailStopped)
	case deleted && l.host != nil:
		err = l.dropOwned(ctx)
	}
	l.rec.record(l.instance, "Stopped", err)
	return err
}

// dropOwned drops what the ledger lists for this instance (prefix), as a
// real connector would.
func (l *lifecycle) dropOwned(ctx context.Context) error {
	owned, err := l.host.Ledger.List(ctx)
	if err != nil {
		return fmt.Errorf("%s: listing owned resources: %w", l.instance, err)
	}
	for _, res := range owned {
		if res.Kind != ResourceKind || !slices.ContainsFunc(l.prefix, func(p string) bool { return strings.HasPrefix(res.Name, p) }) {
			continue
		}
		l.rec.dropResource(res)
		if err := l.host.Ledger.Release(ctx, res); err != nil {
			return fmt.Errorf("%s: releasing %v: %w", l.instance, res, err)
		}
	}
	return nil
}

// Connector is the sample connector instance (source or sink).
type Connector struct {
	typ connect.ConnectorType
	lifecycle
	cfg connect.Config
}

func (c *Connector) Spec() connect.Spec {
	def := SinkConfigDef()
	if c.typ == connect.TypeSource {
		def = SourceConfigDef()
	}
	return connect.Spec{Type: c.typ, Version: "0.1.0", Doc: "Sample " + string(c.typ) + " connector for the runtime's tests.", Config: def}
}

func (c *Connector) Start(ctx context.Context, cfg connect.Config) error {
	c.cfg = cfg.Clone()
	name := connect.HostFrom(ctx).Connector
	// The connector drops what its tasks left behind too: it is the last to
	// stop on a deletion.
	return c.start(ctx, ConnectorInstance(name), c.Spec().Config, cfg, ConnectorInstance(name)+"/", "task/"+name+"/")
}

func (c *Connector) TaskConfigs(maxTasks int) ([]connect.Config, error) {
	c.maybePanic("TaskConfigs")
	c.rec.record(c.instance, fmt.Sprintf("TaskConfigs(%d)", maxTasks), nil)
	out := make([]connect.Config, maxTasks)
	for i := range out {
		tc := c.cfg.Clone()
		tc[KeyTaskID] = strconv.Itoa(i)
		out[i] = tc
	}
	return out, nil
}

func (c *Connector) Stop(deleted bool) { c.stop(deleted) }

func (c *Connector) Stopped(ctx context.Context) error { return c.stopped(ctx) }

// baseTask is what the sample source and sink tasks share.
type baseTask struct {
	lifecycle
	seen int // records that went through Poll/Put
}

func (t *baseTask) startTask(ctx context.Context, def connect.ConfigDef, cfg connect.Config) error {
	h := connect.HostFrom(ctx)
	inst := TaskInstance(h.Connector, h.Task)
	return t.start(ctx, inst, def, cfg, inst+"/")
}

// maybeFailOrBlock applies fail.after and block before a Poll/Put that
// would take the count to seen+n.
func (t *baseTask) maybeFailOrBlock(ctx context.Context, method string) error {
	k := t.knobs
	if !k.applies(t.host.Task) {
		return nil
	}
	if k.failAfter >= 0 && t.seen >= k.failAfter {
		return fmt.Errorf("%s: %s failed after %d records as %s asked", t.instance, method, t.seen, KeyFailAfter)
	}
	if k.block != BlockNone && t.seen >= k.blockAfter {
		t.rec.record(t.instance, method+" blocking", nil)
		switch k.block {
		case BlockUntilCtx:
			<-ctx.Done()
			return ctx.Err()
		case BlockIgnoreCtx:
			<-t.rec.releaseCh()
			return ctx.Err()
		}
	}
	return nil
}
