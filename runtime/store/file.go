package store

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

// File names inside a connector's directory.
const (
	configFile   = "config.json"
	offsetsFile  = "offsets.json"
	ledgerFile   = "ledger.json"
	topicsFile   = "topics.json"
	deletionFile = "deletion.json"
	lockFile     = "LOCK"
)

// File is a Store on a local directory:
//
//	<dir>/LOCK                      held (flock) while the store is open
//	<dir>/connectors/<name>/config.json    connector config, target state, task configs
//	<dir>/connectors/<name>/offsets.json   source offsets
//	<dir>/connectors/<name>/ledger.json    owned resources
//	<dir>/connectors/<name>/topics.json    topics used
//	<dir>/connectors/<name>/deletion.json  deletion intent
//
// <name> is the connector name with unsafe bytes percent-escaped. Every
// write is atomic and durable on return. The whole state is cached in
// memory; reads never touch the disk. File is safe for concurrent use.
type File struct {
	dir  string
	lock *os.File

	mu    sync.Mutex
	conns map[string]*entry
}

type entry struct {
	dir     string
	rec     *ConnectorRecord
	offsets map[string]worker.SourceOffset // by canonical JSON of the partition
	ledger  []connect.Resource
	topics  []string
	intent  *DeletionIntent
}

func (e *entry) empty() bool {
	return e.rec == nil && len(e.offsets) == 0 && len(e.ledger) == 0 && len(e.topics) == 0 && e.intent == nil
}

type offsetsDoc struct {
	Connector string                `json:"connector"`
	Offsets   []worker.SourceOffset `json:"offsets"`
}

type ledgerDoc struct {
	Connector string             `json:"connector"`
	Resources []connect.Resource `json:"resources"`
}

type topicsDoc struct {
	Connector string   `json:"connector"`
	Topics    []string `json:"topics"`
}

var _ Store = (*File)(nil)

// OpenFile opens (creating it if needed) the store in dir. Only one process
// may have a data directory open at a time.
func OpenFile(dir string) (*File, error) {
	root := filepath.Join(dir, "connectors")
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("store: creating data directory %s (check --data-dir and its permissions): %w", dir, err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("store: opening %s: %w", filepath.Join(dir, lockFile), err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		return nil, fmt.Errorf("store: data directory %s is in use by another tidyconnect process (stop it or choose another --data-dir): %w", dir, err)
	}
	f := &File{dir: root, lock: lock, conns: map[string]*entry{}}
	if err := f.load(); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// Close releases the data directory.
func (f *File) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lock == nil {
		return nil
	}
	err := f.lock.Close() // closing the descriptor releases the flock
	f.lock = nil
	return err
}

func (f *File) load() error {
	dirs, err := os.ReadDir(f.dir)
	if err != nil {
		return fmt.Errorf("store: listing %s: %w", f.dir, err)
	}
	for _, d := range dirs {
		if !d.IsDir() {
			continue
		}
		cdir := filepath.Join(f.dir, d.Name())
		if err := removeTemps(cdir); err != nil {
			return err
		}
		e := &entry{dir: cdir, offsets: map[string]worker.SourceOffset{}}
		var names []string
		var rec ConnectorRecord
		if ok, err := readJSON(cdir, configFile, &rec); err != nil {
			return err
		} else if ok {
			e.rec = &rec
			names = append(names, rec.Name)
		}
		var od offsetsDoc
		if ok, err := readJSON(cdir, offsetsFile, &od); err != nil {
			return err
		} else if ok {
			for _, o := range od.Offsets {
				// Decoded with UseNumber (readJSON): exact integers.
				if err := worker.OffsetNumbers(o.Partition); err != nil {
					return fmt.Errorf("store: %s: %w", filepath.Join(cdir, offsetsFile), err)
				}
				if err := worker.OffsetNumbers(o.Offset); err != nil {
					return fmt.Errorf("store: %s: %w", filepath.Join(cdir, offsetsFile), err)
				}
				k, err := partitionKey(o.Partition)
				if err != nil {
					return fmt.Errorf("store: %s: %w", filepath.Join(cdir, offsetsFile), err)
				}
				e.offsets[k] = o
			}
			names = append(names, od.Connector)
		}
		var ld ledgerDoc
		if ok, err := readJSON(cdir, ledgerFile, &ld); err != nil {
			return err
		} else if ok {
			e.ledger = ld.Resources
			names = append(names, ld.Connector)
		}
		var td topicsDoc
		if ok, err := readJSON(cdir, topicsFile, &td); err != nil {
			return err
		} else if ok {
			e.topics = td.Topics
			names = append(names, td.Connector)
		}
		var in DeletionIntent
		if ok, err := readJSON(cdir, deletionFile, &in); err != nil {
			return err
		} else if ok {
			e.intent = &in
			names = append(names, in.Connector)
		}
		if len(names) == 0 {
			continue // an empty directory left by a crash during removal
		}
		name := names[0]
		for _, n := range names[1:] {
			if n != name {
				return fmt.Errorf("store: files in %s name different connectors (%q and %q); the data directory was edited by hand", cdir, name, n)
			}
		}
		if escapeName(name) != d.Name() {
			return fmt.Errorf("store: directory %s holds connector %q, expected directory %s", cdir, name, escapeName(name))
		}
		f.conns[name] = e
	}
	return nil
}

// get returns the entry for name, creating its directory if create is set.
// f.mu must be held.
func (f *File) get(name string, create bool) (*entry, error) {
	if e, ok := f.conns[name]; ok {
		return e, nil
	}
	if !create {
		return nil, nil
	}
	if name == "" {
		return nil, errors.New("store: connector name is empty")
	}
	e := &entry{dir: filepath.Join(f.dir, escapeName(name)), offsets: map[string]worker.SourceOffset{}}
	if err := os.MkdirAll(e.dir, 0o755); err != nil {
		return nil, fmt.Errorf("store: creating %s: %w", e.dir, err)
	}
	if err := syncDir(f.dir); err != nil {
		return nil, err
	}
	f.conns[name] = e
	return e, nil
}

// gc removes the directory of an entry that holds nothing any more.
// f.mu must be held.
func (f *File) gc(name string) error {
	e := f.conns[name]
	if e == nil || !e.empty() {
		return nil
	}
	delete(f.conns, name)
	if err := os.RemoveAll(e.dir); err != nil {
		return fmt.Errorf("store: removing %s: %w", e.dir, err)
	}
	return syncDir(f.dir)
}

// --- Configs

func (f *File) PutConnector(_ context.Context, rec ConnectorRecord) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, err := f.get(rec.Name, true)
	if err != nil {
		return err
	}
	rec = cloneRecord(rec)
	if err := writeJSON(e.dir, configFile, rec); err != nil {
		return err
	}
	e.rec = &rec
	return nil
}

