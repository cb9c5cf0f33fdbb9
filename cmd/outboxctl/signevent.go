package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
)

// runSignEvent re-signs a sample Lambda Function URL event: it sets the upstash-signature
// header to a fresh QStash JWT for the event's body and the URL the receiver rebuilds
// (https://<requestContext.domainName><rawPath>[?<rawQueryString>], or -url), signed now
// with the local key, and writes the event to stdout. Every other field is kept.
func runSignEvent(_ context.Context, e env, args []string) error {
	fs := newFlagSet(e, "sign-event").withUsage("usage: outboxctl sign-event --in events/webhook.json [--key current|next] [--url URL] > signed.json")
	in := fs.String("in", "", "Function URL event file (JSON); - reads stdin (required)")
	key := fs.String("key", "current", "signing key: current or next (QSTASH_CURRENT_SIGNING_KEY / QSTASH_NEXT_SIGNING_KEY, else the dev keys)")
	signURL := fs.String("url", "", "URL to sign instead of the one rebuilt from the event (set when the receiver has PUBLIC_BASE_URL / FAILURE_CALLBACK_URL)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *in == "" {
		return fs.fail(errors.New("--in is required"))
	}
	var signingKey string
	switch *key {
	case "current":
		signingKey = signingKeyOr(e.getenv("QSTASH_CURRENT_SIGNING_KEY"), qstash.DevCurrentSigningKey)
	case "next":
		signingKey = signingKeyOr(e.getenv("QSTASH_NEXT_SIGNING_KEY"), qstash.DevNextSigningKey)
	default:
		return usageErr(fmt.Errorf("--key %q must be current or next", *key))
	}
	var raw []byte
	var err error
	if *in == "-" {
		raw, err = io.ReadAll(os.Stdin)
	} else {
		raw, err = os.ReadFile(*in)
	}
	if err != nil {
		return fmt.Errorf("read event: %w", err)
	}
	out, err := signFunctionURLEvent(raw, signingKey, *signURL, time.Now())
	if err != nil {
		return fmt.Errorf("sign %s: %w", *in, err)
	}
	_, err = e.stdout.Write(out)
	return err
}

// signFunctionURLEvent returns event with a fresh upstash-signature header. url "" means
// the URL a receiver without a configured public URL verifies against.
func signFunctionURLEvent(event []byte, key, url string, now time.Time) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(event))
	dec.UseNumber() // keep numbers (timeEpoch) exactly as written
	var ev map[string]any
	if err := dec.Decode(&ev); err != nil {
		return nil, fmt.Errorf("decode Function URL event: %w", err)
	}
	if v, _ := ev["version"].(string); v != "2.0" {
		return nil, fmt.Errorf(`not a Function URL event: version is %v, want "2.0"`, ev["version"])
	}
	body, _ := ev["body"].(string)
	payload := []byte(body)
	if b64, _ := ev["isBase64Encoded"].(bool); b64 {
		var err error
		if payload, err = base64.StdEncoding.DecodeString(body); err != nil {
			return nil, fmt.Errorf("decode base64 body: %w", err)
		}
	}
	if url == "" {
		rc, _ := ev["requestContext"].(map[string]any)
		domain, _ := rc["domainName"].(string)
		path, _ := ev["rawPath"].(string)
		if domain == "" || !strings.HasPrefix(path, "/") {
			return nil, errors.New("event has no requestContext.domainName or rawPath to rebuild the URL from; pass -url")
		}
		url = "https://" + domain + path
		if q, _ := ev["rawQueryString"].(string); q != "" {
			url += "?" + q
		}
	}
	sig, err := qstash.Sign(key, url, payload, now)
	if err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	headers, _ := ev["headers"].(map[string]any)
	if headers == nil {
		headers = map[string]any{}
	}
	for k := range headers {
		if strings.EqualFold(k, "upstash-signature") {
			delete(headers, k)
		}
	}
	headers["upstash-signature"] = sig // Function URLs deliver header names lowercased
	ev["headers"] = headers
	out, err := json.MarshalIndent(ev, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

func signingKeyOr(v, def string) string {
	if v == "" {
		return def
	}
	return v
}
