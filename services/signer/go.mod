module github.com/meshagent/meshagent/services/signer

go 1.26.0
