package qstashtest_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	upstash "github.com/upstash/qstash-go"

	"github.com/outbox-relay/outbox-relay/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/pkg/qstash/qstashtest"
)

func TestMain(m *testing.M) {
	// qstash-go's NewClientWith lets QSTASH_URL override Options.Url.
	os.Unsetenv("QSTASH_URL")
	os.Exit(m.Run())
}

// delivery is one request a sink received, with both verifiers' verdicts.
type delivery struct {
	Path      string
	Header    http.Header
	Body      []byte
	VerifyErr error // the project's Verifier
	SDKErr    error // qstash-go's Receiver
}

// sink is a destination that verifies every request it gets and answers with respond.
type sink struct {
	*httptest.Server
	mu      sync.Mutex
	got     []delivery
	respond func(d delivery, n int) (int, http.Header, string)
}

func newSink(t *testing.T, respond func(d delivery, n int) (int, http.Header, string)) *sink {
	t.Helper()
	v, err := qstash.NewVerifier(qstash.VerifierConfig{CurrentSigningKey: qstash.DevCurrentSigningKey, NextSigningKey: qstash.DevNextSigningKey})
	if err != nil {
		t.Fatal(err)
	}
	recv := upstash.NewReceiver(qstash.DevCurrentSigningKey, qstash.DevNextSigningKey)
	s := &sink{respond: respond}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		url := s.URL + r.URL.RequestURI()
		d := delivery{Path: r.URL.Path, Header: r.Header.Clone(), Body: body}
		d.VerifyErr = v.Verify(r.Header.Get("Upstash-Signature"), url, body)
		d.SDKErr = recv.Verify(upstash.VerifyOptions{Signature: r.Header.Get("Upstash-Signature"), Url: url, Body: string(body)})
		s.mu.Lock()
		s.got = append(s.got, d)
		n := len(s.got)
		s.mu.Unlock()
		status, h, text := http.StatusOK, http.Header(nil), "ok"
		if s.respond != nil {
			status, h, text = s.respond(d, n)
		}
		for k, vs := range h {
			w.Header()[k] = vs
		}
		w.WriteHeader(status)
		io.WriteString(w, text)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *sink) deliveries() []delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]delivery(nil), s.got...)
}

func waitIdle(t *testing.T, srv *qstashtest.Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := srv.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
}

func sdkClient(srv *qstashtest.Server) *upstash.Client {
	return upstash.NewClientWith(upstash.Options{Url: srv.URL, Token: srv.Token, Client: &http.Client{Timeout: 10 * time.Second}})
}

// post sends a raw API request.
func post(t *testing.T, srv *qstashtest.Server, method, path string, h http.Header, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range h {
		req.Header[k] = vs
	}
	if req.Header.Get("Authorization") == "" {
		req.Header.Set("Authorization", "Bearer "+srv.Token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}
