package herder

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// Common configuration keys every connector accepts.
const (
	KeyName           = "name"
	KeyConnectorClass = "connector.class"
	KeyTasksMax       = "tasks.max"
	KeyTopics         = "topics"
	KeyTopicsRegex    = "topics.regex"
)

// commonGroup is the display group of the runtime's common keys.
const commonGroup = "Common"

// CommonConfigDef returns the keys every connector of type t accepts, as the
// validate endpoint shows them.
func CommonConfigDef(t connect.ConnectorType) connect.ConfigDef {
	def := connect.ConfigDef{
		{Name: KeyName, Type: connect.TypeString, Doc: "Globally unique name to use for this connector.", Group: commonGroup, DisplayName: "Connector name", Importance: connect.ImportanceHigh, Width: connect.WidthMedium, Order: 1},
		{Name: KeyConnectorClass, Type: connect.TypeString, Required: true, Doc: "Name or alias of the connector plugin.", Group: commonGroup, DisplayName: "Connector class", Importance: connect.ImportanceHigh, Width: connect.WidthLong, Order: 2},
		{Name: KeyTasksMax, Type: connect.TypeInt, Default: "1", Doc: "Maximum number of tasks to use for this connector.", Group: commonGroup, DisplayName: "Tasks max", Importance: connect.ImportanceHigh, Width: connect.WidthShort, Order: 3, Validate: func(v string) error {
			if n, _ := strconv.Atoi(strings.TrimSpace(v)); n < 1 {
				return fmt.Errorf("must be at least 1")
			}
			return nil
		}},
		{Name: "task.shutdown.graceful.timeout.ms", Type: connect.TypeLong, Doc: "How long a stop waits for a task before it is cancelled and abandoned.", Group: commonGroup, Importance: connect.ImportanceLow, Width: connect.WidthShort, Order: 6, Validate: nonNegative},
		{Name: "errors.tolerance", Type: connect.TypeString, Default: "none", Doc: "none: a failing record fails the task; all: skip it (and send it to the dead-letter queue if one is set).", Group: commonGroup, Importance: connect.ImportanceMedium, Width: connect.WidthShort, Order: 7, Recommended: []string{"none", "all"}, Validate: func(v string) error {
			if v != "none" && v != "all" {
				return fmt.Errorf("must be none or all")
			}
			return nil
		}},
	}
	switch t {
	case connect.TypeSink:
		def = append(def,
			connect.ConfigKey{Name: KeyTopics, Type: connect.TypeList, Doc: "Topics to consume (set this or topics.regex).", Group: commonGroup, DisplayName: "Topics", Importance: connect.ImportanceHigh, Width: connect.WidthLong, Order: 4},
			connect.ConfigKey{Name: KeyTopicsRegex, Type: connect.TypeString, Doc: "Regular expression of the topics to consume (set this or topics).", Group: commonGroup, DisplayName: "Topics regex", Importance: connect.ImportanceHigh, Width: connect.WidthLong, Order: 5, Validate: func(v string) error {
				_, err := regexp.Compile(v)
				return err
			}},
			connect.ConfigKey{Name: "errors.deadletterqueue.topic.name", Type: connect.TypeString, Doc: "Topic that records the task could not deliver go to when errors.tolerance=all.", Group: commonGroup, Importance: connect.ImportanceMedium, Width: connect.WidthMedium, Order: 8},
		)
	case connect.TypeSource:
		def = append(def,
			connect.ConfigKey{Name: "offset.flush.interval.ms", Type: connect.TypeLong, Doc: "How often acknowledged source offsets are stored.", Group: commonGroup, Importance: connect.ImportanceLow, Width: connect.WidthShort, Order: 8, Validate: nonNegative},
		)
	}
	return def
}

func nonNegative(v string) error {
	if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil && n < 0 {
		return fmt.Errorf("must be 0 or more")
	}
	return nil
}

// validateCommon adds the cross-key checks a ConfigDef cannot express.
func validateCommon(t connect.ConnectorType, cfg connect.Config, errs map[string][]string) {
	if t != connect.TypeSink {
		return
	}
	topics, regex := len(cfg.List(KeyTopics)) > 0, strings.TrimSpace(cfg[KeyTopicsRegex]) != ""
	switch {
	case topics && regex:
		msg := "Set only one of topics and topics.regex."
		errs[KeyTopics] = append(errs[KeyTopics], msg)
		errs[KeyTopicsRegex] = append(errs[KeyTopicsRegex], msg)
	case !topics && !regex:
		msg := "A sink connector needs topics or topics.regex: set one of them."
		errs[KeyTopics] = append(errs[KeyTopics], msg)
		errs[KeyTopicsRegex] = append(errs[KeyTopicsRegex], msg)
	}
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
