package main

import (
	"context"
	"errors"
)

// runRelay is a placeholder until its issue lands.
func runRelay(ctx context.Context, e env, args []string) error {
	return errors.New("not implemented yet")
}
