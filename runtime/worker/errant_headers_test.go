package worker

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

type publishError struct{ code int }

func (e *publishError) Error() string { return fmt.Sprintf("broker said %d", e.code) }

// The DLQ's exception headers name the error that caused the failure, not
// fmt's wrapper, and the stack-trace header lists the causes as a Java
// stack trace does (it used to repeat the message).
func TestErrantExceptionHeaders(t *testing.T) {
	root := &publishError{code: 312}
	wrapped := fmt.Errorf("record 7: %w", fmt.Errorf("publishing: %w", root))
	joined := errors.Join(errors.New("first"), wrapped)
	for _, tc := range []struct {
		name      string
		err       error
		class     string
		chainHas  []string
		chainSize int // lines
	}{
		{"plain", errors.New("boom"), "*errors.errorString", []string{"*errors.errorString: boom"}, 1},
		{"wrapped twice", wrapped, "*worker.publishError",
			[]string{"*fmt.wrapError: record 7: publishing: broker said 312", "\nCaused by: *fmt.wrapError: publishing: broker said 312", "\nCaused by: *worker.publishError: broker said 312"}, 3},
		{"joined", joined, "*errors.joinError",
			[]string{"\n\tCaused by: *errors.errorString: first", "\n\tCaused by: *fmt.wrapError: record 7", "\n\tCaused by: *worker.publishError: broker said 312"}, 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := errorClass(tc.err); got != tc.class {
				t.Errorf("errorClass = %s, want %s", got, tc.class)
			}
			chain := errorChain(tc.err)
			for _, s := range tc.chainHas {
				if !strings.Contains(chain, s) {
					t.Errorf("errorChain lacks %q:\n%s", s, chain)
				}
			}
			if n := strings.Count(chain, "\n") + 1; n != tc.chainSize {
				t.Errorf("errorChain has %d lines, want %d:\n%s", n, tc.chainSize, chain)
			}
		})
	}
}
