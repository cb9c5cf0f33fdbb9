package webhook

// qLegacyIdentity accepts a legacy delivery's claimed outbox id ($1) while the legacy window
// is open and the row has the delivered topic ($2) and payload ($3, compared as the text
// the relay publishes: payload::text).
const qLegacyIdentity = `
SELECT EXISTS (
    SELECT 1
    FROM legacy_identity l
    JOIN outbox o ON o.id = $1::bigint
    WHERE now() < l.accept_until AND o.topic = $2::text AND o.payload::text = $3::text)`
