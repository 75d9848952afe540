package grpccodec

import (
	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The field numbers of envoy.service.ratelimit.v3.RateLimitRequest and of
// the messages it holds.
const (
	requestDomain      = 1 // string
	requestDescriptors = 2 // repeated RateLimitDescriptor
	requestHitsAddend  = 3 // uint32

	descriptorEntries        = 1 // repeated Entry
	descriptorLimit          = 2 // RateLimitOverride
	descriptorHitsAddend     = 3 // google.protobuf.UInt64Value
	descriptorIsNegativeHits = 4 // bool

	entryKey   = 1 // string
	entryValue = 2 // string

	overrideRequestsPerUnit = 1 // uint32
	overrideUnit            = 2 // envoy.type.v3.RateLimitUnit
	overrideUnitMultiplier  = 3 // google.protobuf.UInt32Value

	wrapperValue = 1 // uint32 or uint64
)

// decodeRateLimitRequest decodes a RateLimitRequest, its domain and the
// keys and values of its descriptor entries taken as the bytes they are.
// The descriptors are allocated together, and so are the entries of all of
// them: a first pass counts them.
func decodeRateLimitRequest(b []byte, m *rlsv3.RateLimitRequest) (bad bool, err error) {
	nd, ne := countRequest(b)
	a := alloc{}
	if nd > 0 {
		a.descs = make([]commonv3.RateLimitDescriptor, nd)
		m.Descriptors = make([]*commonv3.RateLimitDescriptor, 0, nd)
	}
	if ne > 0 {
		a.entries = make([]commonv3.RateLimitDescriptor_Entry, ne)
		a.ptrs = make([]*commonv3.RateLimitDescriptor_Entry, ne)
	}
	r := reader{b: b}
	var f field
	for {
		ok, err := r.next(&f)
		if err != nil || !ok {
			r.done(m)
			return bad, err
		}
		switch {
		case f.num == requestDomain && f.typ == protowire.BytesType:
			var valid bool
			m.Domain, valid = str(f.raw)
			bad = bad || !valid
		case f.num == requestDescriptors && f.typ == protowire.BytesType:
			var d *commonv3.RateLimitDescriptor
			if len(m.Descriptors) < len(a.descs) {
				d = &a.descs[len(m.Descriptors)]
			} else {
				d = new(commonv3.RateLimitDescriptor)
			}
			dbad, err := decodeDescriptor(f.raw, d, &a)
			if err != nil {
				return bad, err
			}
			bad = bad || dbad
			m.Descriptors = append(m.Descriptors, d)
		case f.num == requestHitsAddend && f.typ == protowire.VarintType:
			m.HitsAddend = uint32(f.varint)
		default:
			r.skip(&f)
		}
	}
}

// alloc holds what decodeRateLimitRequest allocated at once for the
// descriptors and their entries, handed out in order.
type alloc struct {
	descs   []commonv3.RateLimitDescriptor
	entries []commonv3.RateLimitDescriptor_Entry
	ptrs    []*commonv3.RateLimitDescriptor_Entry
	used    int // entries handed out
}

// countRequest counts the descriptors of a request and their entries, as
// far as the wire format can be read (decoding reports the errors).
func countRequest(b []byte) (descs, entries int) {
	r := reader{b: b}
	var f field
	for {
		if ok, _ := r.next(&f); !ok {
			return descs, entries
		}
		if f.num == requestDescriptors && f.typ == protowire.BytesType {
			descs++
			entries += countDescriptor(f.raw)
		}
	}
}

func countDescriptor(b []byte) (entries int) {
	r := reader{b: b}
	var f field
	for {
		if ok, _ := r.next(&f); !ok {
			return entries
		}
		if f.num == descriptorEntries && f.typ == protowire.BytesType {
			entries++
		}
	}
}

// decodeDescriptor decodes a RateLimitDescriptor, its entries from a.
func decodeDescriptor(b []byte, m *commonv3.RateLimitDescriptor, a *alloc) (bad bool, err error) {
	// The entries counted for this descriptor, capped so that appending
	// to one descriptor's entries never reaches into the next one's.
	if n := min(countDescriptor(b), len(a.ptrs)-a.used); n > 0 {
		m.Entries = a.ptrs[a.used : a.used : a.used+n]
	}
	r := reader{b: b}
	var f field
	for {
		ok, err := r.next(&f)
		if err != nil || !ok {
			r.done(m)
			return bad, err
		}
		switch {
		case f.num == descriptorEntries && f.typ == protowire.BytesType:
			var e *commonv3.RateLimitDescriptor_Entry
			if a.used < len(a.entries) {
				e = &a.entries[a.used]
				a.used++
			} else {
				e = new(commonv3.RateLimitDescriptor_Entry)
			}
			ebad, err := decodeEntry(f.raw, e)
			if err != nil {
				return bad, err
			}
			bad = bad || ebad
			m.Entries = append(m.Entries, e)
		case f.num == descriptorLimit && f.typ == protowire.BytesType:
			if m.Limit == nil {
				m.Limit = new(commonv3.RateLimitDescriptor_RateLimitOverride)
			}
			if err := decodeOverride(f.raw, m.Limit); err != nil {
				return bad, err
			}
		case f.num == descriptorHitsAddend && f.typ == protowire.BytesType:
			if m.HitsAddend == nil {
				m.HitsAddend = new(wrapperspb.UInt64Value)
			}
			if err := decodeUInt64(f.raw, m.HitsAddend); err != nil {
				return bad, err
			}
		case f.num == descriptorIsNegativeHits && f.typ == protowire.VarintType:
			m.IsNegativeHits = protowire.DecodeBool(f.varint)
		default:
			r.skip(&f)
		}
	}
}

// decodeEntry decodes a descriptor entry: its key and value are substrings
// of one copy of the entry's bytes.
func decodeEntry(b []byte, m *commonv3.RateLimitDescriptor_Entry) (bad bool, err error) {
	var s string
	r := reader{b: b}
	var f field
	for {
		ok, err := r.next(&f)
		if err != nil || !ok {
			r.done(m)
			return bad, err
		}
		switch {
		case (f.num == entryKey || f.num == entryValue) && f.typ == protowire.BytesType:
			if s == "" {
				s = string(b)
			}
			v, valid := sub(s, b, f.raw)
			bad = bad || !valid
			if f.num == entryKey {
				m.Key = v
			} else {
				m.Value = v
			}
		default:
			r.skip(&f)
		}
	}
}

// decodeOverride decodes (merges) a RateLimitOverride into m.
func decodeOverride(b []byte, m *commonv3.RateLimitDescriptor_RateLimitOverride) error {
	r := reader{b: b}
	var f field
	for {
		ok, err := r.next(&f)
		if err != nil || !ok {
			r.done(m)
			return err
		}
		switch {
		case f.num == overrideRequestsPerUnit && f.typ == protowire.VarintType:
			m.RequestsPerUnit = uint32(f.varint)
		case f.num == overrideUnit && f.typ == protowire.VarintType:
			m.Unit = typev3.RateLimitUnit(int32(f.varint))
		case f.num == overrideUnitMultiplier && f.typ == protowire.BytesType:
			if m.UnitMultiplier == nil {
				m.UnitMultiplier = new(wrapperspb.UInt32Value)
			}
			if err := decodeUInt32(f.raw, m.UnitMultiplier); err != nil {
				return err
			}
		default:
			r.skip(&f)
		}
	}
}

// decodeUInt64 decodes (merges) a google.protobuf.UInt64Value into m.
func decodeUInt64(b []byte, m *wrapperspb.UInt64Value) error {
	r := reader{b: b}
	var f field
	for {
		ok, err := r.next(&f)
		if err != nil || !ok {
			r.done(m)
			return err
		}
		if f.num == wrapperValue && f.typ == protowire.VarintType {
			m.Value = f.varint
		} else {
			r.skip(&f)
		}
	}
}

// decodeUInt32 decodes (merges) a google.protobuf.UInt32Value into m.
func decodeUInt32(b []byte, m *wrapperspb.UInt32Value) error {
	r := reader{b: b}
	var f field
	for {
		ok, err := r.next(&f)
		if err != nil || !ok {
			r.done(m)
			return err
		}
		if f.num == wrapperValue && f.typ == protowire.VarintType {
			m.Value = uint32(f.varint)
		} else {
			r.skip(&f)
		}
	}
}
