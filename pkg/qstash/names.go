package qstash

import (
	"crypto/sha256"
	"encoding/hex"
	"net"
	"net/url"
	"strings"
)

// ValidResourceName reports whether s passes QStash's resource-name rule,
// ^[A-Za-z0-9._-]+$, which production applies to Upstash-Flow-Control-Key and to each
// Upstash-Label (the backend's ValidateResourceName, mirrored by the official SDKs:
// github.com/upstash/workflow-js/pull/196). Anything else is answered 400.
func ValidResourceName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !resourceByte(s[i]) {
			return false
		}
	}
	return true
}

func resourceByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
}

// Lengths of the derived names. QStash documents no length limit for keys or labels;
// these keep them short enough to read in the console.
const (
	// readablePrefixLen is how much of the sanitised raw value a derived name keeps.
	readablePrefixLen = 40
	// hashHexLen is the hex digits of SHA-256 kept: 80 bits, so two distinct values
	// collide with probability about n²/2⁸¹ (1e-12 at a billion keys).
	hashHexLen = 20
)

// flowControlKey is the Upstash-Flow-Control-Key for a partition key in deployment name:
// "<name>.<readable>-<hash>", where readable is the key with every byte outside the
// resource-name rule replaced by '_' (at most 40 bytes) and hash is the first 80 bits of
// SHA-256 of the raw key in hex. It always passes ValidResourceName, is the same for the
// same inputs in every process and release, and differs for different keys (the hash is
// of the raw key, so "a:b" and "a/b" differ although both read "a_b"). The name keeps two
// deployments on one account from sharing limits (keys are account-wide). name must be
// a valid deployment name; partitionKey may be anything, including empty.
func flowControlKey(name, partitionKey string) string {
	return name + "." + readableHash(partitionKey)
}

// label is the Upstash-Label for a topic: the topic itself when it already passes the
// resource-name rule (every topic except one with '~'), else "<readable>-<hash>" as for
// flowControlKey. QStash's console, logs and DLQ filter by it.
func label(topic string) string {
	if ValidResourceName(topic) {
		return topic
	}
	return readableHash(topic)
}

func readableHash(raw string) string {
	sum := sha256.Sum256([]byte(raw))
	var b strings.Builder
	n := min(len(raw), readablePrefixLen)
	b.Grow(n + 1 + hashHexLen)
	for i := 0; i < n; i++ {
		if c := raw[i]; resourceByte(c) {
			b.WriteByte(c)
		} else {
			b.WriteByte('_')
		}
	}
	b.WriteByte('-')
	b.WriteString(hex.EncodeToString(sum[:])[:hashHexLen])
	return b.String()
}

// Deployment names (PublisherConfig.Name, OUTBOX_NAME).
const (
	// DefaultName keeps dedup ids and queue names as they were before names existed
	// (outbox-<id>, outbox-<n>).
	DefaultName = "outbox"
	// MaxNameLen is the longest name: the longest CloudFormation stack name, which the
	// template passes as the name.
	MaxNameLen = 128
)

// ValidName reports whether s may be a deployment name: 1-MaxNameLen bytes of
// [A-Za-z0-9_-], the alphabet that is safe in a deduplication id in every region (no ':',
// github.com/superset-sh/superset/pull/3591) and in a queue name.
func ValidName(s string) bool {
	if s == "" || len(s) > MaxNameLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// isLoopbackHost reports whether the URL's host is a loopback name or address.
func isLoopbackHost(u *url.URL) bool {
	host := u.Hostname()
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
