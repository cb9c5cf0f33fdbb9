package qstash

import (
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/outbox-relay/outbox-relay/v3/internal/configcheck"
)

// Dev server credentials, published by Upstash for its local QStash server. The project's
// own local server uses the same values, so code cannot tell the two apart.
const (
	DevToken             = "eyJVc2VySUQiOiJkZWZhdWx0VXNlciIsIlBhc3N3b3JkIjoiZGVmYXVsdFBhc3N3b3JkIn0="
	DevCurrentSigningKey = "sig_7kYjw48mhY7kAjqNGcy6cr29RJ6r"
	DevNextSigningKey    = "sig_5ZB6DVzB1wjE8S6rZ7eenA8Pdnhs"
)

// SignatureLifetime is how long a QStash signature is valid (exp = iat + 5 minutes).
const SignatureLifetime = 5 * time.Minute

// BodyHash is base64url(sha256(body)) with '=' padding, as QStash writes the body claim.
func BodyHash(body []byte) string {
	sum := sha256.Sum256(body)
	return base64.URLEncoding.EncodeToString(sum[:])
}

// Sign returns an Upstash-Signature JWT for a delivery of body to url, issued at now and
// signed with key, exactly as QStash signs: HS256 over the key's bytes, iss "Upstash",
// sub url, exp iat+300, nbf 0, a random jti and the padded body hash.
func Sign(key, url string, body []byte, now time.Time) (string, error) {
	if key == "" {
		return "", errors.New("sign qstash delivery: empty signing key")
	}
	jti := make([]byte, 16)
	if _, err := rand.Read(jti); err != nil {
		return "", fmt.Errorf("sign qstash delivery: %w", err)
	}
	claims := jwt.MapClaims{
		"iss":  "Upstash",
		"sub":  url,
		"iat":  now.Unix(),
		"exp":  now.Add(SignatureLifetime).Unix(),
		"nbf":  0,
		"jti":  "jwt_" + base64.RawURLEncoding.EncodeToString(jti),
		"body": BodyHash(body),
	}
	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString([]byte(key))
	if err != nil {
		return "", fmt.Errorf("sign qstash delivery: %w", err)
	}
	return tok, nil
}

// ErrBadSignature is wrapped by every verification failure; a *VerifyError says why.
var ErrBadSignature = errors.New("invalid qstash signature")

// VerifyReason says why a signature was rejected. It is for logs, never for responses.
type VerifyReason string

const (
	// ReasonMissing: the request has no Upstash-Signature header.
	ReasonMissing VerifyReason = "missing"
	// ReasonMalformed: the header is not a well-formed JWT carrying the claims QStash sets.
	ReasonMalformed VerifyReason = "malformed"
	// ReasonBadSignature: neither signing key produced the JWT's signature.
	ReasonBadSignature VerifyReason = "bad_signature"
	// ReasonAlgorithm: the JWT names an algorithm other than HS256.
	ReasonAlgorithm VerifyReason = "algorithm"
	// ReasonExpired: the JWT's exp has passed (beyond the allowed clock skew).
	ReasonExpired VerifyReason = "expired"
	// ReasonNotYetValid: the JWT's nbf is in the future (beyond the allowed clock skew).
	ReasonNotYetValid VerifyReason = "not_yet_valid"
	// ReasonIssuer: the JWT's iss is not "Upstash".
	ReasonIssuer VerifyReason = "issuer"
	// ReasonSubject: the JWT's sub is not the URL the request was sent to.
	ReasonSubject VerifyReason = "wrong_subject"
	// ReasonBodyMismatch: the JWT's body hash is not the SHA-256 of the request body.
	ReasonBodyMismatch VerifyReason = "body_mismatch"
)

// VerifyError is a rejected signature and the reason.
type VerifyError struct {
	// Reason classifies the rejection, for logs and metrics.
	Reason VerifyReason
	// Detail adds what was expected or found; it may be empty.
	Detail string
}

// Error reads "invalid qstash signature: <reason>[: <detail>]".
func (e *VerifyError) Error() string {
	if e.Detail == "" {
		return fmt.Sprintf("%s: %s", ErrBadSignature, e.Reason)
	}
	return fmt.Sprintf("%s: %s: %s", ErrBadSignature, e.Reason, e.Detail)
}

// Unwrap returns ErrBadSignature, so every rejection matches errors.Is(err, ErrBadSignature).
func (e *VerifyError) Unwrap() error { return ErrBadSignature }

