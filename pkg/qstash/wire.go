package qstash

import (
	"slices"
	"unicode/utf8"
	"unsafe"
)

// The /v2/batch request body is written by hand rather than by encoding/json: the relay
// encodes every event it publishes, and a reflected struct with a header map (whose keys
// encoding/json sorts) took 4.7 µs and 3.5 KB per item against 1.3 µs and 32 B here
// (BenchmarkBatchItem, 2026-12-03). appendBatchItem writes the same JSON value in a fixed
// order; TestBatchItemEncoding checks it against encoding/json.

// header is one header of a batch item, in the order it is written.
type header struct{ name, value string }

// forwardPrefix makes an event header a header QStash forwards to the destination.
const forwardPrefix = "Upstash-Forward-"

// appendBatchItem appends one /v2/batch element: destination, the event's own headers
// (forwarded, sorted by name), then the relay's headers in order, the body, and the queue
// if any. An event header that would be forwarded under the name of one of the relay's
// own is not sent: the relay's value wins, as it always has.
func appendBatchItem(b []byte, destination []byte, event map[string]string, own []header, body []byte, queue string) []byte {
	b = append(b, `{"destination":"`...)
	b = appendJSONStringBody(b, bytesAsString(destination))
	b = append(b, '"')
	b = append(b, `,"headers":{`...)
	first := true
	sep := func() {
		if !first {
			b = append(b, ',')
		}
		first = false
	}
	if len(event) > 0 {
		names := make([]string, 0, len(event))
		for k := range event {
			if !slices.ContainsFunc(own, func(h header) bool {
				return len(h.name) == len(forwardPrefix)+len(k) && h.name[:len(forwardPrefix)] == forwardPrefix && h.name[len(forwardPrefix):] == k
			}) {
				names = append(names, k)
			}
		}
		slices.Sort(names)
		for _, k := range names {
			sep()
			b = append(b, '"')
			b = append(b, forwardPrefix...)
			b = appendJSONStringBody(b, k)
			b = append(b, `":`...)
			b = appendJSONString(b, event[k])
		}
	}
	for _, h := range own {
		sep()
		b = appendJSONString(b, h.name)
		b = append(b, ':')
		b = appendJSONString(b, h.value)
	}
	b = append(b, `},"body":`...)
	b = append(b, '"')
	b = appendJSONStringBody(b, bytesAsString(body))
	b = append(b, '"')
	if queue != "" {
		b = append(b, `,"queue":`...)
		b = appendJSONString(b, queue)
	}
	return append(b, '}')
}

// bytesAsString views b as a string without copying it (the payload is a batch's largest
// part): only for a call that reads it and keeps no part of it, while b does not change.
func bytesAsString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// appendJSONString appends s as a JSON string.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	b = appendJSONStringBody(b, s)
	return append(b, '"')
}

const hexDigits = "0123456789abcdef"

// appendJSONStringBody appends s escaped for the inside of a JSON string (RFC 8259 §7):
// quote, backslash and control characters are escaped; invalid UTF-8 becomes U+FFFD, as
// encoding/json does, so the value decodes to the same text either way.
func appendJSONStringBody(b []byte, s string) []byte {
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i++
			start = i
			continue
		}
		i += size
	}
	return append(b, s[start:]...)
}
