package rest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/herder"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

// Wire shapes, field for field as Kafka Connect's Jackson classes write them.

// clusterInfoDTO is Kafka's ServerInfo. Version is the Kafka Connect
// release whose API is served (KafkaConnectVersion); tidyconnect's own
// build version is the extension tidyconnect_version.
type clusterInfoDTO struct {
	Version            string `json:"version"`
	Commit             string `json:"commit"`
	KafkaClusterID     string `json:"kafka_cluster_id"`
	TidyconnectVersion string `json:"tidyconnect_version,omitempty"`
}

type taskIDDTO struct {
	Connector string `json:"connector"`
	Task      int    `json:"task"`
}

type connectorInfoDTO struct {
	Name   string         `json:"name"`
	Config connect.Config `json:"config"`
	Tasks  []taskIDDTO    `json:"tasks"`
	Type   string         `json:"type"`
}

func infoDTO(i herder.ConnectorInfo) connectorInfoDTO {
	out := connectorInfoDTO{Name: i.Name, Config: i.Config, Tasks: []taskIDDTO{}, Type: typeName(i.Type)}
	if out.Config == nil {
		out.Config = connect.Config{}
	}
	for _, t := range i.Tasks {
		out.Tasks = append(out.Tasks, taskIDDTO{Connector: t.Connector, Task: t.Task})
	}
	return out
}

// typeName keeps type inside Kafka's enum: source, sink or unknown.
func typeName(t connect.ConnectorType) string {
	switch t {
	case connect.TypeSource, connect.TypeSink:
		return string(t)
	}
	return string(connect.TypeUnknown)
}

type connectorStateDTO struct {
	State    string `json:"state"`
	WorkerID string `json:"worker_id"`
	Trace    string `json:"trace,omitempty"`
	// Abandoned (extension) marks an instance that did not return within
	// the graceful timeout.
	Abandoned bool `json:"abandoned,omitempty"`
}

type taskStateDTO struct {
	ID        int    `json:"id"`
	State     string `json:"state"`
	WorkerID  string `json:"worker_id"`
	Trace     string `json:"trace,omitempty"`
	Abandoned bool   `json:"abandoned,omitempty"`
}

type resourceDTO struct {
	Kind     string `json:"kind"`
	Name     string `json:"name"`
	Location string `json:"location"`
}

func resourcesDTO(rs []connect.Resource) []resourceDTO {
	out := make([]resourceDTO, 0, len(rs))
	for _, r := range rs {
		out = append(out, resourceDTO{Kind: r.Kind, Name: r.Name, Location: r.Location})
	}
	return out
}

type deletionDTO struct {
	Phase     string        `json:"phase"`
	Remaining []resourceDTO `json:"remaining"`
	Error     string        `json:"error,omitempty"`
	Attempts  int           `json:"attempts"`
	StartedAt *time.Time    `json:"started_at,omitempty"`
}

type connectorStatusDTO struct {
	Name      string            `json:"name"`
	Connector connectorStateDTO `json:"connector"`
	Tasks     []taskStateDTO    `json:"tasks"`
	Type      string            `json:"type"`
	// Deletion (extension) is present only while a deletion is pending or
	// has failed.
	Deletion *deletionDTO `json:"deletion,omitempty"`
}

// connectorState keeps a connector state inside Kafka's enum.
func connectorState(s worker.State) string {
	switch s {
	case worker.StateUnassigned, worker.StateRunning, worker.StatePaused, worker.StateStopped,
		worker.StateFailed, worker.StateRestarting:
		return string(s)
	}
	return string(worker.StateUnassigned)
}

// taskState keeps a task state inside Kafka's enum, which has no STOPPED:
// Kafka reports the tasks of a stopped connector by leaving them out; a
// task that is somehow STOPPED reads as UNASSIGNED (not running anywhere).
func taskState(s worker.State) string {
	switch s {
	case worker.StateUnassigned, worker.StateRunning, worker.StatePaused,
		worker.StateFailed, worker.StateRestarting:
		return string(s)
	}
	return string(worker.StateUnassigned)
}

