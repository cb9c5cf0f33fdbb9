package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/logtest"
	"github.com/outbox-relay/outbox-relay/v3/internal/testwait"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

func TestUIRefusesANonLoopbackAddressWithoutAToken(t *testing.T) {
	t.Parallel()
	// No DATABASE_URL: the refusal comes before any database work.
	code, _, stderr := runCLI(t, "", "ui", "--listen", "0.0.0.0:0")
	if code != 2 || !strings.Contains(stderr, "needs a bearer token") || !strings.Contains(stderr, "OUTBOX_UI_TOKEN") {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
}

var consoleURLRE = regexp.MustCompile(`outbox console on (http://\S+)`)

func TestUIServesTheConsoleUntilCancelled(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	var out, errb logtest.Buffer
	const token = "ui-test-token"
	e := env{stdout: &out, stderr: &errb, getenv: func(k string) string {
		switch k {
		case "DATABASE_URL":
			return db.URL
		case "OUTBOX_UI_TOKEN":
			return token
		}
		return ""
	}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() { done <- run(ctx, e, []string{"ui", "--listen", "127.0.0.1:0"}) }()

	var url string
	testwait.EventuallyNil(t, 30*time.Second, func() error {
		if m := consoleURLRE.FindStringSubmatch(out.String()); m != nil {
			url = m[1]
			return nil
		}
		select {
		case code := <-done:
			t.Fatalf("ui exited with %d before serving: %s %s", code, out.String(), errb.String())
		default:
		}
		return fmt.Errorf("no console URL printed: %q", out.String())
	})
	if !strings.Contains(out.String(), "read-only") {
		t.Errorf("banner does not say read-only: %q", out.String())
	}
	// The token from OUTBOX_UI_TOKEN is enforced.
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("without token: %d", resp.StatusCode)
	}
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "overview-chart") {
		t.Fatalf("with token: %d", resp.StatusCode)
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("ui exited with %d after cancel: %s", code, errb.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("ui did not stop after cancel")
	}
}

func TestOpenPoolReadsTheAWSReferences(t *testing.T) {
	t.Parallel()
	// DATABASE_URL and DB_HOST together are ambiguous: awsenv.Resolve refuses them, so
	// every command (the console's included) reads the database the way the Lambdas do.
	var out, errb bytes.Buffer
	e := env{stdout: &out, stderr: &errb, getenv: func(k string) string {
		switch k {
		case "DATABASE_URL":
			return pgtest.URL()
		case "DB_HOST":
			return "db.internal"
		}
		return ""
	}}
	code := run(context.Background(), e, []string{"ui"})
	if code == 0 || !strings.Contains(errb.String(), "DATABASE_URL and DB_HOST are both set") {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
}

func TestDevUIServesTheConsoleWhileTheStackRuns(t *testing.T) {
	t.Parallel()
	requirePostgres(t)
	var out, errb logtest.Buffer
	e := env{stdout: &out, stderr: &errb, getenv: func(k string) string {
		if k == "DATABASE_URL" {
			return pgtest.URL()
		}
		return ""
	}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, e, []string{"dev", "--ui", "--ui-listen", "127.0.0.1:0", "--events", "40", "--keys", "5", "--poison", "5"})
	}()

	// The URL is printed, and the console shows the stack's two poison dead letters once
	// the pipeline has handled them; the stack stays up (--ui implies --forever). Ctrl-C
	// comes once every event is settled (the progress line), or dev counts some as lost.
	settled := regexp.MustCompile(`processed 38\s+dead letters 2\s`)
	var url string
	testwait.EventuallyNil(t, 2*time.Minute, func() error {
		if url == "" {
			if m := consoleURLRE.FindStringSubmatch(out.String()); m != nil {
				url = m[1]
			}
		}
		if url != "" {
			resp, err := http.Get(url)
			if err == nil {
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK && strings.Contains(string(body), `id="fig-dead">2<`) && settled.MatchString(out.String()) {
					return nil
				}
			}
		}
		select {
		case code := <-done:
			t.Fatalf("dev exited with %d while the console was expected: %s %s", code, out.String(), errb.String())
		default:
		}
		return fmt.Errorf("console at %q never showed 2 dead letters; output %q", url, out.String())
	})
	if !strings.Contains(out.String(), "redrive: ENABLED") {
		t.Errorf("banner: %q", out.String())
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("dev exited with %d after Ctrl-C: %s", code, errb.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("dev did not stop")
	}
	if _, err := http.Get(url); err == nil {
		t.Fatal("the console still answers after the stack stopped")
	}
}

func TestDevUIRefusesANonLoopbackAddress(t *testing.T) {
	t.Parallel()
	code, _, stderr := runCLI(t, "", "dev", "--ui", "--ui-listen", "0.0.0.0:8089")
	if code != 2 || !strings.Contains(stderr, "--ui-listen must be a loopback") {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
}
