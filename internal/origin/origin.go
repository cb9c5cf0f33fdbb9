// Package origin carries the trusted public origin of a request (scheme and host, e.g.
// https://abc.lambda-url.eu-west-1.on.aws) in its context. Only a transport adapter that
// knows the origin from a trusted source (the Lambda Function URL event) sets it; handlers
// that verify QStash signatures read it to rebuild the URL QStash signed, instead of
// trusting the client's Host or X-Forwarded-Host headers.
package origin

import "context"

type key struct{}

// NewContext returns ctx carrying origin, which must be scheme://host without a trailing
// slash or path.
func NewContext(ctx context.Context, origin string) context.Context {
	return context.WithValue(ctx, key{}, origin)
}

// FromContext returns the trusted origin stored by NewContext, and whether there is one.
func FromContext(ctx context.Context) (string, bool) {
	o, ok := ctx.Value(key{}).(string)
	return o, ok && o != ""
}
