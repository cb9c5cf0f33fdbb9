// Package lambdatest runs a built Lambda bootstrap under the AWS Lambda Runtime Interface
// Emulator for a test (package rie: the emulator's habits are described there), stopped
// when the test ends, and serves it as a Function URL (NewFunctionURL).
package lambdatest

import (
	"context"
	"testing"

	"github.com/outbox-relay/outbox-relay/v3/internal/prereq"
	"github.com/outbox-relay/outbox-relay/v3/internal/rie"
)

// InvokePath is the emulator's invoke endpoint.
const InvokePath = rie.InvokePath

// Options configures Start (rie.Options).
type Options = rie.Options

// Function is a bootstrap running under aws-lambda-rie.
type Function = rie.Function

// Response is the emulator's answer to one invoke.
type Response = rie.Response

// FunctionError is a handler error or a runtime failure reported in a 200 response body.
type FunctionError = rie.FunctionError

// RIEPath finds aws-lambda-rie (rie.Path).
func RIEPath() (string, error) { return rie.Path() }

// RequireRIE returns RIEPath, failing the test under CI and skipping it otherwise when
// the emulator is not installed.
func RequireRIE(tb testing.TB) string {
	tb.Helper()
	p, err := rie.Path()
	if err != nil {
		prereq.Missing(tb, "%v", err)
	}
	return p
}

// ModuleRoot returns the directory of the enclosing go.mod.
func ModuleRoot() (string, error) { return rie.ModuleRoot() }

// Build compiles pkg for the host as the deployed bootstrap is built (rie.Build).
func Build(ctx context.Context, pkg, dir string) (string, error) { return rie.Build(ctx, pkg, dir) }

// Start runs opts.Bootstrap under the emulator found by RequireRIE and waits until it
// accepts connections. The emulator is stopped when the test ends, and its output written
// to the test log if the test failed and opts.Log is nil.
func Start(tb testing.TB, opts Options) *Function {
	tb.Helper()
	RequireRIE(tb)
	f, err := rie.Launch(opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		f.Stop()
		if tb.Failed() && opts.Log == nil {
			tb.Logf("aws-lambda-rie output (%s):\n%s", opts.Name, f.Log())
		}
	})
	return f
}
