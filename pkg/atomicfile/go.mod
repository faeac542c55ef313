module github.com/meshagent/meshagent/pkg/atomicfile

go 1.26.0
