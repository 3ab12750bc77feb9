package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// repoRoot is the module root, relative to this package's directory (the
// working directory of `go test`).
const repoRoot = ".."

var (
	binDir string

	buildOnce sync.Once
	binPath   string
	buildErr  error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "tidyconnect-integration-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "creating a temp dir for the tidyconnect binary:", err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// BinaryEnv names a prebuilt tidyconnect binary to test instead of building
// ./cmd/tidyconnect (e.g. the release artifact).
const BinaryEnv = "TIDYCONNECT_TEST_BINARY"

// hasCommand reports whether there is a binary to test: cmd/tidyconnect has
// Go sources, or BinaryEnv names one. Tests that need the binary skip
// without it, saying why.
func hasCommand() bool {
	if os.Getenv(BinaryEnv) != "" {
		return true
	}
	m, _ := filepath.Glob(filepath.Join(repoRoot, "cmd", "tidyconnect", "*.go"))
	return len(m) > 0
}

// tidyconnectBinary builds cmd/tidyconnect once per test binary and returns
// its path.
func tidyconnectBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv(BinaryEnv); p != "" {
		return p
	}
	if !hasCommand() {
		t.Fatalf("cmd/tidyconnect has no Go sources: the tidyconnect binary cannot be built")
	}
	buildOnce.Do(func() {
		goTool, err := exec.LookPath("go")
		if err != nil {
			buildErr = fmt.Errorf("the go tool is not on PATH: %w", err)
			return
		}
		out := filepath.Join(binDir, "tidyconnect")
		cmd := exec.Command(goTool, "build", "-o", out, "./cmd/tidyconnect")
		cmd.Dir = repoRoot
		// Default build settings, not the release flags: the test needs the
		// behaviour, and this reuses the build cache of `go vet`/`go test`
		// (CGO_ENABLED=0 would recompile every dependency).
		if b, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/tidyconnect: %w\n%s", err, b)
			return
		}
		binPath = out
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}
