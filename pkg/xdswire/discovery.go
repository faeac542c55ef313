package xdswire

import (
	"fmt"
	"sort"

	"google.golang.org/protobuf/encoding/protowire"
)

// Message is a message of this package: it appends its wire form to b, and
// replaces itself with what b decodes to.
type Message interface {
	AppendWire(b []byte) []byte
	UnmarshalWire(b []byte) error
}

var (
	_ Message = (*DiscoveryRequest)(nil)
	_ Message = (*DiscoveryResponse)(nil)
	_ Message = (*DeltaDiscoveryRequest)(nil)
	_ Message = (*DeltaDiscoveryResponse)(nil)
)

// DiscoveryRequest is envoy.service.discovery.v3.DiscoveryRequest; of its node,
// only the id is kept.
type DiscoveryRequest struct {
	VersionInfo   string
	NodeID        string
	ResourceNames []string
	TypeURL       string
	ResponseNonce string
	ErrorDetail   *Status // a NACK when set
}

// AppendWire implements Message.
func (r *DiscoveryRequest) AppendWire(b []byte) []byte {
	b = AppendString(b, 1, r.VersionInfo)
	b = appendNode(b, 2, r.NodeID)
	b = AppendStrings(b, 3, r.ResourceNames)
	b = AppendString(b, 4, r.TypeURL)
	b = AppendString(b, 5, r.ResponseNonce)
	return appendStatus(b, 6, r.ErrorDetail)
}

// UnmarshalWire implements Message.
func (r *DiscoveryRequest) UnmarshalWire(b []byte) error {
	*r = DiscoveryRequest{}
	return decodeMessage("DiscoveryRequest", b, func(f Field) (err error) {
		switch f.Num {
		case 1:
			r.VersionInfo, err = f.String()
		case 2:
			err = decodeNode(f.Bytes, &r.NodeID)
		case 3:
			err = f.appendString(&r.ResourceNames)
		case 4:
			r.TypeURL, err = f.String()
		case 5:
			r.ResponseNonce, err = f.String()
		case 6:
			err = mergeStatus(&r.ErrorDetail, f.Bytes)
		}
		return err
	})
}

// DiscoveryResponse is envoy.service.discovery.v3.DiscoveryResponse without its
// canary, control_plane and resource_errors fields.
type DiscoveryResponse struct {
	VersionInfo string
	Resources   []Any
	TypeURL     string
	Nonce       string
}

// AppendWire implements Message.
func (r *DiscoveryResponse) AppendWire(b []byte) []byte {
	b = AppendString(b, 1, r.VersionInfo)
	for _, a := range r.Resources {
		b = AppendAny(b, 2, a)
	}
	b = AppendString(b, 4, r.TypeURL)
	return AppendString(b, 5, r.Nonce)
}

// UnmarshalWire implements Message. Resource values alias b.
func (r *DiscoveryResponse) UnmarshalWire(b []byte) error {
	*r = DiscoveryResponse{}
	return decodeMessage("DiscoveryResponse", b, func(f Field) (err error) {
		switch f.Num {
		case 1:
			r.VersionInfo, err = f.String()
		case 2:
			var a Any
			if a, err = DecodeAny(f.Bytes); err == nil {
				r.Resources = append(r.Resources, a)
			}
		case 4:
			r.TypeURL, err = f.String()
		case 5:
			r.Nonce, err = f.String()
		}
		return err
	})
}

// DeltaDiscoveryRequest is envoy.service.discovery.v3.DeltaDiscoveryRequest
// without resource locators; of its node, only the id is kept.
type DeltaDiscoveryRequest struct {
	NodeID                  string
	TypeURL                 string
	Subscribe               []string // resource_names_subscribe
	Unsubscribe             []string // resource_names_unsubscribe
	InitialResourceVersions map[string]string
	ResponseNonce           string
	ErrorDetail             *Status // a NACK when set
}

// AppendWire implements Message. Map entries are written in key order.
func (r *DeltaDiscoveryRequest) AppendWire(b []byte) []byte {
	b = appendNode(b, 1, r.NodeID)
	b = AppendString(b, 2, r.TypeURL)
	b = AppendStrings(b, 3, r.Subscribe)
	b = AppendStrings(b, 4, r.Unsubscribe)
	keys := make([]string, 0, len(r.InitialResourceVersions))
	for k := range r.InitialResourceVersions {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		b = AppendMessage(b, 5, func(b []byte) []byte {
			return AppendString(AppendString(b, 1, k), 2, r.InitialResourceVersions[k])
		})
	}
	b = AppendString(b, 6, r.ResponseNonce)
	return appendStatus(b, 7, r.ErrorDetail)
}

