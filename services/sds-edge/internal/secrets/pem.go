package secrets

import "encoding/pem"

// nextCert returns the DER of the next CERTIFICATE block in data and the rest.
func nextCert(data []byte) (der, rest []byte) {
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return nil, nil
		}
		if b.Type == "CERTIFICATE" {
			return b.Bytes, data
		}
	}
}
