package qstash_test

// Day two in production (issue 27): answers that are about the deployment or about QStash,
// never about the messages, spend no attempt and dead-letter nothing; the token is re-read
// when QStash refuses it.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/testwait"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
)

// A relay configured for payg (Upstash-Retries 5) against a free account (cap 3): QStash
// refuses a header every message carries. Whatever the wording and the batch-error shape,
// the 200 messages are deferred for the deployment, naming the variable when the wording
// says which, in at most three requests; nothing is accepted, nothing is permanent.
func TestSharedRefusalDefersEverything(t *testing.T) {
	t.Parallel()
	wordings := []struct {
		text  string // "" is the local server's own
		names string
		known bool // deploymentText recognises it, so per-item answers defer too
	}{
		{"", "check QSTASH_RETRIES/QSTASH_PLAN:", true},
		{"maxRetries exceeds the limit of your plan", "check QSTASH_RETRIES/QSTASH_PLAN:", true},
		{"retries cannot be more than 3", "check QSTASH_RETRIES/QSTASH_PLAN:", true},
		{"invalid request", "check QSTASH_RETRIES/QSTASH_PLAN (Upstash-Retries), FAILURE_CALLBACK_URL", false},
	}
	for _, mode := range []qstashtest.BatchErrorMode{qstashtest.BatchErrorsWholeRequest, qstashtest.BatchErrorsPerItem} {
		for _, w := range wordings {
			if mode == qstashtest.BatchErrorsPerItem && !w.known {
				continue // an unknown item error stays retryable (contract §6)
			}
			t.Run(fmt.Sprintf("%s/%q", mode, w.text), func(t *testing.T) {
				t.Parallel()
				srv := qstashtest.NewTestServer(t, qstashtest.Options{Plan: qstash.PlanFree, BatchErrors: mode, RetriesRefusal: w.text, HoldDeliveries: true})
				p := newPublisher(t, qstash.PublisherConfig{BaseURL: srv.URL, Token: srv.Token, DestinationBaseURL: "http://127.0.0.1:1",
					Plan: qstash.PlanPayg, Retries: 5})
				res := p.Publish(context.Background(), messages(1, 200, 20))
				for i, r := range res {
					var de *publish.DeferError
					if !errors.As(r.Err, &de) || de.Reason != publish.DeferDeployment || !strings.Contains(r.Err.Error(), w.names) {
						t.Fatalf("message %d: %v (outcome %v): want deferred for the deployment, naming %q", i, r.Err, r.Outcome(), w.names)
					}
				}
				n, byStatus := batchRequests(srv)
				if n > 3 || byStatus[http.StatusOK]+byStatus[http.StatusAccepted] > 0 && mode == qstashtest.BatchErrorsWholeRequest {
					t.Fatalf("%d requests %v: want at most 3 (the call and its two halves)", n, byStatus)
				}
				if n := srv.Pending(); n != 0 {
					t.Fatalf("%d messages accepted", n)
				}
			})
		}
	}
}

// Many bad messages with different refusals: the split stops at its budget of requests
// (splitBudget: 44 for 1,000 messages), the messages it found bad fail permanently, the
// good ones it reached are published, and the rest come back retryable, never permanent.
func TestSplitBudgetBoundsRequests(t *testing.T) {
	t.Parallel()
	srv := qstashtest.NewTestServer(t, qstashtest.Options{Plan: qstash.PlanPayg, BatchErrors: qstashtest.BatchErrorsWholeRequest, HoldDeliveries: true})
	msgs := messages(1, 1000, 50)
	var bad []string
	isBad := map[int64]bool{}
	for i := 0; i < 500; i += 25 { // 20 in the first half only: the second half publishes
		bad = append(bad, msgs[i].ID.String())
		isBad[int64(msgs[i].ID)] = true
	}
	proxy := badItemProxy(t, srv, bad...)
	p := newPublisher(t, qstash.PublisherConfig{BaseURL: proxy.URL, Token: srv.Token, DestinationBaseURL: "http://127.0.0.1:1"})
	res := p.Publish(context.Background(), msgs)
	var published, permanent, retryable int
	for i, r := range res {
		switch r.Outcome() {
		case publish.Published:
			published++
			if isBad[int64(msgs[i].ID)] {
				t.Fatalf("bad message %d published", msgs[i].ID)
			}
		case publish.PermanentFailure:
			permanent++
			if !isBad[int64(msgs[i].ID)] {
				t.Fatalf("good message %d failed permanently: %v", msgs[i].ID, r.Err)
			}
		case publish.Retryable:
			retryable++
			if !strings.Contains(r.Err.Error(), "split requests are used up") {
				t.Fatalf("message %d: %v", msgs[i].ID, r.Err)
			}
		default:
			t.Fatalf("message %d: %v deferred", msgs[i].ID, r.Err)
		}
	}
	n, _ := batchRequests(srv)
	if n > 1+44 || retryable == 0 || published < 500 || permanent == 0 {
		t.Fatalf("%d requests; %d published, %d permanent, %d retryable: want at most 45 requests, the second half published, some bad found, the rest left for the next attempt",
			n, published, permanent, retryable)
	}
}

