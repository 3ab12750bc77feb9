package store

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// tmpMarker is part of every temporary file name, so that a file left behind
// by a crash between create and rename is recognised and ignored.
const tmpMarker = ".tmp-"

// writeFileAtomic replaces dir/name with data so that a reader (or a process
// restarted after a crash) sees either the old or the new content, never a
// mix: write a temporary file in the same directory, fsync it, rename it over
// the target, then fsync the directory so the rename itself is durable.
func writeFileAtomic(dir, name string, data []byte) error {
	f, err := os.CreateTemp(dir, "."+name+tmpMarker+"*")
	if err != nil {
		return fmt.Errorf("store: creating a temporary file in %s (check the data directory is writable): %w", dir, err)
	}
	tmp := f.Name()
	cleanup := func() { _ = os.Remove(tmp) }
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		cleanup()
		return fmt.Errorf("store: writing %s (is the disk full?): %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		cleanup()
		return fmt.Errorf("store: syncing %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		cleanup()
		return fmt.Errorf("store: closing %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		cleanup()
		return fmt.Errorf("store: renaming %s into place: %w", tmp, err)
	}
	return syncDir(dir)
}

// removeFileDurable removes dir/name (absent is fine) and makes the removal
// durable.
func removeFileDurable(dir, name string) error {
	err := os.Remove(filepath.Join(dir, name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("store: removing %s: %w", filepath.Join(dir, name), err)
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("store: opening directory %s to sync it: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("store: syncing directory %s: %w", dir, err)
	}
	return nil
}

// writeJSON marshals v and writes it atomically.
func writeJSON(dir, name string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("store: encoding %s: %w", name, err)
	}
	return writeFileAtomic(dir, name, append(data, '\n'))
}

// readJSON reads dir/name into v; ok is false when the file does not exist.
func readJSON(dir, name string, v any) (ok bool, err error) {
	data, err := os.ReadFile(filepath.Join(dir, name))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("store: reading %s: %w", filepath.Join(dir, name), err)
	}
	// UseNumber: numbers in offsets must come back exact (load turns them
	// into int64 or float64); the other files hold none in untyped fields.
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return false, fmt.Errorf("store: %s is corrupt (%s): %w", filepath.Join(dir, name), corruptAdvice(name), err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return false, fmt.Errorf("store: %s is corrupt (%s): data after the JSON value", filepath.Join(dir, name), corruptAdvice(name))
	}
	return true, nil
}

// corruptAdvice says what to do about a corrupt store file, which depends on
// what removing it would lose.
func corruptAdvice(name string) string {
	switch name {
	case "ledger.json":
		return "restore it from a backup or repair the JSON by hand: removing it means no deletion ever drops the external resources it lists, so drop those by hand first"
	case "deletion.json":
		return "restore it from a backup or repair the JSON by hand: removing it abandons a deletion that has not finished, whose resources stay in ledger.json"
	case "offsets.json":
		return "restore it from a backup or repair the JSON by hand: removing it makes the connector's source tasks start again from the beginning"
	case "config.json":
		// Without it the connector is forgotten, but its ledger stays: an
		// orphan that no deletion reads.
		return "restore it from a backup or repair the JSON by hand: removing it forgets the connector (unless deletion.json holds its deletion), and no deletion then drops the resources its ledger.json lists unless a connector is created again under the same name (which adopts them) and deleted"
	case "topics.json":
		return "restore it from a backup, repair the JSON by hand, or remove it: that only forgets which topics the connector used (GET /connectors/{name}/topics)"
	}
	return "restore it from a backup or repair the JSON by hand"
}

// removeTemps deletes temporary files a crash left in dir.
func removeTemps(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("store: listing %s: %w", dir, err)
	}
	for _, e := range entries {
		if !e.IsDir() && strings.HasPrefix(e.Name(), ".") && strings.Contains(e.Name(), tmpMarker) {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
	return nil
}

// maxDirName keeps escaped names well below the usual 255-byte limit of a
// path component.
const maxDirName = 200

// escapeName turns a connector name into a directory name that is safe on
// any file system and distinct for distinct names: bytes outside
// [A-Za-z0-9_.-] become %XX, and so does a leading dot. A name whose escaped
// form is too long is cut and suffixed with "~" and a hash of the whole
// name ("~" never appears otherwise: it is escaped).
func escapeName(name string) string {
	e := escapeBytes(name)
	if len(e) <= maxDirName {
		return e
	}
	sum := sha256.Sum256([]byte(name))
	return e[:maxDirName-33] + "~" + hex.EncodeToString(sum[:16])
}

func escapeBytes(name string) string {
	var b strings.Builder
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '-':
			b.WriteByte(c)
		case c == '.' && i > 0:
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}
