// Package tour_test runs the README's five-minute tour as written: it copies the tour's
// code blocks out of README.md into a module of its own, outside this repository, that
// requires the project by its module path (a replace points at this checkout), builds it
// and runs it against Postgres and the local QStash server, with a relay in between. The
// README cannot drift from what compiles and works, and the module path is what a `go get`
// user imports.
package tour_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/lambdatest"
	"github.com/outbox-relay/outbox-relay/v3/internal/logtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

// block is one fenced code block of the README.
type block struct{ lang, text string }

// tourBlocks returns the fenced blocks of the README's "A five-minute tour" section.
func tourBlocks(t *testing.T, readme string) []block {
	t.Helper()
	_, section, ok := strings.Cut(readme, "\n## A five-minute tour\n")
	if !ok {
		t.Fatal("README.md has no \"## A five-minute tour\" section")
	}
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	var blocks []block
	for _, m := range regexp.MustCompile("(?ms)^```(\\w+)\n(.*?)^```$").FindAllStringSubmatch(section, -1) {
		blocks = append(blocks, block{m[1], m[2]})
	}
	return blocks
}

// only returns the blocks of lang, failing unless there are n.
func only(t *testing.T, blocks []block, lang string, n int) []string {
	t.Helper()
	var out []string
	for _, b := range blocks {
		if b.lang == lang {
			out = append(out, b.text)
		}
	}
	if len(out) != n {
		t.Fatalf("the tour has %d %s blocks, want %d (update this test with the README)", len(out), lang, n)
	}
	return out
}

// program assembles the tour's Go blocks into one main package: the import block (step 0),
// the producer (step 1) as produce and the consumer (step 3) as consume. What it adds is
// what every service already has: a pool, a context, a main.
func program(imports, produce, consume string) string {
	own, ok := strings.CutPrefix(strings.TrimSpace(imports), "import (")
	own = strings.TrimSuffix(own, ")")
	if !ok {
		own = "" // the build then fails on the missing packages, naming them
	}
	return `package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
` + own + `)

// The tour's blocks need not use every standard package this file imports.
var (
	_ = json.Valid
	_ = fmt.Errorf
	_ = http.ListenAndServe
	_ = os.Getenv
	_ pgx.Tx
)

func main() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	if err := produce(ctx, pool); err != nil {
		log.Fatal("produce: ", err)
	}
	log.Fatal("consume: ", consume(ctx, pool))
}

func produce(ctx context.Context, pool *pgxpool.Pool) error {
` + produce + `	return err
}

func consume(ctx context.Context, pool *pgxpool.Pool) error {
` + consume + `}
`
}

// TestTourRunsAsWritten builds the README's tour in a module outside the repository and
// runs it: the order it produces is relayed through QStash to its handler, which confirms
// it. With GOPROXY from the environment, the module proxy may be asked for what the module
// cache lacks.
func TestTourRunsAsWritten(t *testing.T) {
	t.Parallel()
	root, err := lambdatest.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	modPath := regexp.MustCompile(`(?m)^module (\S+)$`).FindSubmatch(gomod)
	goLine := regexp.MustCompile(`(?m)^go \S+$`).Find(gomod)
	if modPath == nil || goLine == nil {
		t.Fatal("go.mod has no module or go line")
	}
	module := string(modPath[1])

	blocks := tourBlocks(t, string(readme))
	sh := only(t, blocks, "sh", 3)
	if want := "go get " + module + "@latest"; !strings.Contains(sh[0], want) {
		t.Fatalf("the tour's first command block does not say %q:\n%s", want, sh[0])
	}
	sqls := only(t, blocks, "sql", 1)
	gos := only(t, blocks, "go", 3)
	for _, imp := range regexp.MustCompile(`"([^"]+)"`).FindAllStringSubmatch(gos[0], -1) {
		if !strings.HasPrefix(imp[1], module+"/") {
			t.Errorf("the tour imports %s, not a package of %s", imp[1], module)
		}
	}

	// The throwaway module: outside the repository, requiring the project by its path.
	dir := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", fmt.Sprintf("module example.com/tour\n\n%s\n\nrequire %s v3.0.0\n\nreplace %s => %s\n", goLine, module, module, root))
	// The checkout's go.sum covers every module the tour's imports reach; -mod=mod adds the
	// requirements the build needs to go.mod, at the versions the project's go.mod selects.
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	write("go.sum", string(sum))
	write("main.go", program(gos[0], gos[1], gos[2]))

	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	bin := filepath.Join(dir, "tour")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	build.Dir = dir
	build.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the tour outside the repository: %v\n%s\nmain.go:\n%s", err, out, program(gos[0], gos[1], gos[2]))
	}

	// Run it: the README's table, the migrated outbox schema, the local QStash server.
	db := pgtest.New(t)
	if _, err := db.Pool.Exec(ctx, sqls[0]); err != nil {
		t.Fatalf("run the tour's SQL: %v", err)
	}
	qs := qstashtest.NewServer(qstashtest.Options{})
	t.Cleanup(qs.Close)
	addr := freeAddr(t)
	public := "http://" + addr
	tour := exec.CommandContext(ctx, bin)
	logs := &logtest.Buffer{}
	tour.Stdout, tour.Stderr = logs, logs
	tour.Env = append(os.Environ(), "DATABASE_URL="+db.URL, "LISTEN_ADDR="+addr, "PUBLIC_BASE_URL="+public,
		"QSTASH_CURRENT_SIGNING_KEY="+qs.CurrentSigningKey, "QSTASH_NEXT_SIGNING_KEY="+qs.NextSigningKey)
	if err := tour.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var exitErr error
	go func() {
		exitErr = tour.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = tour.Process.Kill()
		<-exited
	})
	running := func() error {
		select {
		case <-exited:
			return fmt.Errorf("the tour exited (%v):\n%s", exitErr, logs)
		default:
			return nil
		}
	}
	waitFor(t, running, logs, "the tour's order and its event", func() bool {
		return db.Count(t, `SELECT count(*) FROM orders o JOIN outbox e ON e.partition_key = 'order:' || o.id WHERE o.id = 'o-42'`) == 1
	})

	pub, err := qstash.NewPublisher(qstash.PublisherConfig{BaseURL: qs.URL, Token: qs.Token, DestinationBaseURL: public})
	if err != nil {
		t.Fatal(err)
	}
	r, err := relay.New(db.Pool, pub, relay.Config{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	stop, stopRelay := context.WithCancel(ctx)
	relayed := make(chan error, 1)
	go func() {
		_, err := r.Run(stop)
		relayed <- err
	}()
	// Before the QStash server closes (cleanups run last first).
	t.Cleanup(func() {
		stopRelay()
		if err := <-relayed; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("relay: %v", err)
		}
	})
	waitFor(t, running, logs, "the handler to confirm order o-42", func() bool {
		return db.Count(t, `SELECT count(*) FROM orders WHERE id = 'o-42' AND confirmed_at IS NOT NULL`) == 1
	})
}

// waitFor polls cond until it holds, failing if running reports an error (the program
// under test exited) or a minute passes first.
func waitFor(t *testing.T, running func() error, logs fmt.Stringer, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if err := running(); err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; the program said:\n%s", what, logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// freeAddr returns a loopback address no one listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}
