// Package grpccodec is the gRPC server codec of envoy-rls: the standard
// protobuf codec, except that the requests whose strings come from what a
// client sent are decoded byte-exact: RLS's RateLimitRequest and RLQS's
// usage reports (whose bucket ids RLQS responses echo, byte-exact too).
//
// A descriptor is bytes: Envoy copies a header into a descriptor value as it
// came, and a header may hold any byte (0xFF, a lone continuation byte).
// Envoy's C++ protobuf sends such a string as it is, but protobuf-go refuses
// to decode a proto3 string that is not valid UTF-8, and gRPC then answers
// Internal, which Envoy's default (failure_mode_deny: false) lets through
// unlimited: one byte in a header would bypass every limit. This codec
// decodes those messages with protowire into the same generated structs,
// accepting any bytes in their strings, so that such a request is decided on
// its bytes like any other. Everything else (the health and reflection
// services, every response) goes through the standard codec.
//
// The strings of a message decoded here may hold any bytes. Whatever reads
// them must not assume UTF-8: a Prometheus label, a structpb value, an
// OpenTelemetry attribute or anything marshalled as protobuf needs valid
// UTF-8 (see cardinality.Label and rls's printable text).
//
// # Adding a message
//
// A message whose strings a client controls gets a decoder of its own: a
// func(b []byte, m *T) (invalidUTF8 bool, err error) that fills m (already
// reset) from its wire bytes b, as proto.Unmarshal would but without the
// UTF-8 check, and reports whether any string it set is not valid UTF-8.
// Write it with the helpers of wire.go (see decodeRateLimitRequest in
// ratelimit.go), add one case to the switch in Codec.Unmarshal, and add the
// message to the fuzz test (FuzzRateLimitRequest shows how: same result as
// proto.Unmarshal on what it accepts, no panic on anything).
package grpccodec

import (
	"fmt"
	"strings"
	"unicode/utf8"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Options are the codec's hooks. Nil hooks are not called.
type Options struct {
	// InvalidUTF8 is called once for each decoded message holding a
	// string that is not valid UTF-8 (the service counts them).
	InvalidUTF8 func()
	// Repaired is called when a message the server sends could not be
	// marshalled (a string that is not valid UTF-8: protobuf-go refuses
	// to marshal one) and was sent with those strings repaired instead
	// (each invalid byte replaced by U+FFFD). Nothing should ever reach
	// it: the service makes its responses valid; it is the net under
	// that, so that a mistake costs a log line, not an Internal error
	// (which Envoy's default lets through unlimited).
	Repaired func(msg string, err error)
}

// Codec is a grpc encoding.CodecV2 for grpc.ForceServerCodecV2.
type Codec struct {
	std  encoding.CodecV2
	opts Options
}

// New returns the codec.
func New(opts Options) *Codec {
	return &Codec{std: encoding.GetCodecV2(protocodec.Name), opts: opts}
}

// Name is the standard codec's: clients send application/grpc (or
// application/grpc+proto) as before.
func (c *Codec) Name() string { return protocodec.Name }

// Unmarshal decodes data into v: byte-exact for the messages that have a
// decoder here, with the standard codec for every other.
func (c *Codec) Unmarshal(data mem.BufferSlice, v any) error {
	switch m := v.(type) {
	case *rlsv3.RateLimitRequest:
		return decode(c, data, m, decodeRateLimitRequest)
	case *rlqsv3.RateLimitQuotaUsageReports:
		return decode(c, data, m, decodeUsageReports)
		// Each further message decoded byte-exact gets a case here (see
		// "Adding a message" in the package documentation).
	}
	return c.std.Unmarshal(data, v)
}

// decode runs the decoder of m's type on data.
func decode[T proto.Message](c *Codec, data mem.BufferSlice, m T, dec func([]byte, T) (bool, error)) error {
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	proto.Reset(m)
	bad, err := dec(buf.ReadOnlyData(), m)
	if err != nil {
		return fmt.Errorf("%s: %w", m.ProtoReflect().Descriptor().Name(), err)
	}
	if bad && c.opts.InvalidUTF8 != nil {
		c.opts.InvalidUTF8()
	}
	return nil
}

// Marshal encodes v with the standard codec. Should that fail, it tries
// once more with every string that is not valid UTF-8 repaired (on a copy),
// and reports it to Options.Repaired.
func (c *Codec) Marshal(v any) (mem.BufferSlice, error) {
	out, err := c.std.Marshal(v)
	if err == nil {
		return out, nil
	}
	if r, ok := v.(*rlqsv3.RateLimitQuotaResponse); ok {
		// An RLQS response echoes the bucket ids Envoy reported, which may
		// hold any bytes (decodeUsageReports): Envoy matches them by their
		// bytes, so they go out as they came, not repaired.
		b, err := encodeQuotaResponse(r)
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	m, ok := v.(proto.Message)
	if !ok {
		return nil, err
	}
	fixed := proto.Clone(m)
	if !repairUTF8(fixed.ProtoReflect()) {
		return nil, err
	}
	out, err2 := c.std.Marshal(fixed)
	if err2 != nil {
		return nil, err
	}
	if c.opts.Repaired != nil {
		c.opts.Repaired(string(m.ProtoReflect().Descriptor().FullName()), err)
	}
	return out, nil
}

// repairUTF8 replaces, in m and every message it holds, each string that is
// not valid UTF-8 with strings.ToValidUTF8(s, "\uFFFD"), map keys included.
// It reports whether it changed anything.
func repairUTF8(m protoreflect.Message) bool {
	changed := false
	fix := func(v protoreflect.Value) (protoreflect.Value, bool) {
		if s := v.String(); !utf8.ValidString(s) {
			return protoreflect.ValueOfString(strings.ToValidUTF8(s, "\uFFFD")), true
		}
		return v, false
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsMap():
			mp := v.Map()
			strKey := fd.MapKey().Kind() == protoreflect.StringKind
			strValue := fd.MapValue().Kind() == protoreflect.StringKind
			msgValue := fd.MapValue().Message() != nil
			var bad []protoreflect.MapKey // changed only after Range
			mp.Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				if msgValue {
					changed = repairUTF8(mv.Message()) || changed
				}
				if (strKey && !utf8.ValidString(k.String())) || (strValue && !utf8.ValidString(mv.String())) {
					bad = append(bad, k)
				}
				return true
			})
			for _, k := range bad {
				mv := mp.Get(k)
				if strValue {
					mv, _ = fix(mv)
				}
				nk := k
				if strKey {
					mp.Clear(k)
					kv, _ := fix(k.Value())
					nk = kv.MapKey()
				}
				mp.Set(nk, mv)
				changed = true
			}
		case fd.IsList():
			l := v.List()
			for i := range l.Len() {
				switch fd.Kind() {
				case protoreflect.StringKind:
					if nv, ok := fix(l.Get(i)); ok {
						l.Set(i, nv)
						changed = true
					}
				case protoreflect.MessageKind, protoreflect.GroupKind:
					changed = repairUTF8(l.Get(i).Message()) || changed
				}
			}
		case fd.Kind() == protoreflect.StringKind:
			if nv, ok := fix(v); ok {
				m.Set(fd, nv)
				changed = true
			}
		case fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind:
			changed = repairUTF8(v.Message()) || changed
		}
		return true
	})
	return changed
}
