package config

import "github.com/meshagent/meshagent/pkg/flagenv"

// rawFlags are the flags read as text (or a choice) and turned into the config
// after the flags (resolve), their errors reported together with the rest.
type rawFlags struct {
	keyAlg, eccAlg, eccCurve string // -key-alg, or Istio's -ecc-signature-algorithm and -ecc-curve
	certProvider             string // -pilot-cert-provider: whose roots verify a gRPC CA
	caRootCA                 string // -ca-root-ca: Istio's CA_ROOT_CA, a file or SYSTEM
	socketMode               string // -socket-mode, in octal
	keep                     bool   // -keep-cert
}

// bind defines every flag of sds-edge on fs, each with its env var, over what c
// holds (the defaults).
func (c *Config) bind(fs *flagenv.Set, raw *rawFlags) {
	c.Log.Bind(fs)
	c.Bus.Bind(fs)
	fs.String(&c.Listen.HTTP, "http-addr", "HTTP_ADDR", c.Listen.HTTP, "health and metrics listen address")
	c.bindPodCA(fs, raw)
	c.bindCert(fs, raw)
	c.bindSDS(fs, raw)
}

// bindPodCA defines the flags of the pod's identity and of the CA it asks.
func (c *Config) bindPodCA(fs *flagenv.Set, raw *rawFlags) {
	c.Pod.Bind(fs)
	fs.String(&c.Pod.TrustDomain, "trust-domain", "TRUST_DOMAIN", c.Pod.TrustDomain, "SPIFFE trust domain")
	fs.List(&c.Pod.TrustDomainAliases, "trust-domain-aliases", "TRUST_DOMAIN_ALIASES", nil,
		"trust domains accepted as this one, comma-separated: their IDs verify against this domain's roots in ROOTCA_SPIFFE (Istio: meshConfig trustDomainAliases)")
	fs.String(&c.Pod.Namespace, "namespace", "POD_NAMESPACE", c.Pod.Namespace, "workload namespace")
	fs.String(&c.Pod.ServiceAccount, "service-account", "SERVICE_ACCOUNT", c.Pod.ServiceAccount, "workload service account")
	fs.String(&c.CA.TokenFile, "token-file", "TOKEN_FILE", c.CA.TokenFile, "JWT credential, re-read for every CSR")
	fs.String(&c.CA.ViaNode, "bus-via-node", "BUS_VIA_NODE", "", "the node (spec.nodeName) whose node agent this pod's NATS_URL reaches: sign requests go on the node's sign subject with the pod's token (the node tier); empty: the pod connects to the hub itself")
	fs.String(&c.CA.Addr, "ca-addr", "CA_ADDR", c.CA.Addr, "Istio gRPC CA address; empty: the signer over NATS")
	fs.List(&c.CA.FallbackAddrs, "ca-fallback-addr", "CA_FALLBACK_ADDR", nil,
		"the CAs' Istio gRPC APIs, comma-separated, tried in turn when the bus is unreachable or no signer answers on it in time (signing is on the bus otherwise); with it, or -ca-addr, start does not wait for the bus")
	fs.String(&raw.caRootCA, "ca-root-ca", "CA_ROOT_CA", "", "the roots that verify the gRPC CA's TLS, as Istio's agent reads CA_ROOT_CA: a PEM file (under -pod-root if relative), or SYSTEM for the host's trust store; before -pilot-cert-provider's default; -ca-root-cert is the same without SYSTEM (set one)")
	fs.String(&c.CA.RootCert, "ca-root-cert", "CA_ROOT_CERT", c.CA.RootCert, "PEM roots (a bundle, all trusted) for the CA's TLS, with the roots the pod trusts; also the pod's first trust when -trust-anchors-file is unset; empty: the trust anchors, then the pod's bundle (with neither, a TLS CA cannot be verified)")
	fs.String(&c.CA.TrustAnchorsFile, "trust-anchors-file", "TRUST_ANCHORS_FILE", c.CA.TrustAnchorsFile,
		"PEM roots trusted before the first trust bundle, which must be endorsed by one of them; default "+DefaultTrustAnchors+" if it exists, else trust on first use")
	fs.String(&c.CA.ProvCert, "prov-cert", "PROV_CERT", c.CA.ProvCert, "directory with cert-chain.pem and key.pem of a provisioned certificate (a VM's; may be -output-certs), used when there is no token and no valid certificate of our own: presented to the bus and to -ca-addr over TLS; empty: none")
	fs.String(&c.CA.ClusterID, "cluster-id", "CLUSTER_ID", c.CA.ClusterID, "ClusterID metadata sent to the gRPC CA")
}

