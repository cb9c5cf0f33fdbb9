package postgres

// NullIfZero returns nil for the zero value of T (for a time.Time, any time whose IsZero
// is true) and &v otherwise: the parameter of an optional filter or column, which a query
// reads as NULL when it is unset.
func NullIfZero[T comparable](v T) *T {
	var zero T
	if z, ok := any(v).(interface{ IsZero() bool }); ok && z.IsZero() || v == zero {
		return nil
	}
	return &v
}
