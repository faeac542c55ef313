package events

import "embed"

// Schemas holds the JSON Schema of every payload, one file per type, named after the
// type without its io.meshagent. prefix (schemas/cert.issued.v1.json). The tests keep
// them equal to the Go types; regenerate with go test -update.
//
//go:embed schemas/*.json
var Schemas embed.FS
