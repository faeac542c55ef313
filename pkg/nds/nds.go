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

	"github.com/meshagent/meshagent/pkg/xdswire"
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
		out = xdswire.AppendMessage(out, 1, func(entry []byte) []byte {
			entry = xdswire.AppendStrings(entry, 1, []string{h})
			return xdswire.AppendMessage(entry, 2, func(v []byte) []byte {
				v = xdswire.AppendStrings(v, 1, ni.IPs)
				v = xdswire.AppendString(v, 2, ni.Registry)
				v = xdswire.AppendString(v, 3, ni.Shortname)
				v = xdswire.AppendString(v, 4, ni.Namespace)
				return xdswire.AppendStrings(v, 5, ni.AltHosts)
			})
		})
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
	err := xdswire.Fields(b, func(f xdswire.Field) error {
		if f.Num != 1 {
			return nil
		}
		if f.Type != protowire.BytesType {
			return errors.New("table: not a map entry")
		}
		var (
			host string
			ni   NameInfo
		)
		err := xdswire.Fields(f.Bytes, func(f xdswire.Field) error {
			switch {
			case f.Is(1, protowire.BytesType):
				host = string(f.Bytes)
			case f.Is(2, protowire.BytesType):
				return xdswire.Fields(f.Bytes, func(f xdswire.Field) error {
					if f.Type != protowire.BytesType {
						return nil
					}
					switch v := string(f.Bytes); f.Num {
					case 1:
						ni.IPs = append(ni.IPs, v)
					case 2:
						ni.Registry = v
					case 3:
						ni.Shortname = v
					case 4:
						ni.Namespace = v
					case 5:
						ni.AltHosts = append(ni.AltHosts, v)
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
