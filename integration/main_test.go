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

// hasCommand reports whether cmd/tidyconnect has Go sources yet, so tests
// that need the binary can say plainly why they cannot run.
func hasCommand() bool {
	m, _ := filepath.Glob(filepath.Join(repoRoot, "cmd", "tidyconnect", "*.go"))
	return len(m) > 0
}

// tidyconnectBinary builds cmd/tidyconnect once per test binary and returns
// its path.
func tidyconnectBinary(t testing.TB) string {
	t.Helper()
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
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
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
