package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestReadConnectorFileSkipsAByteOrderMark: a connector file is a POST
// /connectors body, and the REST API skips a UTF-8 byte order mark before
// one (Windows editors write it, as Kafka Connect's Jackson skips it). The
// file reader refused the same body at start-up ("invalid character 'ï'").
func TestReadConnectorFileSkipsAByteOrderMark(t *testing.T) {
	p := filepath.Join(t.TempDir(), "bom.json")
	if err := os.WriteFile(p, []byte("\ufeff"+`{"name":"c1","config":{"connector.class":"pgaudit"},"initial_state":"PAUSED"}`+"\r\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cf, err := readConnectorFile(p)
	if err != nil {
		t.Fatalf("a file with a byte order mark: %v", err)
	}
	if cf.name != "c1" || cf.config["connector.class"] != "pgaudit" || cf.initial != "PAUSED" {
		t.Fatalf("read %+v", cf)
	}
}
