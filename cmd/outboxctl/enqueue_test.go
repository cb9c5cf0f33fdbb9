package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

// TestEnqueueCommitsEachLineAndKicks: each line is committed and its id printed; with
// RELAY_FUNCTION set the relay is kicked through the Lambda Invoke API at
// AWS_ENDPOINT_URL_LAMBDA (coalesced: one kick for lines committed within its interval);
// a bad line stops the command with a usage error after the lines before it.
func TestEnqueueCommitsEachLineAndKicks(t *testing.T) {
	// t.Setenv: the AWS SDK reads the process environment.
	db := pgtest.New(t)
	var kicks atomic.Int32
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/2015-03-31/functions/relay-fn/invocations" && r.Header.Get("X-Amz-Invocation-Type") == "Event" {
			kicks.Add(1)
			w.WriteHeader(http.StatusAccepted)
			return
		}
		http.NotFound(w, r)
	}))
	defer api.Close()
	for k, v := range map[string]string{"AWS_ENDPOINT_URL_LAMBDA": api.URL, "AWS_REGION": "eu-west-1", "AWS_ACCESS_KEY_ID": "AKIDLOCAL",
		"AWS_SECRET_ACCESS_KEY": "local", "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"} {
		t.Setenv(k, v)
	}
	vars := map[string]string{"DATABASE_URL": db.URL, "RELAY_FUNCTION": "relay-fn"}
	in := `{"topic":"order.created","partition_key":"order:1","payload":{"order_id":"1"}}

{"topic":"order.paid","partition_key":"order:1","payload":{"order_id":"1"},"headers":{"x-request-id":"r1"}}
{"topic":"bad topic","partition_key":"order:2","payload":{}}
{"topic":"order.created","partition_key":"order:3","payload":{}}
`
	var out, errb bytes.Buffer
	code := run(t.Context(), env{stdout: &out, stderr: &errb, stdin: strings.NewReader(in), getenv: func(k string) string { return vars[k] }}, []string{"enqueue", "--json"})
	if code != exitUsage || !strings.Contains(errb.String(), "line 4:") {
		t.Fatalf("exit %d, stderr %s: want a usage error naming line 4", code, errb.String())
	}
	if got := strings.Count(out.String(), `"id":`); got != 2 || !strings.Contains(out.String(), `{"line":1,"id":`) || !strings.Contains(out.String(), `{"line":3,"id":`) {
		t.Fatalf("stdout %q: want the ids of lines 1 and 3", out.String())
	}
	if n := db.Count(t, `SELECT count(*) FROM outbox`); n != 2 {
		t.Fatalf("%d events committed, want 2", n)
	}
	if n := db.Count(t, `SELECT count(*) FROM outbox WHERE headers->>'x-request-id' = 'r1'`); n != 1 {
		t.Fatal("the second line's header was not kept")
	}
	if n := kicks.Load(); n != 1 {
		t.Fatalf("%d kicks, want 1 (two commits within the kick interval)", n)
	}
}
