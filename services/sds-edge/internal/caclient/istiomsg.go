package caclient

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/trustbundle"
	"github.com/meshagent/meshagent/pkg/xdswire"
)

// Istio's CA API (istio.io/api security/v1alpha1, ca.proto), written on the wire
// with xdswire's codec so that sds-edge does not link istio.io/api's generated
// types (docs/benchmarks.md, "Per-pod memory"). Its tests talk to the signer's
// server, which is built on the generated types.
const createCertificate = "/istio.v1.auth.IstioCertificateService/CreateCertificate"

// certificateRequest is istio.v1.auth.IstioCertificateRequest; of its metadata
// (a google.protobuf.Struct) only the string field CertSigner, which Istio's agent
// fills from ISTIO_META_CERT_SIGNER.
type certificateRequest struct {
	CSR              string // PEM
	ValidityDuration int64  // seconds
	CertSigner       string // metadata.fields["CertSigner"].string_value; "": not sent
}

// certSignerKey is the metadata field naming the signer (Istio's security.CertSigner).
const certSignerKey = "CertSigner"

// certificateResponse is istio.v1.auth.IstioCertificateResponse.
type certificateResponse struct {
	CertChain []string // PEM, leaf first, root last
	signer    *events.SignerRoots
	bundle    *trustbundle.Bundle // the trust bundle header's, Whole
}

var (
	_ xdswire.Message = (*certificateRequest)(nil)
	_ xdswire.Message = (*certificateResponse)(nil)
)

func (r *certificateRequest) AppendWire(b []byte) []byte {
	b = xdswire.AppendString(b, 1, r.CSR)
	if r.ValidityDuration != 0 {
		b = protowire.AppendTag(b, 3, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(r.ValidityDuration))
	}
	if r.CertSigner != "" {
		// Struct{fields: {certSignerKey: Value{string_value: CertSigner}}}: the map
		// entry is field 1 of Struct (key 1, value 2), the string field 3 of Value.
		value := xdswire.AppendString(nil, 3, r.CertSigner)
		entry := xdswire.AppendString(nil, 1, certSignerKey)
		entry = protowire.AppendBytes(protowire.AppendTag(entry, 2, protowire.BytesType), value)
		st := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), entry)
		b = protowire.AppendBytes(protowire.AppendTag(b, 4, protowire.BytesType), st)
	}
	return b
}

func (r *certificateRequest) UnmarshalWire(b []byte) error {
	*r = certificateRequest{}
	return xdswire.Fields(b, func(f xdswire.Field) error {
		var err error
		switch {
		case f.Is(1, protowire.BytesType):
			r.CSR, err = f.String()
		case f.Is(3, protowire.VarintType):
			r.ValidityDuration = int64(f.Uint)
		}
		return err
	})
}

func (r *certificateResponse) AppendWire(b []byte) []byte {
	return xdswire.AppendStrings(b, 1, r.CertChain)
}

func (r *certificateResponse) UnmarshalWire(b []byte) error {
	*r = certificateResponse{}
	err := xdswire.Fields(b, func(f xdswire.Field) error {
		if !f.Is(1, protowire.BytesType) {
			return nil
		}
		s, err := f.String()
		r.CertChain = append(r.CertChain, s)
		return err
	})
	if err != nil {
		return fmt.Errorf("decode IstioCertificateResponse: %w", err)
	}
	return nil
}
