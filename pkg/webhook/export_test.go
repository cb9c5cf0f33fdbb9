package webhook

// InboxOutcomeKey is the span attribute of the inbox's outcome, for the tracing tests.
const InboxOutcomeKey = inboxOutcomeKey
