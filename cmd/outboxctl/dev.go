package main

import (
	"context"
	"errors"
)

// runDev is a placeholder until its issue lands.
func runDev(ctx context.Context, e env, args []string) error {
	return errors.New("not implemented yet")
}