// VerifierConfig configures NewVerifier.
type VerifierConfig struct {
	// CurrentSigningKey and NextSigningKey are QSTASH_CURRENT_SIGNING_KEY and
	// QSTASH_NEXT_SIGNING_KEY. Both are required: with an empty key, a token HMAC-signed
	// with the empty string would verify (the qstash-go v1.0.0 Receiver accepts it).
	CurrentSigningKey string
	NextSigningKey    string
	// Tolerance is the allowed clock skew for exp and nbf. Default DefaultTolerance.
	Tolerance time.Duration
	// Now returns the current time (tests). Default time.Now.
	Now func() time.Time
	// Reread, if set, reads both keys again where they are kept (SSM), for a signature
	// that matches neither key: Upstash rolled its keys and this process has not seen it.
	// At most once per RereadInterval, one call for every request waiting on it; keys that
	// differ replace the old ones and the signature is checked once more.
	Reread func(ctx context.Context) (current, next string, err error)
	// Logger says when the keys were re-read and whether they changed or the read failed.
	// Default slog.Default().
	Logger *slog.Logger
}

// RereadInterval is the shortest time between two re-reads of the signing keys, so that
// forged signatures cost at most one read of the keys a minute.
const RereadInterval = time.Minute

// rereadTimeout bounds one re-read; Verify has no context of its own to take it from.
// rereadRetry is the wait after a failed re-read (throttling, a timeout): valid deliveries
// signed with new keys should not wait a whole RereadInterval for one transient error.
const (
	rereadTimeout = 5 * time.Second
	rereadRetry   = 10 * time.Second
)

// DefaultTolerance is the clock skew Verify allows by default.
const DefaultTolerance = 30 * time.Second

// Verifier checks Upstash-Signature headers. It is stricter than qstash-go v1.0.0's
// Receiver, which accepts empty-key tokens, tokens without exp, and HS384/HS512.
type Verifier struct {
	keys      atomic.Pointer[[2][]byte]
	tolerance time.Duration
	now       func() time.Time
	reread    func(ctx context.Context) (current, next string, err error)
	log       *slog.Logger

	mu         sync.Mutex // one re-read at a time
	lastReread time.Time
}

