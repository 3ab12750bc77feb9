package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
)

// loadCompose loads docker-compose.yml with the compose-spec loader, as
// `docker compose` itself would (interpolation, normalization, consistency
// checks), without needing a Docker engine.
func loadCompose(t *testing.T) *types.Project {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts, err := cli.NewProjectOptions(
		[]string{filepath.Join(repoRoot, "docker-compose.yml")},
		cli.WithName("tidyconnect-compose-test"),
		cli.WithWorkingDirectory(repoRoot),
		// No host environment: the file must work with its own defaults.
		cli.WithEnv(nil),
	)
	if err != nil {
		t.Fatalf("compose options: %v", err)
	}
	p, err := opts.LoadProject(ctx)
	if err != nil {
		t.Fatalf("loading docker-compose.yml with compose-go (fix the file; `docker compose config` shows the same error): %v", err)
	}
	return p
}

func service(t *testing.T, p *types.Project, name string) types.ServiceConfig {
	t.Helper()
	s, err := p.GetService(name)
	if err != nil {
		t.Fatalf("docker-compose.yml: service %q: %v", name, err)
	}
	return s
}

func env(s types.ServiceConfig, key string) string {
	if v, ok := s.Environment[key]; ok && v != nil {
		return *v
	}
	return ""
}

func TestComposeServices(t *testing.T) {
	p := loadCompose(t)

	var names []string
	for n := range p.Services {
		names = append(names, n)
	}
	slices.Sort(names)
	if want := []string{"kafka", "postgres", "rabbitmq", "tidyconnect"}; !slices.Equal(names, want) {
		t.Fatalf("services = %v, want %v", names, want)
	}

	tests := []struct {
		service     string
		imagePrefix string // "" for a service built from the repo
		ports       map[uint32]string
		dataTarget  string // where the named data volume is mounted
	}{
		{"postgres", "postgres:", map[uint32]string{5432: "5432"}, "/var/lib/postgresql/data"},
		{"rabbitmq", "rabbitmq:", map[uint32]string{5672: "5672", 15672: "15672"}, "/var/lib/rabbitmq"},
		{"kafka", "apache/kafka:", map[uint32]string{9094: "9094"}, "/var/lib/kafka/data"},
		{"tidyconnect", "", map[uint32]string{8083: "8083"}, "/var/lib/tidyconnect"},
	}
	for _, tt := range tests {
		t.Run(tt.service, func(t *testing.T) {
			s := service(t, p, tt.service)

			if tt.imagePrefix != "" {
				if !strings.HasPrefix(s.Image, tt.imagePrefix) || !strings.Contains(s.Image, ":") {
					t.Errorf("image = %q, want an official %s<tag> image", s.Image, tt.imagePrefix)
				}
				if strings.HasSuffix(s.Image, ":latest") {
					t.Errorf("image %q: pin a tag, not latest", s.Image)
				}
			} else {
				if s.Build == nil {
					t.Fatalf("no build section: the service must be built from the repo's Dockerfile")
				}
				if filepath.Clean(s.Build.Context) != mustAbs(t, repoRoot) {
					t.Errorf("build context = %q, want the repository root", s.Build.Context)
				}
				if s.Build.Dockerfile != "Dockerfile" {
					t.Errorf("build dockerfile = %q, want Dockerfile", s.Build.Dockerfile)
				}
			}

			hc := s.HealthCheck
			if hc == nil || hc.Disable || len(hc.Test) < 2 || hc.Test[0] == "NONE" {
				t.Errorf("healthcheck = %+v, want an enabled test", hc)
			} else if hc.Interval == nil || hc.Retries == nil || hc.StartPeriod == nil {
				t.Errorf("healthcheck %v: set interval, retries and start_period", hc.Test)
			}

			got := map[uint32]string{}
			for _, pc := range s.Ports {
				got[pc.Target] = pc.Published
			}
			for target, published := range tt.ports {
				if got[target] != published {
					t.Errorf("port %d published on %q, want %q (all: %v)", target, got[target], published, got)
				}
			}

			var data *types.ServiceVolumeConfig
			for i, v := range s.Volumes {
				if v.Target == tt.dataTarget {
					data = &s.Volumes[i]
				}
			}
			switch {
			case data == nil:
				t.Errorf("no volume mounted on %s", tt.dataTarget)
			case data.Type != types.VolumeTypeVolume:
				t.Errorf("%s is a %s mount, want a named volume", tt.dataTarget, data.Type)
			default:
				if _, ok := p.Volumes[data.Source]; !ok {
					t.Errorf("volume %q is not declared under the top-level volumes", data.Source)
				}
			}
		})
	}
}

