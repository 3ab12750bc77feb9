package rest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/herder"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

func (s *server) root(w http.ResponseWriter, r *http.Request) error {
	ci, err := s.api.ClusterInfo(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, clusterInfoDTO{Version: KafkaConnectVersion, Commit: ci.Commit, KafkaClusterID: ci.KafkaClusterID, TidyconnectVersion: ci.Version})
	return nil
}

type expandedDTO struct {
	Status *connectorStatusDTO `json:"status,omitempty"`
	Info   *connectorInfoDTO   `json:"info,omitempty"`
}

func (s *server) listConnectors(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	names, err := s.api.Connectors(ctx)
	if err != nil {
		return err
	}
	names = slices.Clone(names)
	slices.Sort(names)
	var withStatus, withInfo bool
	expand := r.URL.Query()["expand"]
	for _, v := range expand {
		// Exact values, as Kafka matches them; Kafka ignores others but
		// still answers a map.
		switch v {
		case "status":
			withStatus = true
		case "info":
			withInfo = true
		}
	}
	if len(expand) == 0 {
		if names == nil {
			names = []string{}
		}
		writeJSON(w, http.StatusOK, names)
		return nil
	}
	out := make(map[string]expandedDTO, len(names))
	for _, name := range names {
		var e expandedDTO
		if withStatus {
			st, err := s.api.ConnectorStatus(ctx, name)
			if errors.Is(err, herder.ErrNotFound) {
				continue // deleted since Connectors answered
			}
			if err != nil {
				return fmt.Errorf("status of connector %s: %w", name, err)
			}
			d := statusDTO(st)
			e.Status = &d
		}
		if withInfo {
			info, err := s.api.ConnectorInfo(ctx, name)
			if errors.Is(err, herder.ErrNotFound) {
				continue
			}
			if err != nil {
				return fmt.Errorf("info of connector %s: %w", name, err)
			}
			d := infoDTO(info)
			e.Info = &d
		}
		out[name] = e
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *server) createConnector(w http.ResponseWriter, r *http.Request) error {
	fields, err := readObject(r, "a connector: {\"name\": \"...\", \"config\": {...}}")
	if err != nil {
		return err
	}
	var problems []string
	for k := range fields {
		if k != "name" && k != "config" && k != "initial_state" {
			problems = append(problems, fmt.Sprintf("unknown field %q (expected name, config, initial_state)", k))
		}
	}
	var name string
	if raw, ok := fields["name"]; !ok || isNull(raw) {
		problems = append(problems, `"name" is required: the connector's name`)
	} else if err := json.Unmarshal(raw, &name); err != nil {
		problems = append(problems, `"name" must be a JSON string`)
	} else {
		name = strings.TrimSpace(name)
		if msg := checkName(name); msg != "" {
			problems = append(problems, msg)
		}
	}
	var cfg connect.Config
	if raw, ok := fields["config"]; !ok || isNull(raw) {
		problems = append(problems, `"config" is required: an object of string values with at least connector.class`)
	} else {
		// The good keys are kept even when others are bad, so that a
		// contradicting "name" is named in the same answer.
		var msgs []string
		cfg, msgs = decodeConfig(raw, "config")
		problems = append(problems, msgs...)
	}
	initial := worker.TargetRunning
	if raw, ok := fields["initial_state"]; ok && !isNull(raw) {
		var st string
		if err := json.Unmarshal(raw, &st); err != nil {
			problems = append(problems, `"initial_state" must be a JSON string: RUNNING, PAUSED or STOPPED`)
		} else {
			switch t := worker.TargetState(strings.ToUpper(strings.TrimSpace(st))); t {
			case worker.TargetRunning, worker.TargetPaused, worker.TargetStopped:
				initial = t
			default:
				problems = append(problems, fmt.Sprintf(`"initial_state" %q is not one of RUNNING, PAUSED, STOPPED`, st))
			}
		}
	}
	if cfg != nil && name != "" {
		if msg := putName(cfg, name); msg != "" {
			problems = append(problems, msg)
		}
	}
	if len(problems) > 0 {
		slices.Sort(problems)
		return badRequest("invalid connector creation request: " + strings.Join(problems, "; "))
	}
	info, err := s.api.CreateConnector(r.Context(), name, cfg, initial)
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/connectors/"+url.PathEscape(info.Name))
	writeJSON(w, http.StatusCreated, infoDTO(info))
	return nil
}

// checkName says what is wrong with a connector name, or "".
func checkName(name string) string {
	switch {
	case name == "":
		return `"name" must not be empty`
	case strings.Contains(name, "/"):
		return fmt.Sprintf(`connector name %q must not contain '/'`, name)
	case strings.ContainsFunc(name, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return fmt.Sprintf(`connector name %q must not contain control characters`, name)
	}
	return ""
}

// putName makes config's "name" agree with the connector's name, as Kafka
// does: filled in when absent, rejected when different.
func putName(cfg connect.Config, name string) string {
	if n, ok := cfg["name"]; ok && n != name {
		return fmt.Sprintf("connector name configuration (%s) doesn't match connector name in the URL or request (%s); remove config \"name\" or make it equal", n, name)
	}
	cfg["name"] = name
	return ""
}

func (s *server) getConnector(w http.ResponseWriter, r *http.Request) error {
	info, err := s.api.ConnectorInfo(r.Context(), r.PathValue("c"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, infoDTO(info))
	return nil
}

func (s *server) deleteConnector(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("c")
	ctx, cancel := context.WithTimeout(r.Context(), s.deleteTimeout)
	defer cancel()
	err := s.api.DeleteConnector(ctx, name)
	if err != nil {
		var de *herder.DeletionError
		if !errors.As(err, &de) && !errors.Is(err, herder.ErrRebalance) && errors.Is(err, context.DeadlineExceeded) && r.Context().Err() == nil {
			return &httpError{status: http.StatusInternalServerError, msg: fmt.Sprintf(
				"deletion of connector %s did not finish within %s; it carries on: GET /connectors/%s/status shows its progress in the deletion field; retry DELETE to wait again",
				name, s.deleteTimeout, name)}
		}
		return err
	}
	writeEmpty(w, http.StatusNoContent)
	return nil
}

func (s *server) getConfig(w http.ResponseWriter, r *http.Request) error {
	info, err := s.api.ConnectorInfo(r.Context(), r.PathValue("c"))
	if err != nil {
		return err
	}
	cfg := info.Config
	if cfg == nil {
		cfg = connect.Config{}
	}
	writeJSON(w, http.StatusOK, cfg)
	return nil
}

func (s *server) putConfig(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("c")
	if msg := checkName(name); msg != "" {
		return badRequest(msg)
	}
	raw, err := readRaw(r, "the connector's config: an object of string values")
	if err != nil {
		return err
	}
	cfg, msgs := decodeConfig(raw, "config")
	if looksLikeCreateBody(raw) {
		msgs = []string{`PUT /connectors/{name}/config takes the config object itself ({"connector.class": "...", ...}), not {"name": ..., "config": {...}}; send that shape to POST /connectors`}
	}
	// Also with other bad values: every bad field is named at once. cfg is
	// nil only when the body is no object; the create shape has no name to
	// compare.
	if cfg != nil && !looksLikeCreateBody(raw) {
		if msg := putName(cfg, name); msg != "" {
			msgs = append(msgs, msg)
		}
	}
	if len(msgs) > 0 {
		return badRequest("invalid connector config: " + strings.Join(msgs, "; "))
	}
	info, created, err := s.api.PutConnectorConfig(r.Context(), name, cfg)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
		w.Header().Set("Location", "/connectors/"+url.PathEscape(info.Name))
	}
	writeJSON(w, status, infoDTO(info))
	return nil
}

func (s *server) patchConfig(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("c")
	fields, err := readObject(r, "the config keys to change: an object of string values (null removes a key)")
	if err != nil {
		return err
	}
	patch := make(map[string]*string, len(fields))
	var msgs []string
	for _, k := range sortedKeys(fields) {
		raw := fields[k]
		if isNull(raw) {
			patch[k] = nil
			continue
		}
		v, ok := ConfigValue(raw)
		if !ok {
			msgs = append(msgs, fmt.Sprintf("config %q must be a JSON string or null, got %s", k, jsonKind(raw)))
			continue
		}
		patch[k] = &v
	}
	if v, ok := patch["name"]; ok && (v == nil || *v != name) {
		msgs = append(msgs, fmt.Sprintf("connector name configuration cannot be changed or removed by PATCH (connector %s)", name))
	}
	if len(msgs) > 0 {
		return badRequest("invalid connector config patch: " + strings.Join(msgs, "; "))
	}
	info, err := s.api.PatchConnectorConfig(r.Context(), name, patch)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, infoDTO(info))
	return nil
}

func (s *server) getStatus(w http.ResponseWriter, r *http.Request) error {
	st, err := s.api.ConnectorStatus(r.Context(), r.PathValue("c"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, statusDTO(st))
	return nil
}

func (s *server) getTasks(w http.ResponseWriter, r *http.Request) error {
	tasks, err := s.api.TaskConfigs(r.Context(), r.PathValue("c"))
	if err != nil {
		return err
	}
	out := make([]taskInfoDTO, 0, len(tasks))
	for _, t := range tasks {
		cfg := t.Config
		if cfg == nil {
			cfg = connect.Config{}
		}
		out = append(out, taskInfoDTO{ID: taskIDDTO{Connector: t.ID.Connector, Task: t.ID.Task}, Config: cfg})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// getTasksConfig is Kafka Connect 3.x's GET /connectors/{c}/tasks-config
// (KIP-661; deprecated in 3.7, removed in 4.0): the task configs keyed by
// ConnectorTaskId's text, "<connector>-<task>".
func (s *server) getTasksConfig(w http.ResponseWriter, r *http.Request) error {
	tasks, err := s.api.TaskConfigs(r.Context(), r.PathValue("c"))
	if err != nil {
		return err
	}
	out := make(map[string]connect.Config, len(tasks))
	for _, t := range tasks {
		cfg := t.Config
		if cfg == nil {
			cfg = connect.Config{}
		}
		out[fmt.Sprintf("%s-%d", t.ID.Connector, t.ID.Task)] = cfg
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// taskID parses the {t} path segment. Kafka (Jersey) answers 404 when it is
// not an integer: the path names no resource.
func taskID(r *http.Request) (worker.TaskID, error) {
	c, t := r.PathValue("c"), r.PathValue("t")
	n, err := strconv.Atoi(t)
	if err != nil || n < 0 {
		return worker.TaskID{}, notFound(fmt.Sprintf("task id %q of connector %s is not a task number; tasks are numbered 0, 1, ... (see GET /connectors/%s/tasks)", t, c, c))
	}
	return worker.TaskID{Connector: c, Task: n}, nil
}

func (s *server) getTaskStatus(w http.ResponseWriter, r *http.Request) error {
	id, err := taskID(r)
	if err != nil {
		return err
	}
	st, err := s.api.TaskStatus(r.Context(), id)
	if err != nil {
		return taskErr(err, id)
	}
	writeJSON(w, http.StatusOK, taskStatusDTO(st))
	return nil
}

// taskErr names the task when the connector has no such task; an unknown
// connector stays "Connector X not found", as in Kafka Connect.
func taskErr(err error, id worker.TaskID) error {
	if errors.Is(err, herder.ErrTaskNotFound) {
		return notFound(fmt.Sprintf("Task %d of connector %s not found", id.Task, id.Connector))
	}
	return err
}

func (s *server) restartTask(w http.ResponseWriter, r *http.Request) error {
	id, err := taskID(r)
	if err != nil {
		return err
	}
	if err := s.api.RestartTask(r.Context(), id); err != nil {
		return taskErr(err, id)
	}
	writeEmpty(w, http.StatusNoContent)
	return nil
}

func (s *server) restart(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	includeTasks, err1 := boolParam(q, "includeTasks")
	onlyFailed, err2 := boolParam(q, "onlyFailed")
	if err := errors.Join(err1, err2); err != nil {
		return badRequest(strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	st, err := s.api.Restart(r.Context(), r.PathValue("c"), includeTasks, onlyFailed)
	if err != nil {
		return err
	}
	// Kafka keeps the old contract for a plain restart: 204, no body.
	if !includeTasks && !onlyFailed {
		writeEmpty(w, http.StatusNoContent)
		return nil
	}
	writeJSON(w, http.StatusAccepted, statusDTO(st))
	return nil
}

func boolParam(q url.Values, name string) (bool, error) {
	v := q.Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("query parameter %s=%q is not a boolean; use true or false", name, v)
	}
	return b, nil
}

func (s *server) pause(w http.ResponseWriter, r *http.Request) error {
	if err := s.api.Pause(r.Context(), r.PathValue("c")); err != nil {
		return err
	}
	writeEmpty(w, http.StatusAccepted)
	return nil
}

func (s *server) resume(w http.ResponseWriter, r *http.Request) error {
	if err := s.api.Resume(r.Context(), r.PathValue("c")); err != nil {
		return err
	}
	writeEmpty(w, http.StatusAccepted)
	return nil
}

func (s *server) stop(w http.ResponseWriter, r *http.Request) error {
	if err := s.api.Stop(r.Context(), r.PathValue("c")); err != nil {
		return err
	}
	writeEmpty(w, http.StatusNoContent)
	return nil
}

func (s *server) getOffsets(w http.ResponseWriter, r *http.Request) error {
	offs, err := s.api.Offsets(r.Context(), r.PathValue("c"))
	if err != nil {
		return err
	}
	out := offsetsDTO{Offsets: make([]offsetDTO, 0, len(offs.Offsets))}
	for _, o := range offs.Offsets {
		out.Offsets = append(out.Offsets, offsetDTO{Partition: o.Partition, Offset: o.Offset})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *server) alterOffsets(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("c")
	fields, err := readObject(r, `{"offsets": [{"partition": {...}, "offset": {...}}]}`)
	if err != nil {
		return err
	}
	var msgs []string
	for k := range fields {
		if k != "offsets" {
			msgs = append(msgs, fmt.Sprintf("unknown field %q (expected offsets)", k))
		}
	}
	var entries []map[string]json.RawMessage
	raw, ok := fields["offsets"]
	switch {
	case !ok || isNull(raw):
		msgs = append(msgs, `"offsets" is required: a list of {"partition": {...}, "offset": {...}}`)
	default:
		if err := json.Unmarshal(raw, &entries); err != nil {
			msgs = append(msgs, `"offsets" must be a list of objects {"partition": {...}, "offset": {...}}`)
		}
	}
	if raw, ok := fields["offsets"]; ok && !isNull(raw) && entries != nil && len(entries) == 0 {
		msgs = append(msgs, `"offsets" is empty: partitions / offsets need to be provided for an alter offsets request (DELETE /connectors/{name}/offsets resets them all)`)
	}
	var offs herder.ConnectorOffsets
	for i, e := range entries {
		var o worker.SourceOffset
		if p, ok := e["partition"]; !ok || isNull(p) {
			msgs = append(msgs, fmt.Sprintf("offsets[%d].partition is required", i))
		} else if m, err := decodeOffsetObject(p); err != nil {
			msgs = append(msgs, fmt.Sprintf("offsets[%d].partition must be an object%s", i, err))
		} else {
			o.Partition = m
		}
		// A null offset resets that partition, as in Kafka.
		if p, ok := e["offset"]; ok && !isNull(p) {
			if m, err := decodeOffsetObject(p); err != nil {
				msgs = append(msgs, fmt.Sprintf("offsets[%d].offset must be an object or null%s", i, err))
			} else {
				o.Offset = m
			}
		}
		for k := range e {
			if k != "partition" && k != "offset" {
				msgs = append(msgs, fmt.Sprintf("offsets[%d]: unknown field %q (expected partition, offset)", i, k))
			}
		}
		offs.Offsets = append(offs.Offsets, o)
	}
	if len(msgs) > 0 {
		slices.Sort(msgs)
		return badRequest("invalid offsets request: " + strings.Join(msgs, "; "))
	}
	if err := s.api.AlterOffsets(r.Context(), name, offs); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, messageDTO{Message: "The Connect framework-managed offsets for this connector have been altered successfully. However, if this connector manages offsets externally, they will need to be manually altered in the system that the connector uses."})
	return nil
}

func (s *server) resetOffsets(w http.ResponseWriter, r *http.Request) error {
	if err := s.api.ResetOffsets(r.Context(), r.PathValue("c")); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, messageDTO{Message: "The Connect framework-managed offsets for this connector have been reset successfully. However, if this connector manages offsets externally, they will need to be manually reset in the system that the connector uses."})
	return nil
}

func (s *server) getTopics(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("c")
	topics, err := s.api.Topics(r.Context(), name)
	if err != nil {
		return err
	}
	topics = slices.Clone(topics)
	if topics == nil {
		topics = []string{}
	}
	slices.Sort(topics)
	writeJSON(w, http.StatusOK, map[string]topicsDTO{name: {Topics: topics}})
	return nil
}

func (s *server) resetTopics(w http.ResponseWriter, r *http.Request) error {
	if err := s.api.ResetTopics(r.Context(), r.PathValue("c")); err != nil {
		return err
	}
	// 202 as Kafka answers (Response.accepted()); see decision 0033.
	writeEmpty(w, http.StatusAccepted)
	return nil
}

func (s *server) getResources(w http.ResponseWriter, r *http.Request) error {
	rs, err := s.api.Resources(r.Context(), r.PathValue("c"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, resourcesDTO(rs))
	return nil
}

func (s *server) listPlugins(w http.ResponseWriter, r *http.Request) error {
	// connectorsOnly=false would add transformations and converters;
	// tidyconnect has none, so both answers list the connectors.
	if _, err := boolParam(r.URL.Query(), "connectorsOnly"); err != nil {
		return badRequest(err.Error())
	}
	ps, err := s.api.Plugins(r.Context())
	if err != nil {
		return err
	}
	out := make([]pluginDTO, 0, len(ps))
	for _, p := range ps {
		out = append(out, pluginDTO{Class: p.Class, Type: typeName(p.Type), Version: p.Version})
	}
	slices.SortFunc(out, func(a, b pluginDTO) int { return strings.Compare(a.Class, b.Class) })
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *server) pluginConfig(w http.ResponseWriter, r *http.Request) error {
	def, err := s.api.PluginConfig(r.Context(), r.PathValue("p"))
	if err != nil {
		return pluginErr(err, r.PathValue("p"))
	}
	out := make([]configKeyDTO, 0, len(def))
	for _, k := range def {
		out = append(out, configKeyInfo(k))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func pluginErr(err error, class string) error {
	if err == herder.ErrNotFound {
		return notFound(fmt.Sprintf("unknown connector plugin %s; GET /connector-plugins lists the installed ones", class))
	}
	return err
}

func (s *server) validate(w http.ResponseWriter, r *http.Request) error {
	class := r.PathValue("p")
	raw, err := readRaw(r, "the config to validate: an object of string values")
	if err != nil {
		return err
	}
	cfg, msgs := decodeConfig(raw, "config")
	if len(msgs) > 0 {
		return badRequest("invalid config to validate: " + strings.Join(msgs, "; "))
	}
	// Kafka rejects a body naming another class than the path; a class and
	// its alias are the same plugin.
	if c, ok := cfg["connector.class"]; ok && c != "" && !s.samePlugin(c, class) {
		return badRequest(fmt.Sprintf("included connector type %s does not match request type %s; make connector.class equal the plugin in the path", c, class))
	}
	cfg["connector.class"] = class
	v, err := s.api.Validate(r.Context(), class, cfg)
	if err != nil {
		return pluginErr(err, class)
	}
	writeJSON(w, http.StatusOK, validationResult(v))
	return nil
}

// looksLikeCreateBody spots the POST /connectors shape sent to PUT config,
// a common mistake.
func looksLikeCreateBody(raw json.RawMessage) bool {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil {
		return false
	}
	c, ok := m["config"]
	return ok && len(bytes.TrimSpace(c)) > 0 && bytes.TrimSpace(c)[0] == '{'
}

// pluginResolver is implemented by an API that knows the installed plugins
// and their aliases (herder.Standalone).
type pluginResolver interface {
	SamePlugin(a, b string) bool
}

// samePlugin says whether two connector.class values name one plugin: by
// the installed plugins and their aliases when the API knows them, else as
// Kafka compares names.
func (s *server) samePlugin(a, b string) bool {
	if pr, ok := s.api.(pluginResolver); ok && pr.SamePlugin(a, b) {
		return true
	}
	return samePluginName(a, b)
}

// samePluginName compares connector.class values as Kafka does: by the
// class's simple name, with or without the "Connector" suffix.
func samePluginName(a, b string) bool {
	norm := func(s string) string {
		s = strings.ToLower(s)
		if i := strings.LastIndexByte(s, '.'); i >= 0 {
			s = s[i+1:]
		}
		return strings.TrimSuffix(s, "connector")
	}
	return norm(a) == norm(b)
}

// Request decoding.

// readRaw reads the body. An empty body (with or without a JSON
// Content-Type) is an error here because these requests need one.
func readRaw(r *http.Request, want string) (json.RawMessage, error) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, err
		}
		return nil, badRequest("reading the request body failed: " + err.Error())
	}
	// A UTF-8 byte order mark (Windows tools write one) is no JSON syntax
	// error to Kafka Connect: Jackson skips it.
	body = bytes.TrimSpace(bytes.TrimPrefix(body, []byte("\ufeff")))
	if len(body) == 0 {
		return nil, badRequest("request body is empty; send " + want)
	}
	// As Kafka Connect (@Consumes JSON): a body declared as something else
	// is 415, e.g. curl -d without -H, which sends a form type. A request
	// without a Content-Type is read as JSON.
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || mt != "application/json" && !strings.HasSuffix(mt, "+json") {
			return nil, &httpError{status: http.StatusUnsupportedMediaType, msg: fmt.Sprintf("HTTP 415 Unsupported Media Type: the body is declared as %q; send %s with Content-Type: application/json", ct, want)}
		}
	}
	if !json.Valid(body) {
		return nil, badRequest(syntaxMessage(body, want))
	}
	return body, nil
}

func syntaxMessage(body []byte, want string) string {
	var v any
	err := json.Unmarshal(body, &v)
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("malformed JSON in request body at byte %d: %v; send %s", se.Offset, se, want)
	}
	return fmt.Sprintf("malformed JSON in request body: %v; send %s", err, want)
}

// readObject reads a body that must be a JSON object.
func readObject(r *http.Request, want string) (map[string]json.RawMessage, error) {
	raw, err := readRaw(r, want)
	if err != nil {
		return nil, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		return nil, badRequest(fmt.Sprintf("request body must be a JSON object, got %s; send %s", jsonKind(raw), want))
	}
	return m, nil
}

// decodeConfig decodes a config object whose values must all be strings,
// as Kafka Connect requires. Each offending key gets a message.
func decodeConfig(raw json.RawMessage, what string) (connect.Config, []string) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		return nil, []string{fmt.Sprintf("%q must be a JSON object of string values, got %s", what, jsonKind(raw))}
	}
	cfg := make(connect.Config, len(m))
	var msgs []string
	for _, k := range sortedKeys(m) {
		v, ok := ConfigValue(m[k])
		if !ok {
			msgs = append(msgs, fmt.Sprintf("config value of %q must be a JSON string, got %s (write it in quotes)", k, jsonKind(m[k])))
			continue
		}
		cfg[k] = v
	}
	return cfg, msgs
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// ConfigValue returns a config value as text: a JSON string as is, and a
// number or boolean as its literal text ("tasks.max": 2 is "2"), as Kafka
// Connect's JSON binding coerces scalars into its string-to-string config
// maps. Objects, arrays and null are not config values.
func ConfigValue(raw json.RawMessage) (string, bool) {
	b := bytes.TrimSpace(raw)
	if len(b) == 0 {
		return "", false
	}
	switch {
	case b[0] == '"':
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return "", false
		}
		return s, true
	case string(b) == "true" || string(b) == "false":
		return string(b), true
	case b[0] == '-' || (b[0] >= '0' && b[0] <= '9'):
		var n json.Number
		if err := json.Unmarshal(b, &n); err != nil {
			return "", false
		}
		return n.String(), true
	}
	return "", false
}

func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

// jsonKind names the JSON type of raw for error messages.
func jsonKind(raw json.RawMessage) string {
	b := bytes.TrimSpace(raw)
	if len(b) == 0 {
		return "nothing"
	}
	switch b[0] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

// decodeOffsetObject decodes a partition or offset as the worker gives them
// back (worker.DecodeOffsetJSON): a whole number exactly, as an int64, as
// Kafka Connect keeps a Long. A whole number beyond 64 bits is refused
// rather than rounded. The error reads as a continuation of "must be an
// object".
func decodeOffsetObject(raw json.RawMessage) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil || m == nil {
		return nil, errors.New("")
	}
	if n, ok := wholeBeyond64Bits(m); ok {
		return nil, fmt.Errorf(" of values within 64 bits: %s is too large (as in Kafka Connect, which keeps whole numbers as Long)", n)
	}
	if err := worker.OffsetNumbers(m); err != nil {
		return nil, fmt.Errorf(": %v", err)
	}
	return m, nil
}

// wholeBeyond64Bits finds a whole number (no fraction or exponent) that
// does not fit an int64.
func wholeBeyond64Bits(v any) (json.Number, bool) {
	switch x := v.(type) {
	case json.Number:
		if _, err := x.Int64(); err != nil && !strings.ContainsAny(x.String(), ".eE") {
			return x, true
		}
	case map[string]any:
		for _, e := range x {
			if n, ok := wholeBeyond64Bits(e); ok {
				return n, true
			}
		}
	case []any:
		for _, e := range x {
			if n, ok := wholeBeyond64Bits(e); ok {
				return n, true
			}
		}
	}
	return "", false
}
