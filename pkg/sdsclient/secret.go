package sdsclient

import "github.com/meshagent/meshagent/pkg/xdswire"

// SecretTypeURL is the type URL of an SDS secret.
const SecretTypeURL = xdswire.SecretTypeURL

// Well-known resource names, as Istio's agent serves them.
const (
	ResourceDefault = "default"
	ResourceRootCA  = "ROOTCA"
	// ResourceSPIFFERootCA is the SPIFFE validation context: the roots of each
	// trust domain the pod accepts peers of.
	ResourceSPIFFERootCA = "ROOTCA_SPIFFE"
)

// WorkloadResources are the resources every sds-edge serves a workload (file
// resources aside, which are named by their paths).
var WorkloadResources = []string{ResourceDefault, ResourceRootCA, ResourceSPIFFERootCA}

// Secret is one decoded SDS secret: a TlsCertificate (CertChain and PrivateKey, PEM),
// a ValidationContext (TrustedCA, PEM), or both empty when the server sent neither.
type Secret = xdswire.Secret

// The SecretDiscoveryService's methods.
const (
	sdsService   = "/envoy.service.secret.v3.SecretDiscoveryService/"
	methodStream = sdsService + "StreamSecrets"
	methodDelta  = sdsService + "DeltaSecrets"
	methodFetch  = sdsService + "FetchSecrets"
)
