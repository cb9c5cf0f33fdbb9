package publish

// ConfigError is one invalid field of a configuration: every configuration in this module
// (relay.Config, the QStash publisher's and verifier's, retention's, the webhook's, the
// failure callback's, the DLQ sync's) reports each invalid field as one, joined with
// errors.Join. Callers that fill a field from their own source (an environment variable,
// a flag) find the field with errors.As and say which setting to fix, without reading the
// message.
type ConfigError struct {
	// Config names the configuration ("relay", "qstash publisher", "qstash verifier",
	// "retention", "webhook", "failure callback", "dlq sync").
	Config string
	// Field is the Go field name, e.g. "Lease".
	Field string
	// Reason says what is wrong with the value and what it must be.
	Reason string
}

// Error reads "<config> config <field>: <reason>".
func (e *ConfigError) Error() string { return e.Config + " config " + e.Field + ": " + e.Reason }
