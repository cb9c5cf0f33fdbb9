package qstashtest

import (
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
)

// Forge returns a token shaped like QStash's Upstash-Signature for a delivery of body to
// url at at, but signed with any method and key: the tokens an attacker can build (another
// HMAC, alg none, an empty or a wrong key), for tests that a verifier refuses them. It
// panics when key does not suit method, a mistake in the test.
func Forge(method jwt.SigningMethod, key any, url string, body []byte, at time.Time) string {
	claims := jwt.MapClaims{"iss": "Upstash", "sub": url, "iat": at.Unix(), "nbf": at.Unix(),
		"exp": at.Add(qstash.SignatureLifetime).Unix(), "jti": "jwt_forged", "body": qstash.BodyHash(body)}
	s, err := jwt.NewWithClaims(method, claims).SignedString(key)
	if err != nil {
		panic("qstashtest: forge token: " + err.Error())
	}
	return s
}