func (f *File) Connector(_ context.Context, name string) (ConnectorRecord, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, _ := f.get(name, false)
	if e == nil || e.rec == nil {
		return ConnectorRecord{}, false, nil
	}
	return cloneRecord(*e.rec), true, nil
}

func (f *File) Connectors(context.Context) ([]ConnectorRecord, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []ConnectorRecord
	for _, e := range f.conns {
		if e.rec != nil {
			out = append(out, cloneRecord(*e.rec))
		}
	}
	slices.SortFunc(out, func(a, b ConnectorRecord) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

func (f *File) DeleteConnector(_ context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, _ := f.get(name, false)
	if e == nil || e.rec == nil {
		return nil
	}
	if err := removeFileDurable(e.dir, configFile); err != nil {
		return err
	}
	e.rec = nil
	return f.gc(name)
}

func cloneRecord(r ConnectorRecord) ConnectorRecord {
	r.Config = r.Config.Clone()
	tasks := make([]connect.Config, len(r.Tasks))
	for i, t := range r.Tasks {
		tasks[i] = t.Clone()
	}
	r.Tasks = tasks
	return r
}

// --- Offsets

// partitionKey is the canonical form of a source partition:
// encoding/json sorts map keys, so equal maps give equal keys.
func partitionKey(p map[string]any) (string, error) {
	b, err := json.Marshal(p)
	if err != nil {
		return "", fmt.Errorf("source partition %v cannot be encoded as JSON: %w", p, err)
	}
	return string(b), nil
}

// normalize gives a value the shape it has after a JSON round trip, so an
// offset read from the cache equals one read after a reopen: whole numbers
// stay exact int64 (worker.DecodeOffsetJSON).
func normalize(m map[string]any) (map[string]any, error) {
	out, err := worker.NormalizeOffset(m)
	if err != nil {
		return nil, fmt.Errorf("offset %w", err)
	}
	return out, nil
}

func (f *File) Get(_ context.Context, connector string, partition map[string]any) (map[string]any, error) {
	// Keyed as Put keys it, by the shape stored: the raw encoding differs
	// for a struct value or a number a JSON round trip changes.
	p, err := normalize(partition)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	k, err := partitionKey(p)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	e, _ := f.get(connector, false)
	if e == nil {
		return nil, nil
	}
	o, ok := e.offsets[k]
	if !ok {
		return nil, nil
	}
	return normalize(o.Offset)
}

// Put merges offsets into the connector's offsets; an offset that is nil
// removes its partition (as Kafka Connect's tombstone does).
func (f *File) Put(_ context.Context, connector string, offsets []worker.SourceOffset) error {
	if len(offsets) == 0 {
		return nil
	}
	type kv struct {
		key string
		o   worker.SourceOffset
	}
	var items []kv
	for _, o := range offsets {
		p, err := normalize(o.Partition)
		if err != nil {
			return fmt.Errorf("store: %w", err)
		}
		// The key of what is stored, as load computes it.
		k, err := partitionKey(p)
		if err != nil {
			return fmt.Errorf("store: %w", err)
		}
		off, err := normalize(o.Offset)
		if err != nil {
			return fmt.Errorf("store: %w", err)
		}
		items = append(items, kv{k, worker.SourceOffset{Partition: p, Offset: off}})
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	// As Own: a late commit from a task that outlived its connector must
	// not recreate the forgotten connector's directory.
	e, _ := f.get(connector, false)
	if e == nil || e.rec == nil {
		return fmt.Errorf("store: refusing to store source offsets for connector %s: %w (it was deleted)", connector, ErrNoConnector)
	}
	next := maps.Clone(e.offsets)
	for _, it := range items {
		if it.o.Offset == nil {
			delete(next, it.key)
		} else {
			next[it.key] = it.o
		}
	}
	if err := f.writeOffsets(e, connector, next); err != nil {
		return err
	}
	e.offsets = next
	return f.gc(connector)
}

func (f *File) writeOffsets(e *entry, connector string, offs map[string]worker.SourceOffset) error {
	if len(offs) == 0 {
		return removeFileDurable(e.dir, offsetsFile)
	}
	return writeJSON(e.dir, offsetsFile, offsetsDoc{Connector: connector, Offsets: sortedOffsets(offs)})
}

func sortedOffsets(m map[string]worker.SourceOffset) []worker.SourceOffset {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([]worker.SourceOffset, 0, len(keys))
	for _, k := range keys {
		out = append(out, m[k])
	}
	return out
}

func (f *File) AllOffsets(_ context.Context, connector string) ([]worker.SourceOffset, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, _ := f.get(connector, false)
	if e == nil {
		return nil, nil
	}
	out := sortedOffsets(e.offsets)
	for i := range out {
		// Hand out copies: callers may modify what they get.
		p, _ := normalize(out[i].Partition)
		o, _ := normalize(out[i].Offset)
		out[i] = worker.SourceOffset{Partition: p, Offset: o}
	}
	return out, nil
}

func (f *File) DeleteOffsets(_ context.Context, connector string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, _ := f.get(connector, false)
	if e == nil {
		return nil
	}
	if err := removeFileDurable(e.dir, offsetsFile); err != nil {
		return err
	}
	e.offsets = map[string]worker.SourceOffset{}
	return f.gc(connector)
}

// --- Ledgers

// Ledger returns a durable ledger for connector.
func (f *File) Ledger(connector string) connect.Ledger { return &fileLedger{f: f, name: connector} }

type fileLedger struct {
	f    *File
	name string
}

// ErrNoConnector is returned by Ledger.Own for a connector without a
// stored config record: it was deleted (or its deletion is forgetting it),
// so ownership recorded now would outlive every cleanup.
var ErrNoConnector = errors.New("connector has no stored configuration")

// Own records r. It refuses a connector whose config record does not exist
// (never created, or forgotten by a deletion) instead of recreating its
// directory: a late Own from a task that outlived its connector would leave
// an orphan ledger that no cleanup reads.
func (l *fileLedger) Own(_ context.Context, r connect.Resource) error {
	l.f.mu.Lock()
	defer l.f.mu.Unlock()
	e, _ := l.f.get(l.name, false)
	if e == nil || e.rec == nil {
		return fmt.Errorf("store: refusing to record ownership of %s for connector %s: %w (it was deleted); drop the resource by hand if it was created", r, l.name, ErrNoConnector)
	}
	if slices.Contains(e.ledger, r) {
		return nil
	}
	next := append(slices.Clone(e.ledger), r)
	if err := writeJSON(e.dir, ledgerFile, ledgerDoc{Connector: l.name, Resources: next}); err != nil {
		return fmt.Errorf("recording ownership of %s for connector %s: %w", r, l.name, err)
	}
	e.ledger = next
	return nil
}

func (l *fileLedger) Release(_ context.Context, r connect.Resource) error {
	l.f.mu.Lock()
	defer l.f.mu.Unlock()
	e, _ := l.f.get(l.name, false)
	if e == nil || !slices.Contains(e.ledger, r) {
		return nil
	}
	next := slices.DeleteFunc(slices.Clone(e.ledger), func(o connect.Resource) bool { return o == r })
	var err error
	if len(next) == 0 {
		err = removeFileDurable(e.dir, ledgerFile)
	} else {
		err = writeJSON(e.dir, ledgerFile, ledgerDoc{Connector: l.name, Resources: next})
	}
	if err != nil {
		return fmt.Errorf("releasing %s for connector %s: %w", r, l.name, err)
	}
	e.ledger = next
	return l.f.gc(l.name)
}

func (l *fileLedger) List(context.Context) ([]connect.Resource, error) {
	l.f.mu.Lock()
	defer l.f.mu.Unlock()
	e, _ := l.f.get(l.name, false)
	if e == nil {
		return nil, nil
	}
	return slices.Clone(e.ledger), nil
}

func (f *File) DeleteLedger(_ context.Context, connector string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, _ := f.get(connector, false)
	if e == nil {
		return nil
	}
	if err := removeFileDurable(e.dir, ledgerFile); err != nil {
		return err
	}
	e.ledger = nil
	return f.gc(connector)
}

// --- Topics

func (f *File) AddTopics(_ context.Context, connector string, topics []string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, _ := f.get(connector, false)
	next := []string{}
	if e != nil {
		next = slices.Clone(e.topics)
	}
	changed := false
	for _, t := range topics {
		if t != "" && !slices.Contains(next, t) {
			next = append(next, t)
			changed = true
		}
	}
	if !changed {
		return nil
	}
	e, err := f.get(connector, true)
	if err != nil {
		return err
	}
	slices.Sort(next)
	if err := writeJSON(e.dir, topicsFile, topicsDoc{Connector: connector, Topics: next}); err != nil {
		return err
	}
	e.topics = next
	return nil
}

func (f *File) Topics(_ context.Context, connector string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, _ := f.get(connector, false)
	if e == nil {
		return nil, nil
	}
	return slices.Clone(e.topics), nil
}

func (f *File) ResetTopics(_ context.Context, connector string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, _ := f.get(connector, false)
	if e == nil {
		return nil
	}
	if err := removeFileDurable(e.dir, topicsFile); err != nil {
		return err
	}
	e.topics = nil
	return f.gc(connector)
}

// --- Intents

func (f *File) PutIntent(_ context.Context, in DeletionIntent) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, err := f.get(in.Connector, true)
	if err != nil {
		return err
	}
	in.Config = in.Config.Clone()
	if err := writeJSON(e.dir, deletionFile, in); err != nil {
		return fmt.Errorf("recording the deletion intent of connector %s: %w", in.Connector, err)
	}
	e.intent = &in
	return nil
}

func (f *File) Intent(_ context.Context, connector string) (DeletionIntent, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, _ := f.get(connector, false)
	if e == nil || e.intent == nil {
		return DeletionIntent{}, false, nil
	}
	in := *e.intent
	in.Config = in.Config.Clone()
	return in, true, nil
}

func (f *File) Intents(context.Context) ([]DeletionIntent, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []DeletionIntent
	for _, e := range f.conns {
		if e.intent != nil {
			in := *e.intent
			in.Config = in.Config.Clone()
			out = append(out, in)
		}
	}
	slices.SortFunc(out, func(a, b DeletionIntent) int { return cmp.Compare(a.Connector, b.Connector) })
	return out, nil
}

func (f *File) DeleteIntent(_ context.Context, connector string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, _ := f.get(connector, false)
	if e == nil || e.intent == nil {
		return nil
	}
	if err := removeFileDurable(e.dir, deletionFile); err != nil {
		return err
	}
	e.intent = nil
	return f.gc(connector)
}

// OrphanLedgers returns the ledgers of connectors that have neither a
// config record nor a deletion intent: resources recorded as owned that no
// deletion will ever drop (left by a version whose deletion could forget a
// connector while one of its tasks still ran). Recreating the connector
// with the same name adopts the ledger; deleting it then drops them.
func (f *File) OrphanLedgers(context.Context) (map[string][]connect.Resource, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string][]connect.Resource{}
	for name, e := range f.conns {
		if e.rec == nil && e.intent == nil && len(e.ledger) > 0 {
			out[name] = slices.Clone(e.ledger)
		}
	}
	return out, nil
}
