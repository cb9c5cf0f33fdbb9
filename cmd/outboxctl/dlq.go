package main

import (
	"context"
	"errors"
)

// runDLQ is a placeholder until its issue lands.
func runDLQ(ctx context.Context, e env, args []string) error {
	return errors.New("not implemented yet")
}