func mustAbs(t *testing.T, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestComposePostgresLoadsDemoSchema(t *testing.T) {
	p := loadCompose(t)
	s := service(t, p, "postgres")
	var init *types.ServiceVolumeConfig
	for i, v := range s.Volumes {
		if v.Target == "/docker-entrypoint-initdb.d" {
			init = &s.Volumes[i]
		}
	}
	if init == nil {
		t.Fatal("migrations/demo is not mounted on /docker-entrypoint-initdb.d")
	}
	if init.Type != types.VolumeTypeBind || init.Source != mustAbs(t, filepath.Join(repoRoot, "migrations", "demo")) {
		t.Errorf("init mount = %s %s, want a bind of migrations/demo", init.Type, init.Source)
	}
	if !init.ReadOnly {
		t.Errorf("init mount should be read-only")
	}
	sqls, _ := filepath.Glob(filepath.Join(repoRoot, "migrations", "demo", "*.sql"))
	if len(sqls) == 0 {
		t.Errorf("migrations/demo has no .sql files for the init mount")
	}
	if env(s, "POSTGRES_PASSWORD") == "" || env(s, "POSTGRES_DB") == "" {
		t.Errorf("POSTGRES_PASSWORD and POSTGRES_DB must be set (the image refuses to start without a password)")
	}
}

func TestComposeDependsOn(t *testing.T) {
	p := loadCompose(t)
	s := service(t, p, "tidyconnect")
	for _, dep := range []string{"postgres", "rabbitmq", "kafka"} {
		d, ok := s.DependsOn[dep]
		if !ok {
			t.Errorf("tidyconnect does not depend on %s", dep)
			continue
		}
		if d.Condition != types.ServiceConditionHealthy {
			t.Errorf("tidyconnect depends on %s with condition %q, want %q", dep, d.Condition, types.ServiceConditionHealthy)
		}
	}
}

// TestComposeKafkaKRaft checks the single combined broker/controller: a
// mistake here only shows when the container starts, so catch it early.
func TestComposeKafkaKRaft(t *testing.T) {
	p := loadCompose(t)
	k := service(t, p, "kafka")

	roles := strings.Split(env(k, "KAFKA_PROCESS_ROLES"), ",")
	slices.Sort(roles)
	if !slices.Equal(roles, []string{"broker", "controller"}) {
		t.Errorf("KAFKA_PROCESS_ROLES = %q, want broker,controller", env(k, "KAFKA_PROCESS_ROLES"))
	}
	nodeID := env(k, "KAFKA_NODE_ID")
	if nodeID == "" {
		t.Fatal("KAFKA_NODE_ID is not set")
	}
	if env(k, "CLUSTER_ID") == "" {
		t.Error("CLUSTER_ID is not set: the data volume would be formatted with a new id on every start")
	}

	listeners := parseListeners(t, env(k, "KAFKA_LISTENERS"))
	advertised := parseListeners(t, env(k, "KAFKA_ADVERTISED_LISTENERS"))
	protocols := map[string]string{}
	for _, kv := range strings.Split(env(k, "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"), ",") {
		name, proto, _ := strings.Cut(kv, ":")
		protocols[name] = proto
	}
	for name := range listeners {
		if protocols[name] == "" {
			t.Errorf("listener %s has no entry in KAFKA_LISTENER_SECURITY_PROTOCOL_MAP", name)
		}
	}
	controller := env(k, "KAFKA_CONTROLLER_LISTENER_NAMES")
	if _, ok := listeners[controller]; !ok {
		t.Errorf("controller listener %q is not in KAFKA_LISTENERS", controller)
	}
	if _, ok := advertised[controller]; ok {
		t.Errorf("controller listener %q must not be advertised to clients", controller)
	}
	for name, hp := range advertised {
		l, ok := listeners[name]
		if !ok {
			t.Errorf("advertised listener %s is not in KAFKA_LISTENERS", name)
			continue
		}
		if portOf(t, l) != portOf(t, hp) {
			t.Errorf("listener %s listens on %s but is advertised as %s", name, l, hp)
		}
	}
	inter := env(k, "KAFKA_INTER_BROKER_LISTENER_NAME")
	if _, ok := advertised[inter]; !ok {
		t.Errorf("inter-broker listener %q is not advertised", inter)
	}

	// The quorum is this node, on the controller listener, by its service name.
	wantVoter := fmt.Sprintf("%s@kafka:%s", nodeID, portOf(t, listeners[controller]))
	if got := env(k, "KAFKA_CONTROLLER_QUORUM_VOTERS"); got != wantVoter {
		t.Errorf("KAFKA_CONTROLLER_QUORUM_VOTERS = %q, want %q", got, wantVoter)
	}
	for _, key := range []string{"KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"} {
		if env(k, key) != "1" {
			t.Errorf("%s = %q, want 1 on a single broker", key, env(k, key))
		}
	}
	if logDirs := env(k, "KAFKA_LOG_DIRS"); !hasVolumeAt(k, logDirs) {
		t.Errorf("KAFKA_LOG_DIRS = %q is not on a volume: data would be lost with the container", logDirs)
	}

	// tidyconnect must reach Kafka on a listener advertised with the
	// service name, or the client is redirected to an address it cannot reach.
	tc := service(t, p, "tidyconnect")
	bootstrap := env(tc, "TIDYCONNECT_BOOTSTRAP_SERVERS")
	found := false
	for _, hp := range advertised {
		if hp == bootstrap {
			found = true
		}
	}
	if !found || !strings.HasPrefix(bootstrap, "kafka:") {
		t.Errorf("TIDYCONNECT_BOOTSTRAP_SERVERS = %q, want one of the advertised listeners on host kafka: %v", bootstrap, advertised)
	}
	if _, ok := tc.DependsOn["kafka"]; !ok {
		t.Errorf("tidyconnect uses Kafka but does not depend on it")
	}
}

func hasVolumeAt(s types.ServiceConfig, dir string) bool {
	for _, v := range s.Volumes {
		if v.Type == types.VolumeTypeVolume && (dir == v.Target || strings.HasPrefix(dir, v.Target+"/")) {
			return true
		}
	}
	return false
}

// parseListeners turns "NAME://host:port,..." into NAME -> host:port.
func parseListeners(t *testing.T, s string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, l := range strings.Split(s, ",") {
		name, hp, ok := strings.Cut(l, "://")
		if !ok {
			t.Errorf("listener %q is not NAME://host:port", l)
			continue
		}
		out[name] = hp
	}
	return out
}

func portOf(t *testing.T, hostport string) string {
	t.Helper()
	_, port, err := net.SplitHostPort(hostport)
	if err != nil {
		t.Errorf("%q: %v", hostport, err)
	}
	return port
}

// TestComposeTidyconnectService checks the worker's wiring: its REST port,
// its healthcheck and its data dir agree with each other.
func TestComposeTidyconnectService(t *testing.T) {
	p := loadCompose(t)
	s := service(t, p, "tidyconnect")
	if len(s.Command) == 0 || s.Command[0] != "standalone" {
		t.Errorf("command = %v, want standalone first", s.Command)
	}
	restPort := portOf(t, env(s, "TIDYCONNECT_REST_ADDR"))
	if restPort != "8083" {
		t.Errorf("TIDYCONNECT_REST_ADDR = %q, want port 8083", env(s, "TIDYCONNECT_REST_ADDR"))
	}
	// GET /health (KIP-1017) is what TestHealthAndLogLevelsThroughTheBinary
	// checks the binary answers.
	if !slices.ContainsFunc(s.HealthCheck.Test, func(a string) bool { return strings.HasSuffix(a, ":"+restPort+"/health") }) {
		t.Errorf("healthcheck %v does not probe GET /health on the REST port %s", s.HealthCheck.Test, restPort)
	}
	if dd := env(s, "TIDYCONNECT_DATA_DIR"); !hasVolumeAt(s, dd) {
		t.Errorf("TIDYCONNECT_DATA_DIR = %q is not on a named volume", dd)
	}
	if s.StopGracePeriod == nil || time.Duration(*s.StopGracePeriod) < 30*time.Second {
		t.Errorf("stop_grace_period = %v: give stopping connectors time (>= 30s) before SIGKILL", s.StopGracePeriod)
	}
}

// TestExamplesAgreeWithCompose checks that the example connector configs
// point at the compose services with the compose credentials, and that the
// sink consumes the topics the source produces.
func TestExamplesAgreeWithCompose(t *testing.T) {
	p := loadCompose(t)
	pg := service(t, p, "postgres")
	rmq := service(t, p, "rabbitmq")

	src := readExample(t, "pgaudit-demo.json")
	sink := readExample(t, "amqpsink-demo.json")

	pu, err := url.Parse(src.Config["postgres.url"])
	if err != nil {
		t.Fatalf("postgres.url: %v", err)
	}
	pass, _ := pu.User.Password()
	checks := []struct{ what, got, want string }{
		{"pgaudit postgres.url host", pu.Host, "postgres:5432"},
		{"pgaudit postgres.url user", pu.User.Username(), env(pg, "POSTGRES_USER")},
		{"pgaudit postgres.url password", pass, env(pg, "POSTGRES_PASSWORD")},
		{"pgaudit postgres.url database", strings.TrimPrefix(pu.Path, "/"), env(pg, "POSTGRES_DB")},
	}
	ru, err := url.Parse(sink.Config["rabbitmq.url"])
	if err != nil {
		t.Fatalf("rabbitmq.url: %v", err)
	}
	rpass, _ := ru.User.Password()
	checks = append(checks, []struct{ what, got, want string }{
		{"amqpsink rabbitmq.url host", ru.Host, "rabbitmq:5672"},
		{"amqpsink rabbitmq.url user", ru.User.Username(), env(rmq, "RABBITMQ_DEFAULT_USER")},
		{"amqpsink rabbitmq.url password", rpass, env(rmq, "RABBITMQ_DEFAULT_PASS")},
	}...)
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q (from docker-compose.yml)", c.what, c.got, c.want)
		}
	}

	// The source produces <topic.prefix>.<schema>.<table>; the sink must
	// consume exactly those.
	var want []string
	for _, tbl := range strings.Split(src.Config["tables"], ",") {
		want = append(want, src.Config["topic.prefix"]+"."+strings.TrimSpace(tbl))
	}
	got := strings.Split(sink.Config["topics"], ",")
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("amqpsink topics = %v, want the pgaudit topics %v", got, want)
	}

	// The demo tables must exist in the demo migrations.
	schema := readDemoSQL(t)
	for _, tbl := range strings.Split(src.Config["tables"], ",") {
		if !strings.Contains(schema, "CREATE TABLE IF NOT EXISTS "+strings.TrimSpace(tbl)+" ") {
			t.Errorf("table %s of examples/pgaudit-demo.json is not created in migrations/demo", tbl)
		}
	}
}

