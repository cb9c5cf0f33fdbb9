package main

import (
	"context"
	neturl "net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

// flagEntryRE matches one flag of the Flags section of -h: its name and its description.
var flagEntryRE = regexp.MustCompile(`(?m)^  -([a-z0-9-]+)[^\n]*((?:\n    [^\n]*)*)`)

// TestUsageLineNamesEveryFlag: the usage line of these commands (the text above "Flags:")
// names every flag they take but the deprecated spellings and -h, so a reader of the
// synopsis misses none. The commands with a family of flags (qstash-dev's and chaos's
// fault rates, bench's scenarios) summarise them instead and are not listed.
func TestUsageLineNamesEveryFlag(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"dev"}, {"relay"}, {"status"}, {"migrate", "up"}, {"dlq", "list"}, {"dlq", "show"}, {"dlq", "redrive"},
		{"dlq", "sync"}, {"retention", "run"}, {"sign-event"}, {"ui"},
	} {
		code, out, errOut := runCLIEnv(t, nil, append(args, "-h")...)
		synopsis, flags, ok := strings.Cut(out+errOut, "\nFlags:\n")
		if code != 0 || !ok {
			t.Errorf("outboxctl %s -h: exit %d, no Flags section:\n%s", strings.Join(args, " "), code, out+errOut)
			continue
		}
		for _, m := range flagEntryRE.FindAllStringSubmatch(flags, -1) {
			if m[1] == "h" || strings.Contains(m[2], "deprecated spelling") {
				continue
			}
			if !regexp.MustCompile(`[\s\[(|]--?` + regexp.QuoteMeta(m[1]) + `[\s\]=)|]`).MatchString(synopsis + " ") {
				t.Errorf("outboxctl %s -h: the usage does not name --%s:\n%s", strings.Join(args, " "), m[1], synopsis)
			}
		}
	}
}

// TestBadDatabaseURLIsUsage: a DATABASE_URL that does not parse is an invalid environment,
// exit 2 as the help says, for every command that opens the database; the message names
// the variable and never quotes the string (it may hold a password).
func TestBadDatabaseURLIsUsage(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"status"}, {"migrate", "up"}, {"migrate", "status"}, {"dlq", "list"}, {"dlq", "show", "1"}, {"retention", "run", "--dry-run"}} {
		code, _, stderr := runCLIEnv(t, map[string]string{"DATABASE_URL": "postgres://app:s3cret@db:notaport/app"}, args...)
		if code != exitUsage || !strings.Contains(stderr, "DATABASE_URL") || !strings.Contains(stderr, "not a valid Postgres connection string") || strings.Contains(stderr, "s3cret") {
			t.Errorf("outboxctl %s with a bad DATABASE_URL: exit %d, %s", strings.Join(args, " "), code, stderr)
		}
	}
	// A server that does not answer is a runtime failure, 3.
	code, _, stderr := runCLIEnv(t, map[string]string{"DATABASE_URL": "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=5"}, "status")
	if code != exitRuntime {
		t.Errorf("status with an unreachable server: exit %d, %s", code, stderr)
	}
}

// TestUnmigratedDatabaseSaysMigrate: a database without the outbox's tables is answered
// with what to do, not only Postgres's 'relation does not exist'.
func TestUnmigratedDatabaseSaysMigrate(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWithOptions(t, pgtest.Options{NoMigrate: true})
	for _, args := range [][]string{{"status"}, {"dlq", "list"}, {"dlq", "list", "--groups"}, {"dlq", "show", "1"}} {
		code, _, stderr := runCLI(t, db.URL, args...)
		if code != exitRuntime || !strings.Contains(stderr, "does not exist") || !strings.Contains(stderr, "hint:") ||
			!strings.Contains(stderr, "run `outboxctl migrate up` on it first") {
			t.Errorf("outboxctl %s on an unmigrated database: exit %d, %s", strings.Join(args, " "), code, stderr)
		}
	}
}

