package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/v3/internal/lambdatest"
	"github.com/outbox-relay/outbox-relay/v3/internal/localstack"
	"github.com/outbox-relay/outbox-relay/v3/internal/prereq"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

// buildCLI compiles outboxctl into a temporary directory, with flags added to go build.
func buildCLI(t *testing.T, flags ...string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "outboxctl")
	cmd := exec.Command("go", append(append([]string{"build"}, flags...), "-o", bin, ".")...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func requirePostgres(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, pgtest.URL())
	if err != nil {
		prereq.Missing(t, "Postgres at %s: %v", pgtest.URL(), err)
	}
	c.Close(ctx)
}

// The main job, as a user runs it: the whole pipeline, and a summary from the database.
func TestDevStackEndToEnd(t *testing.T) {
	t.Parallel()
	requirePostgres(t)
	bin := buildCLI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "dev", "--events", "2000", "--keys", "50", "--poison", "2", "--json")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+pgtest.URL(), "QSTASH_URL=")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("outboxctl dev: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	var s localstack.Summary
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &s); err != nil {
		t.Fatalf("last line is not the JSON summary: %v\n%s", err, stdout.String())
	}
	golden(t, "dev", lines[len(lines)-1], shapeOnly)
	if s.Produced != 2000 || s.Poison != 40 || s.Lost != 0 || s.DuplicateEffects != 0 ||
		s.DeadLetters != 40 || s.PoisonDeadLettered != 40 || s.Processed != 1960 || s.OrderViolations != 0 {
		t.Fatalf("summary %+v", s)
	}
}

func TestDevRejectsBadFlags(t *testing.T) {
	t.Parallel()
	code, _, stderr := runCLIEnv(t, nil, "dev", "--events", "0", "--poison", "120", "--ordering", "random")
	if code != 2 {
		t.Fatalf("exit %d, want 2", code)
	}
	for _, want := range []string{"--events", "--poison", "--ordering"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr %q does not mention %s", stderr, want)
		}
	}
}

// TestDevTrace: `outboxctl dev --trace --events 20` prints, for each of the first events,
// the four levels of its trace: the producer's business transaction, the relay batch span
// that links it, the delivery span (its child) and the inbox commit under that.
func TestDevTrace(t *testing.T) { // not parallel: the in-memory tracer provider is global
	requirePostgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	if code := run(ctx, env{stdout: &out, stderr: &errb, getenv: devEnv}, []string{"dev", "--trace", "--events", "20", "--poison", "0"}); code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	text := out.String()
	_, traces, ok := strings.Cut(text, "\ntraces (3 of 20 events")
	if !ok {
		t.Fatalf("no traces section:\n%s", text)
	}
	traces, _, _ = strings.Cut(traces, "\nsummary")
	blocks := strings.Split(traces, "\ntrace ")[1:]
	if len(blocks) != 3 {
		t.Fatalf("%d trace trees, want 3:\n%s", len(blocks), traces)
	}
	// Each level as RenderTraces indents it, in this order within one tree.
	levels := []string{"\nplace order  [internal", "\n  ~ linked from send ", "\n  └ process order.created  [consumer", "\n    └ inbox commit  [internal"}
	for i, b := range blocks {
		at := 0
		for _, l := range levels {
			j := strings.Index(b[at:], l)
			if j < 0 {
				t.Fatalf("trace %d lacks %q after position %d:\n%s", i, strings.TrimSpace(l), at, b)
			}
			at += j + len(l)
		}
		if !strings.Contains(b, "outbox.inbox_outcome=processed") {
			t.Fatalf("trace %d has no processed delivery:\n%s", i, b)
		}
	}
}

// TestDevDeployed: `outboxctl dev --deployed` runs the relay as deployed (built, under
// aws-lambda-rie behind the local Lambda service, kicked after each commit); with an
// hour between ticks only the kicks can deliver, and every event is applied once.
func TestDevDeployed(t *testing.T) {
	t.Parallel()
	requirePostgres(t)
	lambdatest.RequireRIE(t)
	// The run itself is bounded by --timeout; the rest is the build of the relay's
	// bootstrap (-trimpath, its own build cache entries), which took over three minutes in
	// CI while the race-enabled packages compiled beside it.
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	args := []string{"dev", "--deployed", "--schedule", "1h", "--events", "60", "--rate", "30", "--poison", "0", "--json", "--timeout", "1m"}
	if code := run(ctx, env{stdout: &out, stderr: &errb, getenv: devEnv}, args); code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	var s struct {
		Produced, Processed, Lost int
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &s); err != nil || s.Produced != 60 || s.Processed != 60 || s.Lost != 0 {
		t.Fatalf("summary %+v (%v):\n%s\n%s", s, err, out.String(), errb.String())
	}
	if !strings.Contains(errb.String(), "the relay as deployed (aws-lambda-rie, kicked, ticked every 1h0m0s)") {
		t.Fatalf("the banner does not name the deployed relay:\n%s", errb.String())
	}
}

// devEnv is the environment of a dev run on the tests' server: DATABASE_URL only.
func devEnv(k string) string {
	if k == "DATABASE_URL" {
		return pgtest.URL()
	}
	return ""
}
