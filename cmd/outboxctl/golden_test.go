package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the commands' --json output")

// volatileKeys are the fields whose values differ from run to run (ids, times, durations,
// sizes, the shared server's sessions): their value is replaced, their presence and
// null-ness kept.
var volatileKeys = map[string]bool{
	"id": true, "outbox_id": true, "letter_id": true, "sample_id": true, "oldest_pending_id": true,
	"created_at": true, "resolved_at": true, "first_seen": true, "last_seen": true, "checked_at": true,
	"duration_ms": true, "duration": true, "oldest_pending_age_seconds": true,
	"total_bytes": true, "table_bytes": true, "index_bytes": true, "rows_estimate": true, "dead_tuples": true,
	"dispatched_per_minute": true, "xmin_horizon": true, "ids": true, "not_found": true,
}

// absentOrNot are fields that come and go with the shared server's state (omitempty: an
// autovacuum that ran, another session's open transaction): the golden file leaves them out.
var absentOrNot = map[string]bool{
	"last_vacuum": true, "last_autovacuum": true,
	"oldest_transaction_pid": true, "oldest_transaction_state": true, "oldest_transaction_application": true,
}

// shapeOnly marks a document whose every value varies (chaos and dev runs: timing, random
// faults): the golden file pins its fields and their types.
func shapeOnly(string) bool { return true }

func volatile(key string) bool { return volatileKeys[key] }

// normalise replaces the values of the keys isVolatile names with a placeholder of their
// JSON type; null stays null.
func normalise(v any, isVolatile func(string) bool) any {
	switch x := v.(type) {
	case map[string]any:
		for k, val := range x {
			if absentOrNot[k] {
				delete(x, k)
				continue
			}
			if isVolatile(k) {
				x[k] = placeholder(val, isVolatile)
			} else {
				x[k] = normalise(val, isVolatile)
			}
		}
	case []any:
		for i, val := range x {
			x[i] = normalise(val, isVolatile)
		}
	}
	return v
}

func placeholder(v any, isVolatile func(string) bool) any {
	switch x := v.(type) {
	case nil:
		return nil
	case json.Number:
		return "<number>"
	case string:
		return "<string>"
	case bool:
		return "<bool>"
	case []any:
		if len(x) == 0 {
			return x
		}
		return []any{placeholder(x[0], isVolatile)} // one element shows the type
	case map[string]any:
		return normalise(x, func(string) bool { return true })
	}
	return v
}

// golden compares the --json output out with testdata/<name>.golden, normalised; -update
// rewrites the file.
func golden(t *testing.T, name, out string, isVolatile func(string) bool) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(out))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("%s: not JSON: %v\n%s", name, err, out)
	}
	if dec.More() {
		t.Fatalf("%s: more than one JSON document:\n%s", name, out)
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // "<number>", not "\u003cnumber\u003e"
	enc.SetIndent("", "  ")
	if err := enc.Encode(normalise(v, isVolatile)); err != nil {
		t.Fatal(err)
	}
	got := b.Bytes()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run %s -update)", err, t.Name())
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s --json changed (if meant: go test -run %s -update, and say so in CHANGELOG.md):\ngot:\n%s\nwant:\n%s", name, t.Name(), got, want)
	}
}

