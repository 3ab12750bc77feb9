package connect

import (
	"context"
	"slices"
	"sync"
)

// MemoryLedger is a Ledger kept in memory: for tests and for instances run
// outside a runtime. The zero value is not usable; call NewMemoryLedger.
type MemoryLedger struct {
	mu    sync.Mutex
	owned []Resource
}

// NewMemoryLedger returns an empty ledger.
func NewMemoryLedger() *MemoryLedger { return &MemoryLedger{} }

func (l *MemoryLedger) Own(_ context.Context, r Resource) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !slices.Contains(l.owned, r) {
		l.owned = append(l.owned, r)
	}
	return nil
}

func (l *MemoryLedger) Release(_ context.Context, r Resource) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.owned = slices.DeleteFunc(l.owned, func(o Resource) bool { return o == r })
	return nil
}

// List returns the owned resources in the order they were first owned.
func (l *MemoryLedger) List(context.Context) ([]Resource, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.owned), nil
}