type connectorRequest struct {
	Name   string            `json:"name"`
	Config map[string]string `json:"config"`
}

func readExample(t *testing.T, name string) connectorRequest {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "examples", name))
	if err != nil {
		t.Fatal(err)
	}
	var r connectorRequest
	// Every config value must be a JSON string (REST clients rely on it):
	// decoding into map[string]string enforces that.
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("examples/%s is not a POST /connectors body with string config values: %v", name, err)
	}
	if r.Name == "" || r.Config["connector.class"] == "" {
		t.Fatalf("examples/%s: name and config.connector.class are required", name)
	}
	return r
}

func readDemoSQL(t testing.TB) string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(repoRoot, "migrations", "demo", "*.sql"))
	slices.Sort(files)
	var sb strings.Builder
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		sb.Write(b)
		sb.WriteString("\n")
	}
	return sb.String()
}

// TestDockerfile checks the image: multi-stage, non-root, REST port exposed,
// and the go build command identical to the Makefile's build target.
func TestDockerfile(t *testing.T) {
	df := readLogicalLines(t, filepath.Join(repoRoot, "Dockerfile"))
	if !slices.ContainsFunc(df, func(l string) bool {
		return strings.HasPrefix(l, "HEALTHCHECK") && strings.Contains(l, "127.0.0.1:8083/health\"")
	}) {
		t.Error("the Dockerfile's HEALTHCHECK does not probe GET /health on port 8083")
	}
	var froms, users, exposes, builds []string
	for _, l := range df {
		instr, rest, _ := strings.Cut(l, " ")
		switch strings.ToUpper(instr) {
		case "FROM":
			froms = append(froms, rest)
		case "USER":
			users = append(users, strings.TrimSpace(rest))
		case "EXPOSE":
			exposes = append(exposes, strings.Fields(rest)...)
		case "RUN":
			if strings.Contains(rest, "go build") {
				builds = append(builds, rest)
			}
		}
	}
	if len(froms) < 2 {
		t.Errorf("Dockerfile has %d stages, want a multi-stage build", len(froms))
	}
	if len(users) == 0 {
		t.Error("Dockerfile never sets USER: the worker would run as root")
	} else if u, _, _ := strings.Cut(users[len(users)-1], ":"); u == "root" || u == "0" {
		t.Errorf("final USER %q is root", users[len(users)-1])
	}
	if !slices.Contains(exposes, "8083") {
		t.Errorf("EXPOSE %v does not include 8083", exposes)
	}
	if len(builds) != 1 {
		t.Fatalf("Dockerfile has %d RUN lines with go build, want 1: %q", len(builds), builds)
	}

	mk := makeBuildCommand(t)
	got := normalizeBuild(builds[0])
	want := normalizeBuild(mk)
	if !slices.Equal(got, want) {
		t.Errorf("Dockerfile builds with\n\t%q\nbut `make build` with\n\t%q\n(normalized; the output path may differ)", got, want)
	}
}