// bindCert defines the flags of the workload certificate: its key, lifetime,
// renewal, and the files it is kept in or read from.
func (c *Config) bindCert(fs *flagenv.Set, raw *rawFlags) {
	fs.Duration(&c.Cert.TTL, "secret-ttl", "SECRET_TTL", c.Cert.TTL, "requested certificate lifetime")
	fs.String(&raw.keyAlg, "key-alg", "KEY_ALG", "", "key algorithm: EC-P256, EC-P384, RSA-2048, RSA-3072, RSA-4096; empty: -ecc-signature-algorithm's, else EC-P256 (Istio: RSA-2048; docs/istio.md says why not)")
	fs.String(&raw.eccAlg, "ecc-signature-algorithm", "ECC_SIGNATURE_ALGORITHM", "", "Istio's key choice: ECDSA for an EC key of -ecc-curve; empty: -key-alg's default")
	fs.String(&raw.eccCurve, "ecc-curve", "ECC_CURVE", "P256", "with -ecc-signature-algorithm ECDSA: P256 or P384 (Istio: ECC_CURVE)")
	fs.String(&c.Cert.Signer, "cert-signer", "ISTIO_META_CERT_SIGNER", c.Cert.Signer, "the named signer to ask for the workload certificate (one of the CA's CERT_SIGNERS); empty: the default (Istio: ISTIO_META_CERT_SIGNER)")
	fs.String(&raw.certProvider, "pilot-cert-provider", "PILOT_CERT_PROVIDER", "istiod",
		"whose roots verify the gRPC CA when -ca-root-cert is not given, as Istio's agent: istiod (the pod's trust bundle), kubernetes (the service account's ca.crt), custom (etc/certs/root-cert.pem)")
	fs.Bool(&raw.keep, "keep-cert", "KEEP_CERT", raw.keep, "keep the current key and certificate under the pod root (0600) to serve them at once after a restart")
	fs.Bool(&c.Cert.PKCS8, "pkcs8", "PKCS8_KEY", c.Cert.PKCS8, "encode private keys as PKCS#8")
	fs.Float64(&c.Cert.SafetyRatio, "safety-ratio", "SAFETY_RENEW_RATIO", c.Cert.SafetyRatio, "renew unasked at this fraction of the lifetime (0 < r < 1)")
	fs.Float64(&c.Cert.GraceRatio, "grace-ratio", "SECRET_GRACE_PERIOD_RATIO", c.Cert.GraceRatio,
		"the rotator asks for a renewal when this fraction of the lifetime is left (its -grace-ratio): past that point, a bus reconnect renews at once, since the renew-due may have been sent while the bus was away")
	fs.Duration(&c.Cert.RetryMin, "retry-min", "CSR_RETRY_MIN", c.Cert.RetryMin, "first retry delay after a failed CSR")
	fs.Duration(&c.Cert.RetryMax, "retry-max", "CSR_RETRY_MAX", c.Cert.RetryMax, "largest retry delay")
	fs.Duration(&c.Cert.RequestTimeout, "ca-timeout", "CA_TIMEOUT", c.Cert.RequestTimeout, "timeout of one signing attempt (the signer drops a request once it has passed)")
	fs.String(&c.Cert.OutputDir, "output-certs", "OUTPUT_CERTS", c.Cert.OutputDir, "also write key.pem, cert-chain.pem, root-cert.pem here")
	fs.Bool(&c.Cert.FileMounted, "file-mounted-certs", "FILE_MOUNTED_CERTS", c.Cert.FileMounted, "serve the certificates mounted in etc/certs")
	fs.List(&c.Cert.FileCertDirs, "file-cert-dirs", "FILE_CERT_DIRS", c.Cert.FileCertDirs,
		"directories the file-cert:/file-root: SDS resources may read from, comma-separated, relative ones under the pod root; a path outside them (after resolving .. and symlinks) is refused; empty: none; / : anywhere, as Istio")
	fs.Duration(&c.Cert.FileDebounce, "file-debounce", "FILE_DEBOUNCE", c.Cert.FileDebounce, "quiet time before reloading changed certificate files")
}

// bindSDS defines the flags of the SDS sockets.
func (c *Config) bindSDS(fs *flagenv.Set, raw *rawFlags) {
	fs.String(&c.SDS.Socket, "socket", "SDS_SOCKET", c.SDS.Socket, "SDS unix socket")
	fs.String(&raw.socketMode, "socket-mode", "SDS_SOCKET_MODE", "0600", "socket file mode (0600 or 0660)")
	fs.String(&c.Gateway.Dir, "gateway-credentials-dir", "GATEWAY_CREDENTIALS_DIR", c.Gateway.Dir,
		"serve kubernetes://NAME gateway credentials from NAME's secret directory here (tls.crt, tls.key, ca.crt), on -credential-socket; empty: off")
	fs.String(&c.Gateway.Socket, "credential-socket", "CREDENTIAL_SOCKET", c.Gateway.Socket, "SDS unix socket of the gateway credentials (Istio's credential socket)")
	fs.Duration(&c.SDS.ExternalWait, "external-wait", "EXTERNAL_SDS_WAIT", c.SDS.ExternalWait, "wait this long for another SDS provider's socket before serving")
}
