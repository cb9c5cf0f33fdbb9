// Package localqstash holds what tests do against the local QStash server (qstashtest) as a
// client other than the relay: an API request by hand (a producer publishing, an operator
// reading a queue), and waiting until every delivery is over.
package localqstash

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
)

// noRedirects is the client of Call and Send: a redirect is an answer the test sees (the
// server must route raw paths, not clean them into redirects), never one it follows.
var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// Call sends method path (below srv.URL) with body and the header h to srv's API, with
// srv's token as the bearer unless h sets Authorization (to "" for none), and returns the
// answer with its body read.
func Call(t testing.TB, srv *qstashtest.Server, method, path string, h http.Header, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range h {
		req.Header[k] = vs
	}
	return Send(t, srv, req)
}

// Send sends req, with srv's token as the bearer unless req has an Authorization header,
// and returns the answer with its body read. A request that gets no answer fails the test.
func Send(t testing.TB, srv *qstashtest.Server, req *http.Request) (*http.Response, string) {
	t.Helper()
	if _, set := req.Header["Authorization"]; !set {
		req.Header.Set("Authorization", "Bearer "+srv.Token)
	} else if req.Header.Get("Authorization") == "" {
		req.Header.Del("Authorization")
	}
	resp, err := noRedirects.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read answer: %v", req.Method, req.URL.Path, err)
	}
	return resp, string(b)
}

// WaitIdle waits until srv has finished every delivery and failure callback, failing the
// test after a minute.
func WaitIdle(t testing.TB, srv *qstashtest.Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := srv.WaitIdle(ctx); err != nil {
		t.Fatalf("deliveries did not finish: %v", err)
	}
}
