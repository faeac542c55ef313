// Package nds is Istio's name table (NDS): the hosts and addresses istiod sends
// an agent that captures DNS, as type.googleapis.com/istio.networking.nds.v1.NameTable.
// The message is defined in istio/istio (pkg/dns/proto/nds.proto), not in
// istio.io/api, so rather than depend on all of istio/istio this package reads
// and writes its wire form directly:
//
//	message NameTable {
//	  message NameInfo {
//	    repeated string ips = 1;
//	    string registry = 2;
//	    string shortname = 3;  // Kubernetes only
//	    string namespace = 4;  // Kubernetes only
//	    repeated string alt_hosts = 5;
//	  }
//	  map<string, NameInfo> table = 1;
//	}
package nds

import (
	"errors"
	"fmt"
	"sort"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/emptypb"
)

// TypeURL is the name table's type, as istiod sends it and Istio's agent asks for it.
const TypeURL = "type.googleapis.com/istio.networking.nds.v1.NameTable"

// Table maps a host name (as istiod writes it: no trailing dot) to its entry.
type Table map[string]NameInfo

// NameInfo is one host's entry.
type NameInfo struct {
	IPs       []string
	Registry  string // e.g. "Kubernetes"
	Shortname string // the Kubernetes service name
	Namespace string // the Kubernetes namespace
	AltHosts  []string
}

// Marshal encodes t in the wire form of NameTable (entries in host order, so the
// bytes are stable).
func Marshal(t Table) []byte {
	hosts := make([]string, 0, len(t))
	for h := range t {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	var out []byte
	for _, h := range hosts {
		ni := t[h]
		var v []byte
		for _, ip := range ni.IPs {
			v = appendString(v, 1, ip)
		}
		if ni.Registry != "" {
			v = appendString(v, 2, ni.Registry)
		}
		if ni.Shortname != "" {
			v = appendString(v, 3, ni.Shortname)
		}
		if ni.Namespace != "" {
			v = appendString(v, 4, ni.Namespace)
		}
		for _, a := range ni.AltHosts {
			v = appendString(v, 5, a)
		}
		var entry []byte
		entry = appendString(entry, 1, h)
		entry = protowire.AppendTag(entry, 2, protowire.BytesType)
		entry = protowire.AppendBytes(entry, v)
		out = protowire.AppendTag(out, 1, protowire.BytesType)
		out = protowire.AppendBytes(out, entry)
	}
	return out
}

// Any wraps t for an xDS response.
func Any(t Table) *anypb.Any {
	return &anypb.Any{TypeUrl: TypeURL, Value: Marshal(t)}
}

// Message is t as a proto.Message, for servers that take messages (such as
// go-control-plane's caches, which wrap it in an Any of the requested type URL):
// an empty message carrying t as its unknown fields, which marshal to exactly
// NameTable's wire form.
func Message(t Table) proto.Message {
	m := &emptypb.Empty{}
	m.ProtoReflect().SetUnknown(Marshal(t))
	return m
}

// Unmarshal decodes the wire form of NameTable. Unknown fields are skipped, as
// protobuf does; a malformed message is an error.
func Unmarshal(b []byte) (Table, error) {
	t := Table{}
	err := fields(b, func(num protowire.Number, typ protowire.Type, v []byte) error {
		if num != 1 {
			return nil
		}
		if typ != protowire.BytesType {
			return errors.New("table: not a map entry")
		}
		var (
			host string
			ni   NameInfo
		)
		err := fields(v, func(num protowire.Number, typ protowire.Type, v []byte) error {
			switch {
			case num == 1 && typ == protowire.BytesType:
				host = string(v)
			case num == 2 && typ == protowire.BytesType:
				return fields(v, func(num protowire.Number, typ protowire.Type, v []byte) error {
					if typ != protowire.BytesType {
						return nil
					}
					switch num {
					case 1:
						ni.IPs = append(ni.IPs, string(v))
					case 2:
						ni.Registry = string(v)
					case 3:
						ni.Shortname = string(v)
					case 4:
						ni.Namespace = string(v)
					case 5:
						ni.AltHosts = append(ni.AltHosts, string(v))
					}
					return nil
				})
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("table entry: %w", err)
		}
		t[host] = ni // a later entry for the same key wins, as for a protobuf map
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("decode NameTable: %w", err)
	}
	return t, nil
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

// fields calls fn for every field of b; v is the payload of a length-delimited
// field and nil for the others.
func fields(b []byte, fn func(protowire.Number, protowire.Type, []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var v []byte
		if typ == protowire.BytesType {
			v, n = protowire.ConsumeBytes(b)
		} else {
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if err := fn(num, typ, v); err != nil {
			return err
		}
	}
	return nil
}
