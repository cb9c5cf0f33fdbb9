package qstashtest_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	upstash "github.com/upstash/qstash-go"

	"github.com/outbox-relay/outbox-relay/v3/internal/localqstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
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

// settled waits until srv has finished every delivery and returns what s received, failing
// the test unless that is n deliveries (what says which).
func (s *sink) settled(t *testing.T, srv *qstashtest.Server, n int, what string) []delivery {
	t.Helper()
	localqstash.WaitIdle(t, srv)
	got := s.deliveries()
	if len(got) != n {
		t.Fatalf("%d deliveries, want %d %s", len(got), n, what)
	}
	return got
}

func sdkClient(srv *qstashtest.Server) *upstash.Client {
	return upstash.NewClientWith(upstash.Options{Url: srv.URL, Token: srv.Token, Client: &http.Client{Timeout: 10 * time.Second}})
}