// TestGroupWithoutLettersIsNo: show and redrive agree about a group with no open letter:
// both answer 1, dry run or not.
func TestGroupWithoutLettersIsNo(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	const unknown = "0123456789abcdef"
	for _, args := range [][]string{
		{"dlq", "show", "--group", unknown},
		{"dlq", "redrive", "--group", unknown, "--dry-run"},
		{"dlq", "redrive", "--group", unknown},
	} {
		if code, _, stderr := runCLI(t, db.URL, args...); code != exitNegative || !strings.Contains(stderr, unknown) {
			t.Errorf("outboxctl %s: exit %d, %s; want 1 naming the group", strings.Join(args, " "), code, stderr)
		}
	}
}

// TestRelayNamesEachMissingVariableOnce: relay with no environment lists each required
// variable once, and exits 2.
func TestRelayNamesEachMissingVariableOnce(t *testing.T) {
	t.Parallel()
	code, _, stderr := runCLIEnv(t, nil, "relay")
	if code != exitUsage {
		t.Fatalf("exit %d, want 2: %s", code, stderr)
	}
	for _, v := range []string{"DATABASE_URL", "QSTASH_TOKEN", "PUBLIC_BASE_URL"} {
		if n := strings.Count(stderr, v+":"); n != 1 {
			t.Errorf("%s named %d times:\n%s", v, n, stderr)
		}
	}
}

// TestDevKeepSaysHowToReachTheSchema: dev --keep prints the kept schema and a DATABASE_URL
// that reaches it (the other commands answer on it), and refuses when nothing would outlive
// the run.
func TestDevKeepSaysHowToReachTheSchema(t *testing.T) {
	t.Parallel()
	requirePostgres(t)
	if code, _, stderr := runCLIEnv(t, nil, "dev", "--keep"); code != exitUsage || !strings.Contains(stderr, "--keep needs") {
		t.Fatalf("--keep on a throwaway cluster: exit %d, %s; want 2", code, stderr)
	}
	code, out, stderr := runCLIEnv(t, map[string]string{"DATABASE_URL": pgtest.URL()}, "dev", "--keep", "--events", "20", "--keys", "2", "--poison", "0")
	if code != 0 {
		t.Fatalf("dev --keep: exit %d\n%s\n%s", code, out, stderr)
	}
	m := regexp.MustCompile(`(?m)^kept schema (dev_\w+) for inspection$[\s\S]*^  DATABASE_URL='([^']+)' outboxctl status`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("dev --keep does not say how to reach the schema:\n%s", out)
	}
	schema, url := m[1], m[2]
	admin := pgtest.OpenPool(t, pgtest.URL(), nil) // closed after the drop: cleanups run last first
	t.Cleanup(func() {
		if _, err := admin.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop the kept schema: %v", err)
		}
	})
	if strings.Contains(url, "xxxxx") {
		// The printed URL hides DATABASE_URL's password (as it must); the check puts it back
		// rather than skip, so a server that demands one is covered too.
		base, err := neturl.Parse(pgtest.URL())
		if err != nil {
			t.Fatal(err)
		}
		pw, _ := base.User.Password()
		url = strings.Replace(url, ":xxxxx@", ":"+neturl.QueryEscape(pw)+"@", 1)
	}
	// The printed URL reaches the kept schema: its 20 events are there.
	code, out, stderr = runCLIEnv(t, map[string]string{"DATABASE_URL": url}, "dlq", "list", "--json")
	if code != 0 || strings.TrimSpace(out) != "[]" {
		t.Fatalf("dlq list on the printed URL: exit %d %s %s", code, out, stderr)
	}
	pool := pgtest.OpenPool(t, url, nil)
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox").Scan(&n); err != nil || n != 20 {
		t.Fatalf("outbox rows on the printed URL: %d %v, want 20", n, err)
	}
}
