// Package funcurl serves an http.Handler from a Lambda Function URL in BUFFERED invoke mode
// (aws-lambda-go's lambdaurl supports RESPONSE_STREAM only). It is the only package under
// pkg/ that imports aws-lambda-go, so every handler stays testable with net/http alone.
//
// The request it builds has URL https://<requestContext.domainName><rawPath>[?rawQueryString],
// Host set to domainName, the body base64-decoded when isBase64Encoded, and the trusted
// origin https://<domainName> stored in its context: the webhook and the failure callback,
// when given no public base URL (the webhook with Config.OriginFromFunctionURL set), rebuild
// the signed URL from it, never from client-supplied Host or X-Forwarded-Host headers. A
// webhook Lambda of your own serves webhook.New's handler through Serve or New.
package funcurl

import (
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/aws/aws-lambda-go/events"

	"github.com/outbox-relay/outbox-relay/v3/internal/configcheck"
	"github.com/outbox-relay/outbox-relay/v3/internal/origin"
	"github.com/outbox-relay/outbox-relay/v3/internal/receive"
)

// DefaultMaxBodyBytes is Lambda's own limit on a synchronous invocation payload (6 MB).
const DefaultMaxBodyBytes = 6 << 20

// Errors of newRequest.
var (
	// errBodyTooLarge: the decoded body would exceed the limit. It is detected from the
	// encoded length, before anything is decoded.
	errBodyTooLarge = errors.New("request body too large")
	// errBadRequest: the event cannot be turned into an HTTP request.
	errBadRequest = errors.New("malformed function url event")
)

// Config tunes New. Zero fields take the defaults.
type Config struct {
	// MaxBodyBytes caps the decoded request body; larger bodies are answered as the
	// receivers answer them, 489 with Upstash-NonRetryable-Error: true (the receivers' body_too_large:
	// every Function URL here is a QStash receiver, a body that does not fit never will, and
	// QStash retries, and bills, any other status), and the handler is not called. Default
	// DefaultMaxBodyBytes. A lower limit saves decoding what the handler would refuse
	// anyway, but the adapter's refusal reaches no metric: the receivers' functions keep
	// the default so that webhook's and the callback's own refusal counts it.
	MaxBodyBytes int64
	// Logger receives adapter errors (malformed events, handler panics). Default
	// slog.Default().
	Logger *slog.Logger
}

// Func is the Lambda handler signature for a Function URL in BUFFERED mode; pass it to
// lambda.Start.
type Func func(ctx context.Context, ev events.LambdaFunctionURLRequest) (events.LambdaFunctionURLResponse, error)

// New returns a Lambda handler serving h. It never returns an error to the runtime (that
// would become a 502 without the handler's status): malformed events get 400, oversized
// bodies 489 (non-retryable), handler panics 500.
func New(h http.Handler, cfg Config) Func {
	cfg.MaxBodyBytes = configcheck.Positive(cfg.MaxBodyBytes, DefaultMaxBodyBytes)
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	return func(ctx context.Context, ev events.LambdaFunctionURLRequest) (resp events.LambdaFunctionURLResponse, err error) {
		log := cfg.Logger.With(slog.String("request_id", ev.RequestContext.RequestID))
		r, err := newRequest(ctx, ev, cfg.MaxBodyBytes)
		switch {
		case errors.Is(err, errBodyTooLarge):
			log.WarnContext(ctx, "function url body too large", slog.Int64("limit_bytes", cfg.MaxBodyBytes),
				slog.Int("status", receive.ReplyTooLarge.Status), slog.String("outcome", receive.ReplyTooLarge.Outcome))
			w := newResponseWriter()
			receive.ReplyTooLarge.Write(w)
			return w.response(), nil
		case err != nil:
			log.WarnContext(ctx, "function url event rejected", slog.Any("error", err))
			return plain(http.StatusBadRequest, `{"error":"bad_request"}`), nil
		}
		defer func() {
			if p := recover(); p != nil {
				log.ErrorContext(ctx, "handler panicked", slog.Any("panic", p))
				resp, err = plain(http.StatusInternalServerError, `{"error":"internal_error"}`), nil
			}
		}()
		w := newResponseWriter()
		h.ServeHTTP(w, r)
		return w.response(), nil
	}
}

