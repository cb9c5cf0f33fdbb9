package qstash

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"

	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
)

// Query parameters of a delivery URL that carry the message's identity
// (Publisher.appendMessageDestination). The QStash signature's subject is the whole URL, so
// unlike the forwarded X-Outbox-Id header they cannot be changed by whoever replays a
// captured delivery.
const (
	IdentityIDParam         = "outbox_id"
	IdentityGenerationParam = "generation"
)

// ErrNoIdentity: the URL carries no outbox_id (a delivery published before identities
// went into the URL).
var ErrNoIdentity = errors.New("delivery url carries no outbox identity")

// Identity is an outbox message's identity as its delivery URL states it: the outbox row a
// delivery is about, and which redrive of it.
type Identity struct {
	OutboxID   outbox.ID
	Generation int
}

// MessageID is the dedupe key of every consumer: the outbox id in decimal, the same for
// every retry and every redrive.
func (id Identity) MessageID() string { return strconv.FormatInt(int64(id.OutboxID), 10) }

// ParseIdentity reads outbox_id and generation from a delivery URL (or a failure
// callback's url field). It returns ErrNoIdentity when neither is present, and an error
// when they are malformed, repeated, or only one is present: a signed URL the relay built
// always has both, once, in decimal.
func ParseIdentity(rawURL string) (Identity, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return Identity{}, fmt.Errorf("parse delivery url: %w", err)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return Identity{}, fmt.Errorf("parse delivery url query: %w", err)
	}
	ids, gens := q[IdentityIDParam], q[IdentityGenerationParam]
	if len(ids) == 0 && len(gens) == 0 {
		return Identity{}, ErrNoIdentity
	}
	if len(ids) != 1 || len(gens) != 1 {
		return Identity{}, fmt.Errorf("parse delivery url: want exactly one %s and one %s", IdentityIDParam, IdentityGenerationParam)
	}
	id, err := strconv.ParseInt(ids[0], 10, 64)
	if err != nil || id <= 0 {
		return Identity{}, fmt.Errorf("parse delivery url: %s %q is not a positive integer", IdentityIDParam, ids[0])
	}
	gen, err := strconv.Atoi(gens[0])
	if err != nil || gen < 0 {
		return Identity{}, fmt.Errorf("parse delivery url: %s %q is not a non-negative integer", IdentityGenerationParam, gens[0])
	}
	return Identity{OutboxID: outbox.ID(id), Generation: gen}, nil
}

// Identity is the outbox identity in the failed message's URL (see ParseIdentity). The
// url field is part of the signed callback body, unlike the forwarded headers.
func (f FailureCallback) Identity() (Identity, error) { return ParseIdentity(f.URL) }
