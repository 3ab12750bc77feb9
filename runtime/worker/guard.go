package worker

import (
	"errors"
	"fmt"
	"runtime/debug"
)

// panicError is a panic in connector code turned into an error, so that the
// instance fails (FAILED, with the stack in its trace, then Stop and
// Stopped) instead of the whole process dying with every other connector:
// Kafka Connect's WorkerTask catches Throwable for the same reason.
type panicError struct {
	call  string
	value any
	stack []byte
}

func (e *panicError) Error() string {
	return fmt.Sprintf("%s panicked: %v\n%s", e.call, e.value, e.stack)
}

// guard runs f, a call into connector code named call, and returns its
// error, or a *panicError if it panicked.
func guard(call string, f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &panicError{call: call, value: r, stack: debug.Stack()}
		}
	}()
	return f()
}

func isPanic(err error) bool {
	var pe *panicError
	return errors.As(err, &pe)
}