// newRequest converts ev into a server-side *http.Request carrying ctx and the trusted
// origin. Bodies whose decoded size exceeds maxBody (> 0) fail with errBodyTooLarge before
// they are decoded; other problems wrap errBadRequest.
func newRequest(ctx context.Context, ev events.LambdaFunctionURLRequest, maxBody int64) (*http.Request, error) {
	rc := ev.RequestContext
	if rc.HTTP.Method == "" {
		return nil, fmt.Errorf("%w: requestContext.http.method is empty", errBadRequest)
	}
	if rc.DomainName == "" || strings.ContainsAny(rc.DomainName, "/@?# ") {
		return nil, fmt.Errorf("%w: requestContext.domainName %q is not a host name", errBadRequest, rc.DomainName)
	}
	target := ev.RawPath
	if target == "" {
		target = "/"
	}
	if ev.RawQueryString != "" {
		target += "?" + ev.RawQueryString
	}
	u, err := url.ParseRequestURI(target)
	if err != nil || !strings.HasPrefix(target, "/") {
		return nil, fmt.Errorf("%w: rawPath %q", errBadRequest, ev.RawPath)
	}
	u.Scheme, u.Host = "https", rc.DomainName

	size := int64(len(ev.Body))
	if ev.IsBase64Encoded {
		size = decodedLen(ev.Body)
	}
	if maxBody > 0 && size > maxBody {
		return nil, errBodyTooLarge
	}
	body := []byte(ev.Body)
	if ev.IsBase64Encoded {
		if body, err = base64.StdEncoding.DecodeString(ev.Body); err != nil {
			return nil, fmt.Errorf("%w: body is not valid base64: %v", errBadRequest, err)
		}
	}

	header := make(http.Header, len(ev.Headers)+1)
	for k, v := range ev.Headers {
		// Function URLs lower-case names and comma-join repeated headers; a joined value
		// cannot be split safely (values may contain commas), so it stays one value.
		header[http.CanonicalHeaderKey(k)] = append(header[http.CanonicalHeaderKey(k)], v)
	}
	header.Del("Host") // r.Host is the trusted domainName
	if len(ev.Cookies) > 0 {
		header.Set("Cookie", strings.Join(ev.Cookies, "; "))
	}

	r := &http.Request{
		Method:        rc.HTTP.Method,
		URL:           u,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        header,
		Body:          http.NoBody,
		ContentLength: int64(len(body)),
		Host:          rc.DomainName,
		RemoteAddr:    rc.HTTP.SourceIP,
		RequestURI:    target,
	}
	if len(body) > 0 {
		r.Body = readCloser{bytes.NewReader(body)}
	}
	return r.WithContext(origin.NewContext(ctx, "https://"+rc.DomainName)), nil
}

// decodedLen is the exact decoded length of padded standard base64 s (an upper bound if
// s is invalid, which decoding then reports).
func decodedLen(s string) int64 {
	n := int64(base64.StdEncoding.DecodedLen(len(s)))
	for i := 0; i < 2 && len(s) > i && s[len(s)-1-i] == '='; i++ {
		n--
	}
	return n
}

type readCloser struct{ *bytes.Reader }

func (readCloser) Close() error { return nil }

// responseWriter buffers a handler's response for a BUFFERED Function URL reply.
type responseWriter struct {
	header http.Header
	status int
	body   bytes.Buffer
}

// newResponseWriter returns an empty responseWriter.
func newResponseWriter() *responseWriter { return &responseWriter{header: make(http.Header)} }

// Header returns the response headers.
func (w *responseWriter) Header() http.Header { return w.header }

// WriteHeader records the status; later calls are ignored, as in net/http.
func (w *responseWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
}

// Write appends to the body, sending 200 if no status was written.
func (w *responseWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.body.Write(p)
}

// Response returns the buffered response. Set-Cookie headers become Cookies (Function URLs
// drop them from headers); repeated headers are comma-joined; a body that is not valid
// UTF-8 is base64-encoded; a missing Content-Type is sniffed as net/http does.
func (w *responseWriter) response() events.LambdaFunctionURLResponse {
	status := w.status
	if status == 0 {
		status = http.StatusOK
	}
	body := w.body.Bytes()
	if len(body) > 0 && w.header.Get("Content-Type") == "" {
		w.header.Set("Content-Type", http.DetectContentType(body))
	}
	resp := events.LambdaFunctionURLResponse{StatusCode: status, Headers: make(map[string]string, len(w.header))}
	for k, vs := range w.header {
		if k == "Set-Cookie" {
			resp.Cookies = append(resp.Cookies, vs...)
			continue
		}
		resp.Headers[k] = strings.Join(vs, ", ")
	}
	if utf8.Valid(body) {
		resp.Body = string(body)
	} else {
		resp.Body = base64.StdEncoding.EncodeToString(body)
		resp.IsBase64Encoded = true
	}
	return resp
}

func plain(status int, body string) events.LambdaFunctionURLResponse {
	return events.LambdaFunctionURLResponse{StatusCode: status, Headers: map[string]string{"Content-Type": "application/json"}, Body: body + "\n"}
}
