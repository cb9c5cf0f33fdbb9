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

	"github.com/outbox-relay/outbox-relay/internal/localstack"
	"github.com/outbox-relay/outbox-relay/pkg/postgres/pgtest"
)

// buildCLI compiles outboxctl once per test binary run.
func buildCLI(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "outboxctl")
	cmd := exec.Command("go", "build", "-o", bin, ".")
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
		if os.Getenv("CI") != "" {
			t.Fatalf("Postgres at %s: %v", pgtest.URL(), err)
		}
		t.Skipf("Postgres at %s: %v", pgtest.URL(), err)
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
	if s.Produced != 2000 || s.Poison != 40 || s.Lost != 0 || s.DuplicateEffects != 0 ||
		s.DeadLetters != 40 || s.PoisonDeadLettered != 40 || s.Processed != 1960 || s.OrderViolations != 0 {
		t.Fatalf("summary %+v", s)
	}
}

func TestDevRejectsBadFlags(t *testing.T) {
	t.Parallel()
	var out, errb bytes.Buffer
	code := run(context.Background(), env{stdout: &out, stderr: &errb, getenv: func(string) string { return "" }},
		[]string{"dev", "--events", "0", "--poison", "120", "--ordering", "random"})
	if code != 2 {
		t.Fatalf("exit %d, want 2", code)
	}
	for _, want := range []string{"--events", "--poison", "--ordering"} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("stderr %q does not mention %s", errb.String(), want)
		}
	}
}
