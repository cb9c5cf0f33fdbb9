package qstash

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
)

// Token is the QStash token of a deployment's clients, read again from its source when
// QStash refuses it. A token rotated at its source (the SSM parameter QSTASH_TOKEN_PARAM
// names) would otherwise be refused by a warm relay until its environment is recycled,
// while the relay's pause after each refusal doubles up to a day. Every client of one
// deployment should share one Token, so one re-read serves them all: the Publisher's
// batch, queue and DLQ calls (Publisher.DLQ) go through one client already; another client
// shares it through Transport.
//
// A Token is safe for concurrent use. The zero value is not: use NewToken.
type Token struct {
	reread func(ctx context.Context) (string, error)

	mu       sync.Mutex
	value    string
	gen      uint64        // counts successful re-reads
	inflight chan struct{} // closed when the re-read in flight ends
	lastErr  error         // that re-read's error
}

// NewToken returns a Token holding value. reread, when not nil, reads the token again
// from its source (an SSM parameter or a secret, as the Lambdas do); nil means the token is fixed.
func NewToken(value string, reread func(ctx context.Context) (string, error)) *Token {
	return &Token{value: strings.TrimSpace(value), reread: reread}
}

// get returns the current token.
func (t *Token) get() string {
	v, _ := t.current()
	return v
}

func (t *Token) current() (string, uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.value, t.gen
}

// refresh re-reads the token after QStash refused the one of generation seen, unless a
// re-read finished since (the caller then uses its result), and waits for a re-read in
// flight rather than starting a second one. It returns the token to use now.
func (t *Token) refresh(ctx context.Context, seen uint64) (string, error) {
	if t.reread == nil {
		return t.get(), errTokenFixed
	}
	t.mu.Lock()
	if t.gen > seen {
		defer t.mu.Unlock()
		return t.value, nil
	}
	if ch := t.inflight; ch != nil {
		t.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return "", ctx.Err()
		}
		t.mu.Lock()
		defer t.mu.Unlock()
		return t.value, t.lastErr
	}
	ch := make(chan struct{})
	t.inflight = ch
	t.mu.Unlock()

	// The read outlives a caller that gives up: the others wait for it.
	v, err := t.reread(context.WithoutCancel(ctx))
	v = strings.TrimSpace(v)
	if err == nil && v == "" {
		err = errors.New("the token's source is empty")
	}

	t.mu.Lock()
	defer t.mu.Unlock()
	if err == nil {
		t.value = v
		t.gen++
	} else {
		err = fmt.Errorf("re-read qstash token: %w", err)
	}
	t.lastErr = err
	t.inflight = nil
	close(ch)
	return t.value, err
}

var errTokenFixed = errors.New("the token has no source to re-read")

// status describes the re-reads for the error of a refused token.
func (t *Token) status() string {
	if t.reread == nil {
		return "the token is fixed for this process (set QSTASH_TOKEN_PARAM for one re-read on refusal)"
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.lastErr != nil {
		return t.lastErr.Error()
	}
	return "the token re-read from QSTASH_TOKEN_PARAM was refused too"
}

// Transport returns a RoundTripper over base (http.DefaultTransport when nil) that sends
// every request with the current token as its bearer (replacing any Authorization header
// the caller set) and, when QStash answers 401 or 403, re-reads the token (once for all
// concurrent callers) and, if it changed, sends the request once more with it. A request
// whose body cannot be had again (no GetBody) is not resent.
func (t *Token) Transport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return &tokenTransport{tok: t, base: base}
}

type tokenTransport struct {
	tok  *Token
	base http.RoundTripper
}

func (tt *tokenTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	token, gen := tt.tok.current()
	resp, err := tt.base.RoundTrip(withToken(req, token, req.Body))
	if err != nil || (resp.StatusCode != http.StatusUnauthorized && resp.StatusCode != http.StatusForbidden) {
		return resp, err
	}
	if req.Body != nil && req.Body != http.NoBody && req.GetBody == nil {
		return resp, nil
	}
	fresh, rerr := tt.tok.refresh(req.Context(), gen)
	if rerr != nil || fresh == token {
		return resp, nil // the refusal stands; the caller classifies it
	}
	body := req.Body
	if req.GetBody != nil {
		if body, rerr = req.GetBody(); rerr != nil {
			return resp, nil
		}
	}
	// The refused answer is small ({"error"}); it is read out so the connection is reused.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
	resp.Body.Close()
	return tt.base.RoundTrip(withToken(req, fresh, body))
}

// withToken is a shallow copy of req (a RoundTripper must not change its request) with
// token as its bearer and body as its body.
func withToken(req *http.Request, token string, body io.ReadCloser) *http.Request {
	r := req.Clone(req.Context())
	r.Body = body
	r.Header.Set("Authorization", "Bearer "+token)
	return r
}