// TestJSONGoldenDLQ pins what dlq list, show and redrive print with --json, and that the
// deprecated spellings (list --all, list --group, show --all) still answer the same.
func TestJSONGoldenDLQ(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	l1, _ := seedLetter(t, db, "order.created", "order:1", "m1")
	seedLetter(t, db, "invoice.paid", "order:2", "m2")
	s1 := strconv.FormatInt(l1, 10)
	cli := func(wantCode int, args ...string) string {
		t.Helper()
		code, out, stderr := runCLI(t, db.URL, args...)
		if code != wantCode {
			t.Fatalf("%v: exit %d, want %d\n%s%s", args, code, wantCode, out, stderr)
		}
		return out
	}
	golden(t, "dlq_list", cli(0, "dlq", "list", "--json"), volatile)
	groups := cli(0, "dlq", "list", "--groups", "--json")
	golden(t, "dlq_list_groups", groups, volatile)
	golden(t, "dlq_show", cli(0, "dlq", "show", s1, "--json"), volatile)
	var gs []struct{ Fingerprint string }
	if err := json.Unmarshal([]byte(groups), &gs); err != nil || len(gs) == 0 {
		t.Fatalf("groups %v %s", err, groups)
	}
	golden(t, "dlq_show_group", cli(0, "dlq", "show", "--group", gs[0].Fingerprint, "--json"), volatile)
	golden(t, "dlq_redrive_dry_run", cli(0, "dlq", "redrive", "--all", "--dry-run", "--json"), volatile)
	// One letter redriven, one that does not exist: the negative answer, exit 1.
	golden(t, "dlq_redrive", cli(1, "dlq", "redrive", s1, "999999", "--json"), volatile)
	resolved := cli(0, "dlq", "list", "--include-resolved", "--json")
	golden(t, "dlq_list_include_resolved", resolved, volatile)

	for _, c := range []struct {
		old, now []string
	}{
		{[]string{"dlq", "list", "--all", "--json"}, []string{"dlq", "list", "--include-resolved", "--json"}},
		{[]string{"dlq", "list", "--group", "--json"}, []string{"dlq", "list", "--groups", "--json"}},
		{[]string{"dlq", "show", "--group", gs[0].Fingerprint, "--all", "--json"}, []string{"dlq", "show", "--group", gs[0].Fingerprint, "--include-resolved", "--json"}},
	} {
		code, out, stderr := runCLI(t, db.URL, c.old...)
		if want := cli(0, c.now...); code != 0 || out != want {
			t.Errorf("%v: exit %d, printed\n%s\nwant what %v prints:\n%s", c.old, code, out, c.now, want)
		}
		if !strings.Contains(stderr, "is deprecated") || !strings.Contains(stderr, "use --"+strings.TrimPrefix(c.now[len(c.now)-2], "--")) {
			t.Errorf("%v: no deprecation warning naming the new flag: %q", c.old, stderr)
		}
	}
}

// TestJSONGoldenStatus pins status --json: healthy (exit 0) and unhealthy (exit 1).
func TestJSONGoldenStatus(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	mustExec(t, db, `INSERT INTO outbox (topic, partition_key, payload, dispatched_at) SELECT 't', 'k', '{}', now() - interval '3 minutes' FROM generate_series(1, 7)`)
	code, out, stderr := runCLI(t, db.URL, append([]string{"status", "--json"}, relaxed...)...)
	if code != 0 {
		t.Fatalf("status: exit %d\n%s%s", code, out, stderr)
	}
	golden(t, "status_healthy", out, volatile)
	mustExec(t, db, `INSERT INTO outbox (topic, partition_key, payload, created_at) VALUES ('t', 'k', '{}', now() - interval '20 minutes')`)
	code, out, stderr = runCLI(t, db.URL, append([]string{"status", "--json", "--max-oldest-age", "10m"}, relaxed...)...)
	if code != 1 {
		t.Fatalf("status: exit %d, want 1\n%s%s", code, out, stderr)
	}
	golden(t, "status_unhealthy", out, func(k string) bool { return volatile(k) || k == "reasons" })
}

// TestJSONGoldenRetention pins retention run --json, planned and run (with --batch, the
// deprecated spelling of --delete-batch).
func TestJSONGoldenRetention(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	mustExec(t, db, `INSERT INTO outbox (topic, partition_key, payload, dispatched_at) SELECT 't', 'k', '{}', now() - interval '30 days' FROM generate_series(1, 5)`)
	for _, c := range []struct{ name, flag string }{{"retention_dry_run", "--dry-run"}, {"retention_run", "--batch=1000"}} {
		code, out, stderr := runCLI(t, db.URL, "retention", "run", c.flag, "--json")
		if code != 0 {
			t.Fatalf("%s: exit %d\n%s%s", c.name, code, out, stderr)
		}
		golden(t, c.name, out, volatile)
		if deprecated := strings.Contains(stderr, "--batch is deprecated"); deprecated != (c.flag == "--batch=1000") {
			t.Errorf("%s %s: stderr %q", c.name, c.flag, stderr)
		}
	}
}

// TestJSONGoldenChaos pins the shape of chaos --json on a short run without faults.
func TestJSONGoldenChaos(t *testing.T) {
	t.Parallel()
	code, out, stderr := runCLIEnv(t, map[string]string{"DATABASE_URL": pgtest.URL()}, "chaos", "--no-faults", "--events", "40", "--relays", "1", "--seed", "1", "--json")
	if code != 0 {
		t.Fatalf("chaos: exit %d\n%s%s", code, out, stderr)
	}
	golden(t, "chaos", out, shapeOnly)
}

// TestJSONGoldenVersion pins the fields of version --json (their values are the build's).
func TestJSONGoldenVersion(t *testing.T) {
	t.Parallel()
	code, out, stderr := runCLIEnv(t, nil, "version", "--json")
	if code != 0 {
		t.Fatalf("version: exit %d\n%s%s", code, out, stderr)
	}
	golden(t, "version", out, shapeOnly)
}
