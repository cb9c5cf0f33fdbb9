package main

import (
	"context"
	"errors"
)

// runChaos is a placeholder until its issue lands.
func runChaos(ctx context.Context, e env, args []string) error {
	return errors.New("not implemented yet")
}