// UnmarshalWire implements Message.
func (r *DeltaDiscoveryRequest) UnmarshalWire(b []byte) error {
	*r = DeltaDiscoveryRequest{}
	return decodeMessage("DeltaDiscoveryRequest", b, func(f Field) (err error) {
		switch f.Num {
		case 1:
			err = decodeNode(f.Bytes, &r.NodeID)
		case 2:
			r.TypeURL, err = f.String()
		case 3:
			err = f.appendString(&r.Subscribe)
		case 4:
			err = f.appendString(&r.Unsubscribe)
		case 5:
			var k, v string
			if k, v, err = decodeStringEntry(f.Bytes); err == nil {
				if r.InitialResourceVersions == nil {
					r.InitialResourceVersions = map[string]string{}
				}
				r.InitialResourceVersions[k] = v // a later entry for a key wins
			}
		case 6:
			r.ResponseNonce, err = f.String()
		case 7:
			err = mergeStatus(&r.ErrorDetail, f.Bytes)
		}
		return err
	})
}

// DeltaDiscoveryResponse is envoy.service.discovery.v3.DeltaDiscoveryResponse
// without removed_resource_names, control_plane and resource_errors.
type DeltaDiscoveryResponse struct {
	SystemVersionInfo string
	Resources         []Resource
	TypeURL           string
	RemovedResources  []string
	Nonce             string
}

// Resource is envoy.service.discovery.v3.Resource's name, version and resource.
type Resource struct {
	Name     string
	Version  string
	Resource *Any // nil: none (a resource that only announces a version)
}

// AppendWire implements Message.
func (r *DeltaDiscoveryResponse) AppendWire(b []byte) []byte {
	b = AppendString(b, 1, r.SystemVersionInfo)
	for _, res := range r.Resources {
		b = AppendMessage(b, 2, func(b []byte) []byte {
			b = AppendString(b, 1, res.Version)
			if res.Resource != nil {
				b = AppendAny(b, 2, *res.Resource)
			}
			return AppendString(b, 3, res.Name)
		})
	}
	b = AppendString(b, 4, r.TypeURL)
	b = AppendString(b, 5, r.Nonce)
	return AppendStrings(b, 6, r.RemovedResources)
}

// UnmarshalWire implements Message. Resource values alias b.
func (r *DeltaDiscoveryResponse) UnmarshalWire(b []byte) error {
	*r = DeltaDiscoveryResponse{}
	return decodeMessage("DeltaDiscoveryResponse", b, func(f Field) (err error) {
		switch f.Num {
		case 1:
			r.SystemVersionInfo, err = f.String()
		case 2:
			var res Resource
			if res, err = decodeResource(f.Bytes); err == nil {
				r.Resources = append(r.Resources, res)
			}
		case 4:
			r.TypeURL, err = f.String()
		case 5:
			r.Nonce, err = f.String()
		case 6:
			err = f.appendString(&r.RemovedResources)
		}
		return err
	})
}

func decodeResource(b []byte) (Resource, error) {
	var r Resource
	err := bytesFields(b, func(f Field) (err error) {
		switch f.Num {
		case 1:
			r.Version, err = f.String()
		case 2:
			if r.Resource == nil {
				r.Resource = &Any{}
			}
			err = r.Resource.merge(f.Bytes)
		case 3:
			r.Name, err = f.String()
		}
		return err
	})
	return r, err
}

// bytesFields calls field for each length-delimited field of b: the one wire
// type of every field these messages keep (others are skipped).
func bytesFields(b []byte, field func(f Field) error) error {
	return Fields(b, func(f Field) error {
		if f.Type != protowire.BytesType {
			return nil
		}
		return field(f)
	})
}

// decodeMessage is bytesFields for the message named name, which its error names.
func decodeMessage(name string, b []byte, field func(f Field) error) error {
	if err := bytesFields(b, field); err != nil {
		return fmt.Errorf("decode %s: %w", name, err)
	}
	return nil
}

// appendNode appends a Node with only its id as field num; no id, no node.
func appendNode(b []byte, num protowire.Number, id string) []byte {
	if id == "" {
		return b
	}
	return AppendMessage(b, num, func(b []byte) []byte { return AppendString(b, 1, id) })
}

// DecodeNodeID is the id of the envoy.config.core.v3.Node b.
func DecodeNodeID(b []byte) (string, error) {
	var id string
	if err := decodeNode(b, &id); err != nil {
		return "", fmt.Errorf("decode Node: %w", err)
	}
	return id, nil
}

// decodeNode merges the envoy.config.core.v3.Node b into id: its id, if set.
func decodeNode(b []byte, id *string) error {
	return Fields(b, func(f Field) error {
		var err error
		if f.Is(1, protowire.BytesType) {
			*id, err = f.String()
		}
		return err
	})
}

// decodeStringEntry decodes a map<string, string> entry.
func decodeStringEntry(b []byte) (k, v string, err error) {
	err = Fields(b, func(f Field) error {
		var err error
		switch {
		case f.Is(1, protowire.BytesType):
			k, err = f.String()
		case f.Is(2, protowire.BytesType):
			v, err = f.String()
		}
		return err
	})
	return k, v, err
}
