package qstash_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	upstash "github.com/upstash/qstash-go"

	"github.com/outbox-relay/outbox-relay/v3/internal/configcheck/configchecktest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
)

const testURL = "https://hooks.example.com/events/order.created"

var testBody = []byte(`{"order_id":"o-1","amount_cents":1200}`)

func newVerifier(t *testing.T, now time.Time) *qstash.Verifier {
	t.Helper()
	v, err := qstash.NewVerifier(qstash.VerifierConfig{
		CurrentSigningKey: qstash.DevCurrentSigningKey,
		NextSigningKey:    qstash.DevNextSigningKey,
		Tolerance:         5 * time.Second,
		Now:               func() time.Time { return now },
	})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// token signs claims with key and method, for hand-made (and hostile) tokens.
func token(t *testing.T, method jwt.SigningMethod, key any, claims jwt.MapClaims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(method, claims).SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func claims(now time.Time, sub string, body []byte, padded bool) jwt.MapClaims {
	sum := sha256.Sum256(body)
	h := base64.URLEncoding.EncodeToString(sum[:])
	if !padded {
		h = strings.TrimRight(h, "=")
	}
	return jwt.MapClaims{"iss": "Upstash", "sub": sub, "iat": now.Unix(), "exp": now.Add(5 * time.Minute).Unix(), "nbf": 0, "jti": "jwt_x", "body": h}
}

func TestVerifierAccepts(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	v := newVerifier(t, now)
	cur, next := []byte(qstash.DevCurrentSigningKey), []byte(qstash.DevNextSigningKey)
	signed, err := qstash.Sign(qstash.DevCurrentSigningKey, testURL, testBody, now)
	if err != nil {
		t.Fatal(err)
	}
	for name, sig := range map[string]string{
		"Sign":                signed,
		"padded body claim":   token(t, jwt.SigningMethodHS256, cur, claims(now, testURL, testBody, true)),
		"unpadded body claim": token(t, jwt.SigningMethodHS256, cur, claims(now, testURL, testBody, false)),
		"next key":            token(t, jwt.SigningMethodHS256, next, claims(now, testURL, testBody, true)),
		"expired within tolerance": token(t, jwt.SigningMethodHS256, cur,
			claims(now.Add(-5*time.Minute-3*time.Second), testURL, testBody, true)),
	} {
		if err := v.Verify(sig, testURL, testBody); err != nil {
			t.Errorf("%s: Verify = %v, want nil", name, err)
		}
	}
}

func TestVerifierRejects(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	v := newVerifier(t, now)
	cur := []byte(qstash.DevCurrentSigningKey)
	noExp := claims(now, testURL, testBody, true)
	delete(noExp, "exp")
	badIss := claims(now, testURL, testBody, true)
	badIss["iss"] = "Evil"
	tests := []struct {
		name   string
		sig    string
		url    string
		body   []byte
		reason qstash.VerifyReason
	}{
		{"empty key", token(t, jwt.SigningMethodHS256, []byte(""), claims(now, testURL, testBody, true)), testURL, testBody, qstash.ReasonBadSignature},
		{"unknown key", token(t, jwt.SigningMethodHS256, []byte("sig_other"), claims(now, testURL, testBody, true)), testURL, testBody, qstash.ReasonBadSignature},
		{"no exp", token(t, jwt.SigningMethodHS256, cur, noExp), testURL, testBody, qstash.ReasonMalformed},
		{"HS512", token(t, jwt.SigningMethodHS512, cur, claims(now, testURL, testBody, true)), testURL, testBody, qstash.ReasonAlgorithm},
		{"alg none", token(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, claims(now, testURL, testBody, true)), testURL, testBody, qstash.ReasonAlgorithm},
		{"wrong subject", token(t, jwt.SigningMethodHS256, cur, claims(now, "https://evil.example/events/order.created", testBody, true)), testURL, testBody, qstash.ReasonSubject},
		{"subject with trailing slash", token(t, jwt.SigningMethodHS256, cur, claims(now, testURL+"/", testBody, true)), testURL, testBody, qstash.ReasonSubject},
		{"empty url", token(t, jwt.SigningMethodHS256, cur, claims(now, testURL, testBody, true)), "", testBody, qstash.ReasonSubject},
		{"expired beyond tolerance", token(t, jwt.SigningMethodHS256, cur, claims(now.Add(-5*time.Minute-6*time.Second), testURL, testBody, true)), testURL, testBody, qstash.ReasonExpired},
		{"body mismatch", token(t, jwt.SigningMethodHS256, cur, claims(now, testURL, testBody, true)), testURL, []byte(`{"order_id":"o-2"}`), qstash.ReasonBodyMismatch},
		{"wrong issuer", token(t, jwt.SigningMethodHS256, cur, badIss), testURL, testBody, qstash.ReasonIssuer},
		{"garbage", "not.a.jwt", testURL, testBody, qstash.ReasonMalformed},
		{"missing", "", testURL, testBody, qstash.ReasonMissing},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := v.Verify(tt.sig, tt.url, tt.body)
			var ve *qstash.VerifyError
			if !errors.As(err, &ve) || !errors.Is(err, qstash.ErrBadSignature) {
				t.Fatalf("Verify = %v, want a *VerifyError wrapping ErrBadSignature", err)
			}
			if ve.Reason != tt.reason {
				t.Fatalf("reason = %q, want %q (%v)", ve.Reason, tt.reason, err)
			}
		})
	}
}

