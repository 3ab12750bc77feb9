package plugins

import (
	"strings"
	"testing"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

func plugin(class string, aliases ...string) connect.Plugin {
	return connect.Plugin{
		Class: class, Aliases: aliases,
		NewConnector: func() connect.Connector { return nil },
		NewTask:      func() connect.Task { return nil },
	}
}

func TestLookup(t *testing.T) {
	r, err := New(plugin("pgaudit", "io.tidyconnect.pgaudit.PgAuditSourceConnector"), plugin("amqpsink"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		class string
		want  string
	}{
		{"pgaudit", "pgaudit"},
		{"PGAUDIT", "pgaudit"},
		{"io.tidyconnect.pgaudit.PgAuditSourceConnector", "pgaudit"},
		{"PgAuditSourceConnector", "pgaudit"},
		{"amqpsink", "amqpsink"},
		{"com.example.AmqpSinkConnector", "amqpsink"},
		{"nosuch", ""},
		{"", ""},
	}
	for _, tt := range tests {
		p, ok := r.Lookup(tt.class)
		if ok != (tt.want != "") || p.Class != tt.want {
			t.Errorf("Lookup(%q) = %q, %v; want %q", tt.class, p.Class, ok, tt.want)
		}
	}
	list := r.List()
	if len(list) != 2 || list[0].Class != "amqpsink" || list[1].Class != "pgaudit" {
		t.Errorf("List not sorted by class: %v", list)
	}
}

func TestRegisterRejects(t *testing.T) {
	r, _ := New(plugin("pgaudit", "audit"))
	tests := []struct {
		name string
		p    connect.Plugin
		want string
	}{
		{"taken class", plugin("pgaudit"), "already registered"},
		{"taken alias", plugin("other", "audit"), "already registered"},
		{"no class", plugin(""), "required"},
		{"no factories", connect.Plugin{Class: "x"}, "required"},
	}
	for _, tt := range tests {
		if err := r.Register(tt.p); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Register = %v, want error containing %q", tt.name, err, tt.want)
		}
	}
}
