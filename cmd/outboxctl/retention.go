package main

import (
	"context"
	"errors"
)

// runRetention is a placeholder until its issue lands.
func runRetention(ctx context.Context, e env, args []string) error {
	return errors.New("not implemented yet")
}