func TestNewVerifierRefusesEmptyKeys(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cfg    qstash.VerifierConfig
		fields []string
	}{
		{qstash.VerifierConfig{NextSigningKey: qstash.DevNextSigningKey}, []string{"CurrentSigningKey"}},
		{qstash.VerifierConfig{CurrentSigningKey: qstash.DevCurrentSigningKey}, []string{"NextSigningKey"}},
		{qstash.VerifierConfig{CurrentSigningKey: qstash.DevCurrentSigningKey, NextSigningKey: qstash.DevNextSigningKey, Tolerance: -time.Second},
			[]string{"Tolerance"}},
		{qstash.VerifierConfig{Tolerance: -time.Second}, []string{"CurrentSigningKey", "NextSigningKey", "Tolerance"}},
	} {
		v, err := qstash.NewVerifier(c.cfg)
		if v != nil {
			t.Errorf("%v: NewVerifier returned a verifier", c.fields)
		}
		configchecktest.RequireFields(t, err, "qstash verifier", c.fields...)
	}
}

// TestSDKReceiverAcceptsWhatVerifierRejects shows the hardening matters: qstash-go v1.0.0's
// Receiver accepts each of these tokens; the Verifier rejects them (TestVerifierRejects).
func TestSDKReceiverAcceptsWhatVerifierRejects(t *testing.T) {
	t.Parallel()
	now := time.Now()
	noExp := claims(now, testURL, testBody, true)
	delete(noExp, "exp")
	v, err := qstash.NewVerifier(qstash.VerifierConfig{CurrentSigningKey: qstash.DevCurrentSigningKey, NextSigningKey: qstash.DevNextSigningKey})
	if err != nil {
		t.Fatal(err)
	}
	cur := []byte(qstash.DevCurrentSigningKey)
	for name, tc := range map[string]struct {
		receiver *upstash.Receiver
		sig      string
	}{
		// A deployment that left QSTASH_NEXT_SIGNING_KEY unset: anyone can forge.
		"empty key": {upstash.NewReceiver(qstash.DevCurrentSigningKey, ""), token(t, jwt.SigningMethodHS256, []byte(""), claims(now, testURL, testBody, true))},
		"no exp":    {upstash.NewReceiver(qstash.DevCurrentSigningKey, qstash.DevNextSigningKey), token(t, jwt.SigningMethodHS256, cur, noExp)},
		"HS512":     {upstash.NewReceiver(qstash.DevCurrentSigningKey, qstash.DevNextSigningKey), token(t, jwt.SigningMethodHS512, cur, claims(now, testURL, testBody, true))},
	} {
		if err := tc.receiver.Verify(upstash.VerifyOptions{Signature: tc.sig, Url: testURL, Body: string(testBody)}); err != nil {
			t.Errorf("%s: SDK Receiver rejected it (%v); the premise of the hardening changed", name, err)
		}
		if err := v.Verify(tc.sig, testURL, testBody); err == nil {
			t.Errorf("%s: Verifier accepted it", name)
		}
	}
}

func TestSignIsVerified(t *testing.T) {
	t.Parallel()
	if _, err := qstash.Sign("", testURL, testBody, time.Now()); err == nil {
		t.Fatal("Sign with an empty key succeeded")
	}
	now := time.Now()
	sig, err := qstash.Sign(qstash.DevNextSigningKey, testURL, testBody, now)
	if err != nil {
		t.Fatal(err)
	}
	tok, _, err := jwt.NewParser().ParseUnverified(sig, jwt.MapClaims{})
	if err != nil {
		t.Fatal(err)
	}
	c := tok.Claims.(jwt.MapClaims)
	if c["iss"] != "Upstash" || c["sub"] != testURL || c["nbf"].(float64) != 0 ||
		int64(c["exp"].(float64))-int64(c["iat"].(float64)) != 300 || !strings.HasPrefix(c["jti"].(string), "jwt_") ||
		c["body"] != qstash.BodyHash(testBody) || !strings.HasSuffix(c["body"].(string), "=") {
		t.Fatalf("claims %v are not QStash's", c)
	}
	if err := upstash.NewReceiver(qstash.DevCurrentSigningKey, qstash.DevNextSigningKey).Verify(upstash.VerifyOptions{Signature: sig, Url: testURL, Body: string(testBody)}); err != nil {
		t.Fatalf("SDK Receiver rejects Sign's token: %v", err)
	}
}

// rolledKeys is Upstash's key roll: the old next key becomes current and a new next key
// appears; a second roll leaves neither key this process started with.
const rolledNext, twiceRolledNext = "sig_rolled_once_next_key_000001", "sig_rolled_twice_next_key_00002"