// readLogicalLines joins backslash continuations and drops comments.
func readLogicalLines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	var cur strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasSuffix(line, "\\") {
			cur.WriteString(strings.TrimSuffix(line, "\\"))
			cur.WriteString(" ")
			continue
		}
		cur.WriteString(line)
		if s := strings.TrimSpace(cur.String()); s != "" {
			out = append(out, s)
		}
		cur.Reset()
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

var makeVar = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*)\s*(?::=|\?=|=)\s*(.*)$`)

// makeBuildCommand returns the recipe of the Makefile's build target with
// its variables expanded, except GO, VERSION and COMMIT, which vary by design.
func makeBuildCommand(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{}
	var recipe string
	lines := strings.Split(string(b), "\n")
	for i, l := range lines {
		if m := makeVar.FindStringSubmatch(l); m != nil {
			vars[m[1]] = m[2]
		}
		if strings.HasPrefix(l, "build:") {
			for _, r := range lines[i+1:] {
				if !strings.HasPrefix(r, "\t") {
					break
				}
				if strings.Contains(r, " build ") {
					recipe = strings.TrimSpace(r)
				}
			}
		}
	}
	if recipe == "" {
		t.Fatal("Makefile: no go build command in the build target")
	}
	ref := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	for range 10 {
		recipe = ref.ReplaceAllStringFunc(recipe, func(s string) string {
			name := ref.FindStringSubmatch(s)[1]
			switch name {
			case "GO":
				return "go"
			case "VERSION":
				return "<VERSION>"
			case "COMMIT":
				return "<COMMIT>"
			}
			return vars[name]
		})
	}
	return recipe
}

// normalizeBuild reduces a go build command line to its meaningful words:
// environment (sorted), tool, flags and packages, without the output path.
func normalizeBuild(cmd string) []string {
	cmd = regexp.MustCompile(`\$\{?VERSION\}?`).ReplaceAllString(cmd, "<VERSION>")
	cmd = regexp.MustCompile(`\$\{?COMMIT\}?`).ReplaceAllString(cmd, "<COMMIT>")
	words := shellWords(cmd)
	var envs, rest []string
	i := 0
	for ; i < len(words) && strings.Contains(words[i], "=") && !strings.HasPrefix(words[i], "-"); i++ {
		envs = append(envs, words[i])
	}
	for ; i < len(words); i++ {
		if words[i] == "-o" {
			i++ // the output path differs between the two on purpose
			continue
		}
		rest = append(rest, words[i])
	}
	slices.Sort(envs)
	return append(envs, rest...)
}

// shellWords splits on blanks outside double or single quotes and removes
// the quotes; enough for a build command line.
func shellWords(s string) []string {
	var words []string
	var cur strings.Builder
	var quote rune
	inWord := false
	for _, r := range s {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case r == '"' || r == '\'':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}

func TestNormalizeBuild(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{`CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X a.B=${VERSION}" -o /out/x ./cmd/x`,
			[]string{"CGO_ENABLED=0", "go", "build", "-trimpath", "-ldflags", "-s -w -X a.B=<VERSION>", "./cmd/x"}},
		{`B=1 A=2 go build -o bin/x ./cmd/x`, []string{"A=2", "B=1", "go", "build", "./cmd/x"}},
		{`go build -ldflags '-X a.V=$VERSION' ./...`, []string{"go", "build", "-ldflags", "-X a.V=<VERSION>", "./..."}},
		{`go build -trimpath ./cmd/x`, []string{"go", "build", "-trimpath", "./cmd/x"}},
	}
	for _, tt := range tests {
		if got := normalizeBuild(tt.in); !slices.Equal(got, tt.want) {
			t.Errorf("normalizeBuild(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestComposeTidyconnectFlagsAccepted checks that every TIDYCONNECT_*
// variable and every flag the compose service and the Dockerfile pass is a
// flag `tidyconnect standalone` accepts.
func TestComposeTidyconnectFlagsAccepted(t *testing.T) {
	if !hasCommand() {
		t.Fatal("cmd/tidyconnect has no Go sources: nothing to check the compose flags against")
	}
	p := loadCompose(t)
	s := service(t, p, "tidyconnect")
	bin := tidyconnectBinary(t)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "standalone", "--help")
	cmd.Env = []string{"HOME=" + t.TempDir()}
	out, _ := cmd.CombinedOutput() // flag's -help exits 0 or 2 depending on the parser
	flags := helpFlags(string(out))
	if len(flags) == 0 {
		t.Fatalf("`tidyconnect standalone --help` listed no flags:\n%s", out)
	}

	check := func(where, name string) {
		if !flags[name] {
			t.Errorf("%s: flag --%s is not accepted by `tidyconnect standalone` (flags: %v)", where, name, keys(flags))
		}
	}
	for k := range s.Environment {
		if name, ok := strings.CutPrefix(k, "TIDYCONNECT_"); ok {
			check("docker-compose.yml environment "+k, strings.ReplaceAll(strings.ToLower(name), "_", "-"))
			// The help names the variable each flag reads: the variable
			// itself, not only the flag, must exist.
			if !strings.Contains(string(out), k) {
				t.Errorf("docker-compose.yml sets %s, but `tidyconnect standalone --help` does not name it as a flag's variable", k)
			}
		}
	}
	for _, a := range s.Command[1:] {
		if strings.HasPrefix(a, "-") {
			name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
			check("docker-compose.yml command", name)
		}
	}
	for _, l := range readLogicalLines(t, filepath.Join(repoRoot, "Dockerfile")) {
		if rest, ok := strings.CutPrefix(l, "ENV "); ok {
			for _, w := range strings.Fields(rest) {
				k, _, _ := strings.Cut(w, "=")
				if name, ok := strings.CutPrefix(k, "TIDYCONNECT_"); ok {
					check("Dockerfile ENV "+k, strings.ReplaceAll(strings.ToLower(name), "_", "-"))
				}
			}
		}
	}
}

var helpFlag = regexp.MustCompile(`(?m)^\s*--?([a-z][a-z0-9-]*)\b`)

func helpFlags(help string) map[string]bool {
	out := map[string]bool{}
	for _, m := range helpFlag.FindAllStringSubmatch(help, -1) {
		out[m[1]] = true
	}
	return out
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestDocsComposeExecFromStdinHasNoTTY checks the docs' and scripts'
// `docker compose exec` commands that read a heredoc, a file or a pipe:
// compose allocates a TTY whenever its stdout is a terminal, and the docker
// CLI then refuses redirected input ("the input device is not a TTY")
// unless -T is given.
func TestDocsComposeExecFromStdinHasNoTTY(t *testing.T) {
	files := []string{filepath.Join(repoRoot, "README.md")}
	for _, pattern := range []string{"docs/*.md", "docs/decisions/*.md", "scripts/*.sh"} {
		m, _ := filepath.Glob(filepath.Join(repoRoot, pattern))
		files = append(files, m...)
	}
	checked := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		if strings.HasSuffix(f, ".md") {
			text = codeBlocks(text)
		}
		for _, cmd := range composeExecsFromStdin(text) {
			checked++
			if !composeExecNoTTY(cmd) {
				t.Errorf("%s: %q feeds `docker compose exec` from stdin without -T: it fails with \"the input device is not a TTY\" when run in a terminal", f, cmd)
			}
		}
	}
	if checked == 0 {
		t.Error("found no `docker compose exec` fed from stdin: the walkthrough's heredoc into psql is expected (update this test if it moved)")
	}
}

var (
	quotedText    = regexp.MustCompile(`'[^']*'|"(?:[^"\\]|\\.)*"`)
	stdinRedirect = regexp.MustCompile(`<<|<\s*[^\s<(]`)
	composeExec   = regexp.MustCompile(`docker[ -]compose\s+exec\b`)
)

// codeBlocks returns the lines of a Markdown text's fenced code blocks.
func codeBlocks(md string) string {
	var sb strings.Builder
	in := false
	for _, l := range strings.Split(md, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			in = !in
			continue
		}
		if in {
			sb.WriteString(l)
			sb.WriteString("\n")
		}
	}
	return sb.String()
}

// composeExecsFromStdin returns the shell lines (continuations joined) that
// run `docker compose exec` with its stdin redirected or piped in.
func composeExecsFromStdin(text string) []string {
	var out []string
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		for strings.HasSuffix(strings.TrimRight(line, " "), "\\") && i+1 < len(lines) {
			i++
			line = strings.TrimSuffix(strings.TrimRight(line, " "), "\\") + " " + strings.TrimSpace(lines[i])
		}
		loc := composeExec.FindStringIndex(line)
		if loc == nil {
			continue
		}
		bare := quotedText.ReplaceAllString(line, "''") // a < inside SQL is no redirect
		before, after, _ := strings.Cut(bare, composeExec.FindString(bare))
		piped := strings.Contains(before, "|") && !strings.Contains(before, "||")
		if piped || stdinRedirect.MatchString(after) {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return out
}

// composeExecNoTTY says whether the exec's options (before the service
// name) include -T or --no-tty.
func composeExecNoTTY(cmd string) bool {
	loc := composeExec.FindStringIndex(cmd)
	words := strings.Fields(cmd[loc[1]:])
	for i := 0; i < len(words); i++ {
		w := words[i]
		if !strings.HasPrefix(w, "-") {
			return false // the service name: options end here
		}
		switch w {
		case "-e", "--env", "-u", "--user", "-w", "--workdir", "--index":
			i++ // the option's value
			continue
		}
		if w == "-T" || w == "--no-tty" || w == "--no-TTY" || (len(w) > 1 && w[1] != '-' && strings.Contains(w, "T")) {
			return true
		}
	}
	return false
}

func TestComposeExecFromStdinHelpers(t *testing.T) {
	tests := []struct {
		line       string
		fromStdin  bool
		noTTYGiven bool
	}{
		{`docker compose exec postgres psql -U postgres -d demo <<'SQL'`, true, false},
		{`docker compose exec -T postgres psql -U postgres -d demo <<'SQL'`, true, true},
		{`cat dump.sql | docker compose exec postgres psql -U postgres`, true, false},
		{`docker compose exec -u postgres -T postgres psql < dump.sql`, true, true},
		{`docker-compose exec --no-tty postgres psql < dump.sql`, true, true},
		{`docker compose exec postgres psql -c "SELECT 1 WHERE 1 < 2"`, false, false},
		{`docker compose exec rabbitmq rabbitmqctl list_queues name messages`, false, false},
	}
	for _, tt := range tests {
		got := composeExecsFromStdin(tt.line)
		if (len(got) == 1) != tt.fromStdin {
			t.Errorf("composeExecsFromStdin(%q) = %q, want fed from stdin: %v", tt.line, got, tt.fromStdin)
		}
		if noTTY := composeExecNoTTY(tt.line); noTTY != tt.noTTYGiven {
			t.Errorf("composeExecNoTTY(%q) = %v, want %v", tt.line, noTTY, tt.noTTYGiven)
		}
	}
}