// NewVerifier returns a Verifier, or an error naming each invalid field (each a
// *publish.ConfigError).
func NewVerifier(cfg VerifierConfig) (*Verifier, error) {
	bad := configcheck.For("qstash verifier")
	if cfg.CurrentSigningKey == "" {
		bad.Bad("CurrentSigningKey", "is empty; it must be QStash's current signing key")
	}
	if cfg.NextSigningKey == "" {
		bad.Bad("NextSigningKey", "is empty; it must be QStash's next signing key (an empty key would accept forged tokens)")
	}
	if cfg.Tolerance < 0 {
		bad.Bad("Tolerance", "%v is negative (0 means DefaultTolerance)", cfg.Tolerance)
	}
	if err := bad.Err(); err != nil {
		return nil, err
	}
	if cfg.Tolerance == 0 {
		cfg.Tolerance = DefaultTolerance
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	v := &Verifier{tolerance: cfg.Tolerance, now: cfg.Now, reread: cfg.Reread, log: cmp.Or(cfg.Logger, slog.Default())}
	v.keys.Store(&[2][]byte{[]byte(cfg.CurrentSigningKey), []byte(cfg.NextSigningKey)})
	return v, nil
}

type deliveryClaims struct {
	Body string `json:"body"`
	jwt.RegisteredClaims
}

// Verify checks signature against the exact public url the message was sent to and the raw
// body bytes. It tries the current key, then the next one (key rotation). A nil error means
// the delivery is authentic; otherwise the error is a *VerifyError wrapping ErrBadSignature.
// A signature that matches neither key re-reads them first when Reread is set.
func (v *Verifier) Verify(signature, url string, body []byte) error {
	keys := v.keys.Load()
	err := v.verify(keys, signature, url, body)
	var ve *VerifyError
	if v.reread == nil || !errors.As(err, &ve) || ve.Reason != ReasonBadSignature {
		return err
	}
	fresh, rerr := v.rereadKeys(keys)
	if fresh != keys {
		return v.verify(fresh, signature, url, body)
	}
	if rerr != nil {
		ve.Detail = rerr.Error() // a bad signature has no detail of its own
	}
	return err
}

// rereadKeys returns the keys to check against after used failed: those another request
// re-read meanwhile, the re-read ones if they differ, or used itself (and why, if the
// re-read failed).
func (v *Verifier) rereadKeys(used *[2][]byte) (*[2][]byte, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if cur := v.keys.Load(); cur != used {
		return cur, nil
	}
	now := v.now()
	if !v.lastReread.IsZero() && now.Sub(v.lastReread) < RereadInterval {
		return used, nil
	}
	v.lastReread = now
	ctx, cancel := context.WithTimeout(context.Background(), rereadTimeout)
	defer cancel()
	current, next, err := v.reread(ctx)
	switch {
	case err == nil && (current == "" || next == ""):
		err = errors.New("a key is empty; keeping the old ones")
		fallthrough
	case err != nil:
		v.lastReread = now.Add(rereadRetry - RereadInterval)
		v.log.Warn("qstash signing keys re-read failed", slog.Any("error", err))
		return used, fmt.Errorf("signing keys re-read: %w", err)
	case current == string(used[0]) && next == string(used[1]):
		v.log.Info("qstash signing keys re-read: unchanged")
		return used, nil
	}
	v.log.Info("qstash signing keys re-read: replaced")
	fresh := &[2][]byte{[]byte(current), []byte(next)}
	v.keys.Store(fresh)
	return fresh, nil
}

func (v *Verifier) verify(keys *[2][]byte, signature, url string, body []byte) error {
	if signature == "" {
		return &VerifyError{Reason: ReasonMissing}
	}
	// golang-jwt reports a disallowed alg as a bad signature; name it instead, so an
	// alg-confusion attempt shows up as such in the logs.
	if tok, _, err := jwt.NewParser().ParseUnverified(signature, &deliveryClaims{}); err != nil {
		return &VerifyError{Reason: ReasonMalformed}
	} else if tok.Method.Alg() != jwt.SigningMethodHS256.Alg() {
		return &VerifyError{Reason: ReasonAlgorithm, Detail: "only HS256 is accepted, got " + tok.Method.Alg()}
	}
	var lastErr error
	for _, key := range keys {
		claims, err := v.parse(signature, key)
		if err == nil {
			return v.checkClaims(claims, url, body)
		}
		lastErr = err
		var ve *VerifyError
		// Only a bad MAC is worth retrying with the other key; a malformed or expired token
		// is just as wrong under either key.
		if !errors.As(err, &ve) || ve.Reason != ReasonBadSignature {
			return err
		}
	}
	return lastErr
}

func (v *Verifier) parse(signature string, key []byte) (*deliveryClaims, error) {
	claims := &deliveryClaims{}
	_, err := jwt.ParseWithClaims(signature, claims, func(t *jwt.Token) (any, error) {
		return key, nil
	},
		jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}),
		jwt.WithExpirationRequired(),
		jwt.WithIssuer("Upstash"),
		jwt.WithLeeway(v.tolerance),
		jwt.WithTimeFunc(v.now),
	)
	if err == nil {
		return claims, nil
	}
	switch {
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return nil, &VerifyError{Reason: ReasonBadSignature}
	case errors.Is(err, jwt.ErrTokenUnverifiable):
		return nil, &VerifyError{Reason: ReasonAlgorithm, Detail: "only HS256 is accepted"}
	case errors.Is(err, jwt.ErrTokenExpired):
		return nil, &VerifyError{Reason: ReasonExpired}
	case errors.Is(err, jwt.ErrTokenNotValidYet), errors.Is(err, jwt.ErrTokenUsedBeforeIssued):
		return nil, &VerifyError{Reason: ReasonNotYetValid}
	case errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
		return nil, &VerifyError{Reason: ReasonMalformed, Detail: "exp claim missing"}
	case errors.Is(err, jwt.ErrTokenInvalidIssuer):
		return nil, &VerifyError{Reason: ReasonIssuer}
	default:
		return nil, &VerifyError{Reason: ReasonMalformed}
	}
}

func (v *Verifier) checkClaims(c *deliveryClaims, url string, body []byte) error {
	if url == "" || c.Subject != url {
		return &VerifyError{Reason: ReasonSubject}
	}
	want := strings.TrimRight(BodyHash(body), "=")
	got := strings.TrimRight(c.Body, "=")
	if !hmac.Equal([]byte(want), []byte(got)) {
		return &VerifyError{Reason: ReasonBodyMismatch}
	}
	return nil
}
