// Package tests holds no code of its own: its subpackages are the test harness that
// every module's tests share (testkit, kubetest, bustest, faultcheck, ...) and the NATS
// fault suite (faults). Nothing outside a _test.go file or another harness package
// imports them; production code lives in pkg/ and the services.
package tests
