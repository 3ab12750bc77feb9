package store

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestCorruptFileSaysWhatRemovingItCosts: every state file the start
// refuses as corrupt is named with what removing it would cost, as
// decision 0020 promises. A corrupt config.json said only "restore it or
// repair it", yet removing it (the obvious way out) forgets the connector
// and leaves its ledger to no deletion; a corrupt topics.json, whose
// removal costs nothing that matters, did not say that either.
func TestCorruptFileSaysWhatRemovingItCosts(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		file string
		want string
	}{
		{configFile, "no deletion then drops the resources its ledger.json lists"},
		{offsetsFile, "start again from the beginning"},
		{ledgerFile, "drop those by hand"},
		{topicsFile, "only forgets which topics the connector used"},
		{deletionFile, "abandons a deletion"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			dir := t.TempDir()
			f := openT(t, dir)
			if err := f.PutConnector(ctx, ConnectorRecord{Name: "c", Config: connect.Config{"connector.class": "X"}}); err != nil {
				t.Fatal(err)
			}
			for _, name := range []string{offsetsFile, ledgerFile, topicsFile, deletionFile} {
				// Any content: the file is overwritten below.
				if err := writeJSON(filepath.Join(dir, "connectors", "c"), name, map[string]string{"connector": "c"}); err != nil {
					t.Fatal(err)
				}
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(dir, "connectors", "c", tc.file)
			if err := os.WriteFile(p, []byte(`{"connector":`), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := OpenFile(dir)
			if err == nil || !strings.Contains(err.Error(), tc.file) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("opening with a corrupt %s: %v; want the file named and %q", tc.file, err, tc.want)
			}
		})
	}
}
