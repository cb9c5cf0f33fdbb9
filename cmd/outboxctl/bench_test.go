package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/v3/cmd/outboxctl/internal/bench"
	"github.com/outbox-relay/outbox-relay/v3/internal/pgcluster"
	"github.com/outbox-relay/outbox-relay/v3/internal/prereq"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

// TestBenchCommand runs outboxctl bench at the tiny size (the memory scenario re-executes
// outboxctl itself, which a test binary is not, so it is covered in cmd/outboxctl/internal/bench).
func TestBenchCommand(t *testing.T) {
	t.Parallel()
	_ = pgtest.New(t) // fails under CI when Postgres is unreachable
	dir := t.TempDir()
	out, chart := filepath.Join(dir, "r.json"), filepath.Join(dir, "d.svg")
	code, stdout, stderr := runCLI(t, pgtest.URL(), "bench", "--size", "tiny", "--scenarios", "drain,claim", "--out", out, "--chart", chart)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	for _, want := range []string{"## Targets", "## 1. Drain throughput", "## 2. Claim cost"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q", want)
		}
	}
	if !strings.Contains(stderr, "drain relay") {
		t.Errorf("no progress on stderr:\n%s", stderr)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Size    string
		Summary map[string]*float64
	}
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	if res.Size != "tiny" || res.Summary["relay_vs_floor"] == nil || res.Summary["claim_p99_ratio_5m_vs_0"] == nil {
		t.Errorf("results: size %q, summary %v", res.Size, res.Summary)
	}
	for _, path := range []string{chart, filepath.Join(dir, "d-rtt.svg")} {
		svg, err := os.ReadFile(path)
		if err != nil || !strings.HasPrefix(string(svg), "<svg") {
			t.Errorf("chart %s: %v %.40q", path, err, svg)
		}
	}
}

// TestBenchRelayDrain times one small relay drain, the run `make bench-river` compares
// River with.
func TestBenchRelayDrain(t *testing.T) {
	t.Parallel()
	_ = pgtest.New(t) // fails under CI when Postgres is unreachable
	code, stdout, stderr := runCLI(t, pgtest.URL(), "bench", "relay-drain", "--events", "3000", "--keys", "50", "--batch", "500", "--rtt", "5")
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if !strings.HasPrefix(stdout, "outbox-relay: 3000 events over 50 keys drained in ") || !strings.Contains(stdout, "batch 500") || !strings.Contains(stdout, "rtt 5 ms") {
		t.Errorf("stdout %q", stdout)
	}
}

func TestBenchArgumentErrors(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"bench", "--scenarios", "drain,nope"},
		{"bench", "--size", "huge"},
		{"bench", "extra"},
		{"bench", "relay-drain", "--events", "0"},
		{"bench", "relay-drain", "--rtt", "-1"},
		{"bench", "relay-drain", "extra"},
	} {
		code, _, stderr := runCLI(t, "postgres://unused", args...)
		if code != 2 || stderr == "" {
			t.Errorf("%v: exit %d, stderr %q; want 2 and a message", args, code, stderr)
		}
	}
}

// Without DATABASE_URL the bench runs on a throwaway cluster with PostgreSQL's defaults and
// says so, on stderr and in the report (autovacuum on, unlike the CI machines' server).
func TestBenchThrowawayCluster(t *testing.T) {
	t.Parallel()
	if _, err := pgcluster.FindPostgresBin(); err != nil {
		prereq.Missing(t, "%v", err)
	}
	code, stdout, stderr := runCLIEnv(t, map[string]string{}, "bench", "--size", "tiny", "--scenarios", "claim")
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if !strings.Contains(stderr, "DATABASE_URL is unset: running on a throwaway cluster") {
		t.Errorf("stderr does not name the cluster:\n%s", stderr)
	}
	if !strings.Contains(stdout, "autovacuum=on) on "+bench.ThrowawayCluster) {
		t.Errorf("report does not name the cluster and its autovacuum:\n%s", stdout)
	}
}
