package main

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

// TestDLQRedriveTraced: with OTEL_EXPORTER_OTLP_ENDPOINT set, `dlq redrive` exports its
// span to that collector before it exits; without it, nothing is sent.
func TestDLQRedriveTraced(t *testing.T) { // not parallel: the SDK reads the process environment
	var posts atomic.Int64
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/v1/traces" {
			posts.Add(1)
		}
	}))
	defer collector.Close()
	db := pgtest.New(t)
	l1, _ := seedLetter(t, db, "order.created", "order:1", "m1")
	l2, _ := seedLetter(t, db, "order.created", "order:2", "m2")

	if code, out, stderr := runCLI(t, db.URL, "dlq", "redrive", strconv.FormatInt(l1, 10)); code != 0 || posts.Load() != 0 {
		t.Fatalf("untraced redrive: %d %s %s; %d exports", code, out, stderr, posts.Load())
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	code, out, stderr := runCLIEnv(t, map[string]string{"DATABASE_URL": db.URL, "OTEL_EXPORTER_OTLP_ENDPOINT": collector.URL},
		"dlq", "redrive", strconv.FormatInt(l2, 10))
	if code != 0 || posts.Load() == 0 {
		t.Fatalf("traced redrive: %d %s %s; %d exports, want the redrive's span exported before exit", code, out, stderr, posts.Load())
	}
}
