package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
)

// MemoryOffsetStore is an OffsetStore kept in memory, for tests and for
// running without durable offsets. Offsets round-trip through JSON, as a
// durable store would give them back (DecodeOffsetJSON: whole numbers as
// int64, others as float64).
type MemoryOffsetStore struct {
	mu   sync.Mutex
	data map[string]map[string]json.RawMessage // connector -> partition JSON -> offset JSON
	puts int
}

// NewMemoryOffsetStore returns an empty store.
func NewMemoryOffsetStore() *MemoryOffsetStore {
	return &MemoryOffsetStore{data: map[string]map[string]json.RawMessage{}}
}

func (s *MemoryOffsetStore) Get(_ context.Context, connector string, partition map[string]any) (map[string]any, error) {
	key, err := json.Marshal(partition)
	if err != nil {
		return nil, fmt.Errorf("offset store: source partition %v is not JSON-encodable: %w", partition, err)
	}
	s.mu.Lock()
	raw, ok := s.data[connector][string(key)]
	s.mu.Unlock()
	if !ok {
		return nil, nil
	}
	out, err := DecodeOffsetJSON(raw)
	if err != nil {
		return nil, fmt.Errorf("offset store: decoding offset of %s: %w", key, err)
	}
	return out, nil
}

func (s *MemoryOffsetStore) Put(_ context.Context, connector string, offsets []SourceOffset) error {
	type kv struct{ k, v []byte }
	enc := make([]kv, 0, len(offsets))
	for _, o := range offsets {
		k, err := json.Marshal(o.Partition)
		if err != nil {
			return fmt.Errorf("offset store: source partition %v is not JSON-encodable: %w", o.Partition, err)
		}
		v, err := json.Marshal(o.Offset)
		if err != nil {
			return fmt.Errorf("offset store: source offset %v is not JSON-encodable: %w", o.Offset, err)
		}
		enc = append(enc, kv{k, v})
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.data[connector] == nil {
		s.data[connector] = map[string]json.RawMessage{}
	}
	for _, e := range enc {
		s.data[connector][string(e.k)] = e.v
	}
	s.puts++
	return nil
}

// All returns every stored offset of connector.
func (s *MemoryOffsetStore) All(connector string) []SourceOffset {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []SourceOffset
	for k, v := range s.data[connector] {
		var o SourceOffset
		o.Partition, _ = DecodeOffsetJSON([]byte(k))
		o.Offset, _ = DecodeOffsetJSON(v)
		out = append(out, o)
	}
	return out
}

// Puts returns how many Put calls succeeded.
func (s *MemoryOffsetStore) Puts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.puts
}
