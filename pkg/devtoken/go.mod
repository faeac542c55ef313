module github.com/meshagent/meshagent/pkg/devtoken

go 1.26.0

require github.com/go-jose/go-jose/v4 v4.1.8

require github.com/meshagent/meshagent/pkg/atomicfile v0.0.0

replace github.com/meshagent/meshagent/pkg/atomicfile => ../atomicfile
