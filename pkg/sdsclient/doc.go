// Package sdsclient is an SDS v3 client over a unix socket, for tests, xds-relay
// (which presents the workload certificate upstream) and meshctl.
//
// It speaks envoy.service.secret.v3.SecretDiscoveryService with pkg/xdswire's
// messages (so xds-relay links none of go-control-plane's generated types): Open
// starts one state-of-the-world StreamSecrets stream (with real ACK/NACK), Fetch
// is a one-shot FetchSecrets, and Watcher keeps the latest `default` certificate
// and `ROOTCA` bundle for TLS users, reconnecting with backoff. Its tests run it
// against go-control-plane's SDS server; sdstest builds the secrets they serve
// with the generated types.
package sdsclient
