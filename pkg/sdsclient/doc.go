// Package sdsclient is an SDS v3 client over a unix socket, for tests, xds-relay
// (which presents the workload certificate upstream) and meshctl.
package sdsclient
