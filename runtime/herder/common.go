package herder

import (
	"fmt"
	"slices"
	"strings"
	"unicode"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

// Common configuration keys every connector accepts (runtime/worker
// defines them; these aliases keep herder users' imports short).
const (
	KeyName           = worker.KeyName
	KeyConnectorClass = worker.KeyConnectorClass
	KeyTasksMax       = worker.KeyTasksMax
	KeyTopics         = worker.KeyTopics
	KeyTopicsRegex    = worker.KeyTopicsRegex
)

// commonGroup is the display group of the runtime's main common keys.
const commonGroup = "Common"

// CommonConfigDef returns the keys every connector of type t accepts, as the
// validate endpoint shows them: the worker's, which it also enforces.
func CommonConfigDef(t connect.ConnectorType) connect.ConfigDef {
	return worker.CommonConfigDef(t)
}

// ValidateName checks a connector name as Kafka Connect does, and also
// rejects what cannot appear in a REST path segment. It returns a message
// saying what to fix, or "".
func ValidateName(name string) string {
	switch {
	case strings.TrimSpace(name) == "":
		return "Connector name must not be empty; set \"name\""
	case strings.Contains(name, "/"):
		return fmt.Sprintf("Connector name %q must not contain '/'; choose a name without it", name)
	case name == "." || name == "..":
		return fmt.Sprintf("Connector name %q is not allowed; choose another name", name)
	case strings.TrimSpace(name) != name:
		return fmt.Sprintf("Connector name %q must not start or end with whitespace", name)
	case slices.ContainsFunc([]rune(name), unicode.IsControl):
		return fmt.Sprintf("Connector name %q must not contain control characters", name)
	case len(name) > 249:
		return fmt.Sprintf("Connector name is %d bytes long; use at most 249 bytes", len(name))
	}
	return ""
}

// mergeErrs adds every message of from into into.
func mergeErrs(into, from map[string][]string) {
	for k, msgs := range from {
		for _, m := range msgs {
			if !slices.Contains(into[k], m) {
				into[k] = append(into[k], m)
			}
		}
	}
}
