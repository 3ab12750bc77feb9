package testenv

import (
	"runtime"
	"strings"
	"testing"
	"time"
)

// allStacks returns the stack of every goroutine, one string each.
func allStacks() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Split(string(buf[:n]), "\n\n")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// goroutineID is the id in a stack's first line, "goroutine 123 [state]:".
func goroutineID(stack string) string {
	f := strings.Fields(stack)
	if len(f) < 2 {
		return ""
	}
	return f[1]
}

// GoroutineIDs returns the ids of the goroutines running now, for
// AwaitNoNewGoroutines.
func GoroutineIDs() map[string]bool {
	ids := map[string]bool{}
	for _, g := range allStacks() {
		ids[goroutineID(g)] = true
	}
	return ids
}

// AwaitNoNewGoroutines waits up to timeout until no goroutine that was not
// in before, and whose stack owned accepts, is left; then it fails t with
// their stacks, saying they outlived what. Goroutines running the test's
// own code (a _test.go file in their stack) never count.
func AwaitNoNewGoroutines(t testing.TB, before map[string]bool, what string, timeout time.Duration, owned func(stack string) bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var left []string
		for _, g := range allStacks() {
			if !before[goroutineID(g)] && !strings.Contains(g, "_test.go") && owned(g) {
				left = append(left, g)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutine(s) outlived %s:\n%s", len(left), what, strings.Join(left, "\n\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
