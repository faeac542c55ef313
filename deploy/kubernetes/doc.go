// Package kubernetes holds meshagent's Kubernetes manifests (base: NATS, signer,
// rotator, operator; external-nats: the same on an existing NATS cluster; token-review: base
// with tokens checked by the API server's TokenReview; sidecar: the per-pod
// services) and the test that checks them without a cluster: every object decodes
// strictly into the Kubernetes API types, every image, env var, flag, port and
// path matches what the meshagent binaries read, and every pod meets Pod Security
// "restricted". See docs/kubernetes.md.
package kubernetes

import _ "embed"

// SidecarTemplate is sidecar/sidecar.yaml.tmpl, for inject.Render.
//
//go:embed sidecar/sidecar.yaml.tmpl
var SidecarTemplate string
