// Command envoy-standin stands in for Envoy where there is none: the launcher starts
// it exactly as it starts Envoy, and it answers the admin calls the launcher makes
// as Envoy's admin API does (see the standin package for the table).
package main

import (
	"os"

	"github.com/meshagent/meshagent/services/launcher/internal/standin"
)

func main() { os.Exit(standin.Main(os.Args[1:], os.Stdout, os.Stderr)) }
