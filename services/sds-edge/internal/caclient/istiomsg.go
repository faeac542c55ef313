package caclient

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/meshagent/meshagent/pkg/xdswire"
)

// Istio's CA API (istio.io/api security/v1alpha1, ca.proto), written on the wire
// with xdswire's codec so that sds-edge does not link istio.io/api's generated
// types (docs/benchmarks.md, "Per-pod memory"). Its tests talk to the signer's
// server, which is built on the generated types.
const createCertificate = "/istio.v1.auth.IstioCertificateService/CreateCertificate"

// certificateRequest is istio.v1.auth.IstioCertificateRequest without metadata.
type certificateRequest struct {
	CSR              string // PEM
	ValidityDuration int64  // seconds
}

// certificateResponse is istio.v1.auth.IstioCertificateResponse.
type certificateResponse struct {
	CertChain []string // PEM, leaf first, root last
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
