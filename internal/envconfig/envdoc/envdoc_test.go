package envdoc_test

import (
	"bytes"
	"context"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/outbox-relay/outbox-relay/v3/internal/awsenv"
	"github.com/outbox-relay/outbox-relay/v3/internal/envconfig"
	"github.com/outbox-relay/outbox-relay/v3/internal/envconfig/envdoc"
	"github.com/outbox-relay/outbox-relay/v3/internal/envconfig/relayenv"
	"github.com/outbox-relay/outbox-relay/v3/internal/gosrc"
	"github.com/outbox-relay/outbox-relay/v3/internal/telemetry"
)

// recorder is a getenv that answers from env and records every name asked for.
type recorder struct {
	mu   sync.Mutex
	env  map[string]string
	read map[string]bool
}

func (r *recorder) getenv(name string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.read == nil {
		r.read = map[string]bool{}
	}
	r.read[name] = true
	return r.env[name]
}

func (r *recorder) names() []string { return slices.Sorted(maps.Keys(r.read)) }

func table(t *testing.T) map[string]envdoc.Var {
	t.Helper()
	m := map[string]envdoc.Var{}
	for _, v := range envdoc.Vars {
		if _, dup := m[v.Name]; dup {
			t.Errorf("%s is in the table twice", v.Name)
		}
		m[v.Name] = v
	}
	return m
}

// TestEnvTableMatchesTheReaders: every variable the envconfig readers ask for is in the
// table with exactly the readers that ask for it, and every envconfig variable of the
// table is asked for. An empty environment makes every reader ask for everything it can
// read (defaults are applied after the read).
func TestEnvTableMatchesTheReaders(t *testing.T) {
	t.Parallel()
	asked := map[string]envdoc.Readers{}
	for _, rd := range []struct {
		by   envdoc.Readers
		read func(getenv func(string) string)
	}{
		{envdoc.Relay, func(g func(string) string) { _, _ = relayenv.Read(g) }},
		{envdoc.WebhookFunction, func(g func(string) string) { _, _ = envconfig.ReadWebhook(1)(g) }},
		{envdoc.FailureFunction, func(g func(string) string) { _, _ = envconfig.ReadFailure(1)(g) }},
	} {
		var r recorder
		rd.read(r.getenv)
		if len(r.read) == 0 {
			t.Fatalf("reader for %v asked for nothing", rd.by)
		}
		for _, n := range r.names() {
			asked[n] |= rd.by
		}
	}
	tab := table(t)
	for name, by := range asked {
		v, ok := tab[name]
		switch {
		case !ok:
			t.Errorf("%s is read (by %v) but not described in envdoc.Vars: add it", name, by)
		case !slices.Contains(v.Sources, envdoc.SourceEnvconfig):
			t.Errorf("%s is read by internal/envconfig; its Sources say %v", name, v.Sources)
		case v.ReadBy != by:
			t.Errorf("%s: the table says read by %v, the readers ask for it in %v", name, v.ReadBy, by)
		}
	}
	for _, v := range envdoc.Vars {
		if slices.Contains(v.Sources, envdoc.SourceEnvconfig) && asked[v.Name] == 0 {
			t.Errorf("%s is described as read by internal/envconfig, but no reader asks for it: remove it or fix Sources", v.Name)
		}
	}
}

// TestEnvTableMatchesAWSReferences: every variable awsenv resolves, and every reference it
// resolves them from, is described; every variable described as awsenv's is one of its
// references.
func TestEnvTableMatchesAWSReferences(t *testing.T) {
	t.Parallel()
	tab := table(t)
	refs := map[string]bool{}
	for resolved, from := range awsenv.References {
		if _, ok := tab[resolved]; !ok {
			t.Errorf("awsenv resolves %s, which the table lacks", resolved)
		}
		for _, f := range from {
			refs[f] = true
			v, ok := tab[f]
			if !ok || !slices.Contains(v.Sources, envdoc.SourceAWSEnv) || v.ReadBy != envdoc.All {
				t.Errorf("awsenv reads %s in every program (awsenv.Resolve); the table has %+v", f, v)
			}
		}
	}
	for _, v := range envdoc.Vars {
		if slices.Contains(v.Sources, envdoc.SourceAWSEnv) && !refs[v.Name] {
			t.Errorf("%s is described as an awsenv reference, but awsenv.References lacks it", v.Name)
		}
	}
}

// TestEnvTableHasTelemetryVariables: what telemetry asks for itself, and the variables the
// template passes it, are described.
func TestEnvTableHasTelemetryVariables(t *testing.T) {
	t.Parallel()
	var r recorder
	telemetry.Enabled(r.getenv)
	// A protocol it refuses makes Setup read it and stop before it builds an exporter.
	r.env = map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
	if _, err := telemetry.Setup(context.Background(), r.getenv, "test"); err == nil {
		t.Fatal("telemetry.Setup accepted OTEL_EXPORTER_OTLP_PROTOCOL=grpc; the test relies on that refusal")
	}
	tab := table(t)
	// And what the template passes to the functions.
	for _, n := range telemetry.Variables {
		r.read[n] = true
	}
	for _, n := range r.names() {
		if v, ok := tab[n]; !ok || !slices.Contains(v.Sources, envdoc.SourceTelemetry) {
			t.Errorf("telemetry reads %s; the table has %+v", n, v)
		}
	}
}

// TestEnvTableHasEveryLiteralRead: the functions' mains and the packages they start with
// read some variables directly (getenv("NAME")); each such name is described.
func TestEnvTableHasEveryLiteralRead(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..", "..")
	lit := regexp.MustCompile(`(?i)getenv\("([A-Z0-9_]+)"\)`)
	tab := table(t)
	found := 0
	for _, dir := range []string{"functions", "internal/receiverfunc", "internal/relayfunc", "internal/awsenv", "internal/telemetry", "internal/envconfig"} {
		files, err := gosrc.Files(filepath.Join(root, dir))
		if err != nil {
			t.Fatal(err)
		}
		for _, path := range files {
			if strings.Contains(path, "test"+string(filepath.Separator)) {
				continue // a test helper package (receivertest): no program reads it
			}
			src, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range lit.FindAllSubmatch(src, -1) {
				found++
				if _, ok := tab[string(m[1])]; !ok {
					t.Errorf("%s reads %s, which envdoc.Vars does not describe", path, m[1])
				}
			}
		}
	}
	if found == 0 {
		t.Fatal("found no getenv(\"...\") at all: the scan is broken")
	}
}

func TestEnvTableIsComplete(t *testing.T) {
	t.Parallel()
	for _, v := range envdoc.Vars {
		if v.Doc == "" || v.Default == "" || v.ReadBy == 0 || len(v.Sources) == 0 || !slices.Contains(envdoc.Groups, v.Group) {
			t.Errorf("%s: every field must be set and Group one of envdoc.Groups: %+v", v.Name, v)
		}
	}
}

// TestDocConfigurationIsGenerated: docs/configuration.md is `outboxctl env`'s output.
func TestDocConfigurationIsGenerated(t *testing.T) {
	t.Parallel()
	var want bytes.Buffer
	if err := envdoc.Markdown(&want); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "configuration.md"))
	if err != nil {
		t.Fatalf("%v: generate it with %s (or make docs)", err, envdoc.Regenerate)
	}
	if !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("docs/configuration.md differs from the variables' table: regenerate it with %s (or make docs)", envdoc.Regenerate)
	}
}