func taskStatusDTO(t herder.TaskStatus) taskStateDTO {
	return taskStateDTO{ID: t.ID, State: taskState(t.State), WorkerID: t.WorkerID, Trace: scrub(t.Trace), Abandoned: t.Abandoned}
}

func statusDTO(s herder.ConnectorStatus) connectorStatusDTO {
	out := connectorStatusDTO{
		Name: s.Name,
		Connector: connectorStateDTO{
			State: connectorState(s.Connector.State), WorkerID: s.Connector.WorkerID,
			Trace: scrub(s.Connector.Trace), Abandoned: s.Connector.Abandoned,
		},
		Tasks: make([]taskStateDTO, 0, len(s.Tasks)),
		Type:  typeName(s.Type),
	}
	for _, t := range s.Tasks {
		out.Tasks = append(out.Tasks, taskStatusDTO(t))
	}
	if d := s.Deletion; d != nil {
		dd := &deletionDTO{Phase: d.Phase, Remaining: resourcesDTO(d.Remaining), Error: scrub(d.Error), Attempts: d.Attempts}
		if !d.StartedAt.IsZero() {
			t := d.StartedAt.UTC()
			dd.StartedAt = &t
		}
		out.Deletion = dd
	}
	return out
}

type taskInfoDTO struct {
	ID     taskIDDTO      `json:"id"`
	Config connect.Config `json:"config"`
}

type offsetsDTO struct {
	Offsets []offsetDTO `json:"offsets"`
}

type offsetDTO struct {
	Partition map[string]any `json:"partition"`
	Offset    map[string]any `json:"offset"`
}

type messageDTO struct {
	Message string `json:"message"`
}

type topicsDTO struct {
	Topics []string `json:"topics"`
}

type pluginDTO struct {
	Class   string `json:"class"`
	Type    string `json:"type"`
	Version string `json:"version,omitempty"`
}

// configKeyDTO is Kafka's ConfigKeyInfo. default_value is left out (Kafka
// writes null) for a key without a default; see decision 0031.
type configKeyDTO struct {
	Name          string   `json:"name"`
	Type          string   `json:"type"`
	Required      bool     `json:"required"`
	DefaultValue  *string  `json:"default_value,omitempty"`
	Importance    string   `json:"importance"`
	Documentation string   `json:"documentation"`
	Group         string   `json:"group"`
	Width         string   `json:"width"`
	DisplayName   string   `json:"display_name"`
	Dependents    []string `json:"dependents"`
	Order         int      `json:"order"`
}

func configKeyInfo(k connect.ConfigKey) configKeyDTO {
	out := configKeyDTO{
		Name:          k.Name,
		Type:          string(k.Type),
		Required:      k.Required,
		Importance:    string(k.Importance),
		Documentation: k.Doc,
		Group:         k.Group,
		Width:         string(k.Width),
		DisplayName:   k.DisplayName,
		Dependents:    []string{},
		Order:         k.Order,
	}
	if out.Type == "" {
		out.Type = string(connect.TypeString)
	}
	// Kafka's ConfigDef always has an importance; MEDIUM is the neutral
	// answer for a key that did not say.
	if out.Importance == "" {
		out.Importance = string(connect.ImportanceMedium)
	}
	if out.Width == "" {
		out.Width = string(connect.WidthNone)
	}
	if out.DisplayName == "" {
		out.DisplayName = k.Name
	}
	if !k.Required {
		d := k.Default
		if k.Type == connect.TypePassword && d != "" {
			d = connect.HiddenValue
		}
		out.DefaultValue = &d
	}
	return out
}

type configValueDTO struct {
	Name              string   `json:"name"`
	Value             *string  `json:"value,omitempty"`
	RecommendedValues []string `json:"recommended_values"`
	Errors            []string `json:"errors"`
	Visible           bool     `json:"visible"`
}