// An outage of QStash or of the way to it: a 503 for everything, requests that hang past
// the timeout, connections reset, connections refused. Every message of the call is
// deferred as an outage (no attempt spent), and publishing works again once it is over.
func TestOutageDefersEverything(t *testing.T) {
	t.Parallel()
	for _, o := range []qstashtest.Outage{qstashtest.Outage503, qstashtest.OutageHang, qstashtest.OutageReset, "refused"} {
		t.Run(string(o), func(t *testing.T) {
			t.Parallel()
			srv := qstashtest.NewTestServer(t, qstashtest.Options{Plan: qstash.PlanPayg, HoldDeliveries: true})
			base := srv.URL
			if o == "refused" {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				base = "http://" + ln.Addr().String()
				ln.Close()
			} else {
				srv.SetFaults(qstashtest.Faults{Outage: o})
			}
			cfg := qstash.PublisherConfig{BaseURL: base, Token: srv.Token, DestinationBaseURL: "http://127.0.0.1:1", RequestTimeout: 200 * time.Millisecond, MaxBatchItems: 20}
			res := newPublisher(t, cfg).Publish(context.Background(), messages(1, 50, 5))
			for i, r := range res {
				var de *publish.DeferError
				if !errors.As(r.Err, &de) || de.Reason != publish.DeferOutage || !strings.Contains(r.Err.Error(), "not the messages' fault") {
					t.Fatalf("message %d: %v (outcome %v): want deferred for an outage", i, r.Err, r.Outcome())
				}
			}
			if o != "refused" {
				testwait.Eventually(t, 30*time.Second, func() bool { n, _ := batchRequests(srv); return n > 0 }, "a batch request at the server")
			}
			if n, _ := batchRequests(srv); o != "refused" && n != 1 {
				t.Fatalf("%d requests: the rest of the call must not be sent into the outage", n)
			}
			srv.SetFaults(qstashtest.Faults{})
			cfg.BaseURL = srv.URL
			for i, r := range newPublisher(t, cfg).Publish(context.Background(), messages(1, 50, 5)) {
				if r.Err != nil {
					t.Fatalf("message %d after the outage: %v", i, r.Err)
				}
			}
		})
	}
}

// The token is rotated at its source (QSTASH_TOKEN_PARAM) while the relay is warm: the
// first refused request re-reads it, once for every concurrent call, and is sent again;
// every message is published and the DLQ client sharing the Token follows.
func TestRotatedTokenIsReread(t *testing.T) {
	t.Parallel()
	srv := qstashtest.NewTestServer(t, qstashtest.Options{HoldDeliveries: true})
	var source atomic.Value
	source.Store(srv.Token)
	var reads atomic.Int32
	release := make(chan struct{})
	tok := qstash.NewToken(srv.Token, func(context.Context) (string, error) {
		reads.Add(1)
		<-release // every concurrent call is refused before the read ends
		return source.Load().(string), nil
	})
	p := newPublisher(t, qstash.PublisherConfig{BaseURL: srv.URL, Tokens: tok, DestinationBaseURL: "http://127.0.0.1:1"})
	srv.SetToken("rotated")
	source.Store("rotated")

	const calls = 8
	var wg sync.WaitGroup
	errs := make(chan error, calls)
	for c := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, r := range p.Publish(context.Background(), messages(1+100*c, 10, 3)) {
				if r.Err != nil {
					errs <- r.Err
				}
			}
		}()
	}
	testwait.Eventually(t, 30*time.Second, func() bool {
		_, byStatus := batchRequests(srv)
		return byStatus[http.StatusUnauthorized] == calls
	}, "%d requests refused with 401 (the old token)", calls)
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("after the rotation: %v", err)
	}
	if n := reads.Load(); n != 1 || tok.Rereads() != 1 || tok.Value() != "rotated" {
		t.Fatalf("%d reads (%d counted), token %q: want one read shared by the %d calls", n, tok.Rereads(), tok.Value(), calls)
	}
	// Another client of the deployment, through the same Token: no second read.
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v2/dlq", nil)
	resp, err := (&http.Client{Transport: tok.Transport(nil)}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || reads.Load() != 1 {
		t.Fatalf("DLQ list: %d after %d reads", resp.StatusCode, reads.Load())
	}
}

// A token that is simply wrong (the source holds the same one) or a source that cannot be
// read: the refusal stands, deferred for the deployment, and the error says what the
// re-read found.
func TestRefusedTokenAfterReread(t *testing.T) {
	t.Parallel()
	srv := qstashtest.NewTestServer(t, qstashtest.Options{HoldDeliveries: true})
	for name, tc := range map[string]struct {
		read func(context.Context) (string, error)
		says string
	}{
		"same":       {func(context.Context) (string, error) { return "wrong", nil }, "re-read from QSTASH_TOKEN_PARAM was refused too"},
		"unreadable": {func(context.Context) (string, error) { return "", errors.New("ssm: access denied") }, "re-read qstash token: ssm: access denied"},
		"fixed":      {nil, "the token is fixed for this process"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p := newPublisher(t, qstash.PublisherConfig{BaseURL: srv.URL, Tokens: qstash.NewToken("wrong", tc.read), DestinationBaseURL: "http://127.0.0.1:1"})
			for _, r := range p.Publish(context.Background(), messages(1, 3, 3)) {
				var de *publish.DeferError
				if !errors.As(r.Err, &de) || de.Reason != publish.DeferDeployment || !strings.Contains(r.Err.Error(), "check QSTASH_TOKEN") || !strings.Contains(r.Err.Error(), tc.says) {
					t.Fatalf("%v: want deferred for QSTASH_TOKEN, saying %q", r.Err, tc.says)
				}
			}
		})
	}
}
