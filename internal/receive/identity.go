package receive

import (
	"errors"
	"fmt"
	"math"
	"net/url"
	"strconv"
	"strings"

	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
)

// Query parameters that carry a message's identity in the destination URL the relay
// publishes to: <PUBLIC_BASE_URL>/events/<topic>?outbox_id=<id>&generation=<n>
// (the publisher's message destination). QStash's signature covers the URL (its sub claim),
// so unlike a forwarded header they cannot be changed by whoever replays a captured delivery.
const (
	QueryOutboxID   = qstash.IdentityIDParam
	QueryGeneration = qstash.IdentityGenerationParam
)

// ErrNoIdentity means the URL carries no outbox_id: a delivery published before the
// identity moved into the URL, or a message some other publisher sent.
var ErrNoIdentity = qstash.ErrNoIdentity

// ErrInvalidIdentity means outbox_id or generation is present but not one positive
// (generation: non-negative) decimal number.
var ErrInvalidIdentity = errors.New("invalid message identity")

// FromURL reads the identity from u's query with the publisher's own parser
// (qstash.ParseIdentity). Both parameters must appear once; outbox_id alone is
// ErrInvalidIdentity, neither is ErrNoIdentity.
func FromURL(u *url.URL) (qstash.Identity, error) {
	id, err := qstash.ParseIdentity(u.String())
	switch {
	case errors.Is(err, qstash.ErrNoIdentity):
		return qstash.Identity{}, ErrNoIdentity
	case err != nil:
		return qstash.Identity{}, fmt.Errorf("%w: %v", ErrInvalidIdentity, err)
	case id.Generation > math.MaxInt32: // outbox.generation is an integer column
		return qstash.Identity{}, fmt.Errorf("%w: generation %d is out of range", ErrInvalidIdentity, id.Generation)
	}
	return id, nil
}

// FromRawURL is FromURL for a URL in text form (the url field of a failure callback).
func FromRawURL(raw string) (qstash.Identity, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return qstash.Identity{}, fmt.Errorf("%w: URL does not parse", ErrInvalidIdentity)
	}
	return FromURL(u)
}

// FromHeaders reads the identity the relay forwarded as headers before it moved into the
// URL (X-Outbox-Id, X-Outbox-Generation; also under Upstash-Forward-, as a failure callback
// reports the publish request). get returns a header's first value by canonical name.
// These headers are not covered by a delivery's signature: only the legacy fallbacks of
// the receivers use this, under their own checks. A missing generation reads as 0.
func FromHeaders(get func(name string) string) (qstash.Identity, error) {
	id, gen := headerValue(get, HeaderOutboxID), headerValue(get, HeaderOutboxGeneration)
	if id == "" {
		return qstash.Identity{}, ErrNoIdentity
	}
	if gen == "" {
		gen = "0"
	}
	return parse(id, gen)
}

// Contradicts reports whether headers (get as for FromHeaders) forward an outbox id or
// generation other than id's. Absent headers contradict nothing.
func Contradicts(id qstash.Identity, get func(name string) string) bool {
	if v := headerValue(get, HeaderOutboxID); v != "" {
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil || outbox.ID(n) != id.OutboxID {
			return true
		}
	}
	if v := headerValue(get, HeaderOutboxGeneration); v != "" {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n != id.Generation {
			return true
		}
	}
	return false
}

func headerValue(get func(string) string, name string) string {
	if v := get(name); v != "" {
		return v
	}
	return get(HeaderForwardPrefix + name)
}

// HeaderMap adapts a header map whose names may be in any case (a failure callback's
// sourceHeader) to the get function FromHeaders and Contradicts take.
func HeaderMap(m map[string][]string) func(string) string {
	return func(name string) string {
		for k, vs := range m {
			if len(vs) > 0 && strings.EqualFold(k, name) {
				return strings.TrimSpace(vs[0])
			}
		}
		return ""
	}
}

func parse(id, gen string) (qstash.Identity, error) {
	n, err := strconv.ParseInt(strings.TrimSpace(id), 10, 64)
	if err != nil || n <= 0 {
		return qstash.Identity{}, fmt.Errorf("%w: outbox id %.40q is not a positive decimal number", ErrInvalidIdentity, id)
	}
	g, err := strconv.ParseInt(strings.TrimSpace(gen), 10, 32)
	if err != nil || g < 0 {
		return qstash.Identity{}, fmt.Errorf("%w: generation %.40q is not a non-negative decimal number", ErrInvalidIdentity, gen)
	}
	return qstash.Identity{OutboxID: outbox.ID(n), Generation: int(g)}, nil
}