type configInfoDTO struct {
	Definition configKeyDTO   `json:"definition"`
	Value      configValueDTO `json:"value"`
}

type validationDTO struct {
	Name       string          `json:"name"`
	ErrorCount int             `json:"error_count"`
	Groups     []string        `json:"groups"`
	Configs    []configInfoDTO `json:"configs"`
}

func validationResult(v herder.Validation) validationDTO {
	out := validationDTO{Name: v.Name, ErrorCount: v.ErrorCount, Groups: slices.Clone(v.Groups), Configs: []configInfoDTO{}}
	if out.Groups == nil {
		out.Groups = []string{}
	}
	for _, k := range v.Configs {
		val := configValueDTO{
			Name:              k.Definition.Name,
			Value:             k.Value,
			RecommendedValues: slices.Clone(k.Definition.Recommended),
			Errors:            slices.Clone(k.Errors),
			Visible:           k.Visible,
		}
		if val.RecommendedValues == nil {
			val.RecommendedValues = []string{}
		}
		if val.Errors == nil {
			val.Errors = []string{}
		}
		// A plugin's message may quote a connection URL or DSN, as a
		// create's 400 may: masked alike.
		for i, e := range val.Errors {
			val.Errors[i] = scrub(e)
		}
		// The herder masks secrets; mask again so a herder bug cannot leak.
		if val.Value != nil {
			masked := connect.ConfigDef{k.Definition}.Mask(connect.Config{k.Definition.Name: *val.Value})[k.Definition.Name]
			val.Value = &masked
		}
		out.Configs = append(out.Configs, configInfoDTO{Definition: configKeyInfo(k.Definition), Value: val})
	}
	return out
}

// configErrorMessage lists every bad field, sorted, in Kafka's wording.
func configErrorMessage(e *herder.ConfigError) string {
	keys := make([]string, 0, len(e.Fields))
	for k := range e.Fields {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	n := 0
	for _, k := range keys {
		n += max(1, len(e.Fields[k]))
	}
	fmt.Fprintf(&b, "Connector configuration is invalid and contains the following %d error(s):", n)
	for _, k := range keys {
		msgs := e.Fields[k]
		if len(msgs) == 0 {
			fmt.Fprintf(&b, "\n%s: invalid value", k)
		}
		for _, m := range msgs {
			if strings.Contains(m, k) {
				fmt.Fprintf(&b, "\n%s", m)
			} else {
				fmt.Fprintf(&b, "\n%s: %s", k, m)
			}
		}
	}
	b.WriteString("\nYou can also find the above list of errors at the endpoint `/connector-plugins/{connectorType}/config/validate`")
	return b.String()
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		status = http.StatusInternalServerError
		buf.Reset()
		fmt.Fprintf(&buf, `{"error_code":500,"message":%q}`+"\n", "encoding the response failed: "+err.Error())
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// writeEmpty answers a status without a body, still declaring JSON: strict
// clients check the header on every response.
func writeEmpty(w http.ResponseWriter, status int) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
}

var (
	urlInText = regexp.MustCompile(`[A-Za-z][A-Za-z0-9+.\-]*://[^\s"'<>]+`)
	// A backslash escapes the next character of an unquoted DSN value,
	// a space included (libpq, pgx): password=top\ secret is one value.
	dsnInText = regexp.MustCompile(`(?i)(\b(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|(?:[^\s;,\\]|\\[\s\S]?)+)`)
)

// scrub masks credentials inside free text (error messages, traces): a
// connector's error may quote a connection URL or DSN, and the text goes to
// clients and to the log.
func scrub(s string) string {
	if !strings.Contains(s, "://") && !strings.Contains(strings.ToLower(s), "password") {
		return s
	}
	s = urlInText.ReplaceAllStringFunc(s, connect.MaskCredentials)
	return dsnInText.ReplaceAllString(s, "${1}"+connect.MaskedPassword)
}