type keyStore struct {
	mu         sync.Mutex
	cur, next  string
	err        error
	reads      atomic.Int32
	readsBlock chan struct{} // if set, a read waits for it
}

func (k *keyStore) read(ctx context.Context) (string, string, error) {
	k.reads.Add(1)
	if k.readsBlock != nil {
		<-k.readsBlock
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.cur, k.next, k.err
}

func rereadingVerifier(t *testing.T, clock *atomic.Int64, store *keyStore) *qstash.Verifier {
	t.Helper()
	v, err := qstash.NewVerifier(qstash.VerifierConfig{
		CurrentSigningKey: qstash.DevCurrentSigningKey, NextSigningKey: qstash.DevNextSigningKey,
		Now:    func() time.Time { return time.Unix(clock.Load(), 0) },
		Reread: store.read,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// After two key rolls that the process did not see (no cold start), a delivery signed with
// the new current key verifies: the keys are re-read once, then used for every request.
// Forged signatures re-read at most once per RereadInterval.
func TestVerifierRereadsRolledKeys(t *testing.T) {
	t.Parallel()
	var clock atomic.Int64
	clock.Store(1_800_000_000)
	store := &keyStore{cur: rolledNext, next: twiceRolledNext}
	v := rereadingVerifier(t, &clock, store)
	now := time.Unix(clock.Load(), 0)
	sign := func(key string) string {
		s, err := qstash.Sign(key, testURL, testBody, now)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	if err := v.Verify(sign(rolledNext), testURL, testBody); err != nil {
		t.Fatalf("signed with the rolled current key: %v", err)
	}
	if err := v.Verify(sign(twiceRolledNext), testURL, testBody); err != nil || store.reads.Load() != 1 {
		t.Fatalf("signed with the rolled next key: %v after %d re-reads, want nil after 1", err, store.reads.Load())
	}
	if err := v.Verify(sign(qstash.DevCurrentSigningKey), testURL, testBody); !errors.Is(err, qstash.ErrBadSignature) {
		t.Fatalf("signed with a key rolled away: %v, want refused", err)
	}
	for range 5 {
		if err := v.Verify(sign("sig_forged"), testURL, testBody); !errors.Is(err, qstash.ErrBadSignature) {
			t.Fatalf("forged: %v", err)
		}
	}
	if n := store.reads.Load(); n != 1 {
		t.Fatalf("%d re-reads within a minute of the roll's, want 1", n)
	}
	clock.Add(int64(qstash.RereadInterval / time.Second))
	v.Verify(sign("sig_forged"), testURL, testBody)
	if n := store.reads.Load(); n != 2 {
		t.Fatalf("%d re-reads a minute later, want 2", n)
	}
}

// Requests failing at once share one re-read; a failed or empty re-read keeps the old keys,
// says why in the refusal, and is tried again after seconds, not a whole RereadInterval.
func TestVerifierRereadIsSharedAndSafe(t *testing.T) {
	t.Parallel()
	var clock atomic.Int64
	clock.Store(1_800_000_000)
	store := &keyStore{cur: rolledNext, next: twiceRolledNext, readsBlock: make(chan struct{})}
	v := rereadingVerifier(t, &clock, store)
	sig, err := qstash.Sign(rolledNext, testURL, testBody, time.Unix(clock.Load(), 0))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Go(func() { errs <- v.Verify(sig, testURL, testBody) })
	}
	time.Sleep(20 * time.Millisecond) // let them pile up behind the blocked read
	close(store.readsBlock)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("a concurrent request: %v", err)
		}
	}
	if n := store.reads.Load(); n != 1 {
		t.Fatalf("%d re-reads for 20 concurrent requests, want 1", n)
	}

	for name, bad := range map[string]*keyStore{
		"read fails": {err: errors.New("ssm: AccessDenied")},
		"empty key":  {cur: rolledNext},
	} {
		var c atomic.Int64
		c.Store(1_800_000_000)
		v := rereadingVerifier(t, &c, bad)
		err := v.Verify(sig, testURL, testBody)
		var ve *qstash.VerifyError
		if !errors.As(err, &ve) || ve.Reason != qstash.ReasonBadSignature || !strings.Contains(ve.Detail, "signing keys re-read") {
			t.Errorf("%s: %v, want bad_signature naming the re-read", name, err)
		}
		s, _ := qstash.Sign(qstash.DevCurrentSigningKey, testURL, testBody, time.Unix(c.Load(), 0))
		if err := v.Verify(s, testURL, testBody); err != nil {
			t.Errorf("%s: the old keys stopped working: %v", name, err)
		}
		bad.mu.Lock()
		bad.cur, bad.next, bad.err = rolledNext, twiceRolledNext, nil
		bad.mu.Unlock()
		c.Add(11)
		if err := v.Verify(sig, testURL, testBody); err != nil || bad.reads.Load() != 2 {
			t.Errorf("%s: 11 s after the failed re-read: %v after %d reads, want the new keys read", name, err, bad.reads.Load())
		}
	}
}
