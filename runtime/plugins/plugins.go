// Package plugins holds the connector plugins a worker can run.
package plugins

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// Registry maps connector.class values to plugins. It is safe for concurrent
// use.
type Registry struct {
	mu      sync.RWMutex
	plugins []connect.Plugin
}

// New returns a registry holding ps.
func New(ps ...connect.Plugin) (*Registry, error) {
	r := &Registry{}
	for _, p := range ps {
		if err := r.Register(p); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// Register adds p. Its class and aliases must not be taken.
func (r *Registry) Register(p connect.Plugin) error {
	if p.Class == "" || p.NewConnector == nil || p.NewTask == nil {
		return fmt.Errorf("plugin %q: Class, NewConnector and NewTask are required", p.Class)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, name := range append([]string{p.Class}, p.Aliases...) {
		if _, ok := r.lookup(name); ok {
			return fmt.Errorf("plugin %q: connector.class %q is already registered", p.Class, name)
		}
	}
	r.plugins = append(r.plugins, p)
	return nil
}

// Lookup finds the plugin for a connector.class value: its class, an alias,
// or (as Kafka Connect allows) the class's last dot-separated part with or
// without a "Connector" suffix, case-insensitively.
func (r *Registry) Lookup(class string) (connect.Plugin, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.lookup(class)
}

func (r *Registry) lookup(class string) (connect.Plugin, bool) {
	want := normalize(class)
	for _, p := range r.plugins {
		for _, name := range append([]string{p.Class}, p.Aliases...) {
			if strings.EqualFold(name, class) || normalize(name) == want {
				return p, true
			}
		}
	}
	return connect.Plugin{}, false
}

func normalize(class string) string {
	c := strings.ToLower(class)
	if i := strings.LastIndexByte(c, '.'); i >= 0 {
		c = c[i+1:]
	}
	return strings.TrimSuffix(c, "connector")
}

// List returns the plugins sorted by class.
func (r *Registry) List() []connect.Plugin {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := slices.Clone(r.plugins)
	slices.SortFunc(out, func(a, b connect.Plugin) int { return strings.Compare(a.Class, b.Class) })
	return out
}
