module github.com/meshagent/meshagent/pkg/pki

go 1.26.0

require github.com/spiffe/go-spiffe/v2 v2.9.0
