package grpccodec

import (
	"fmt"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// typical is a request as Envoy sends it for a route with three rate limit
// actions.
func typical() *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{
		Domain: "edge-proxy",
		Descriptors: []*commonv3.RateLimitDescriptor{
			{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "generic_key", Value: "api"}, {Key: "remote_address", Value: "203.0.113.7"}}},
			{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "header_match", Value: "tenant"}, {Key: "x-tenant-id", Value: "acme-corp"}}},
			{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "destination_cluster", Value: "backend"}}},
		},
	}
}

func unmarshal(t testing.TB, c encoding.CodecV2, b []byte, m proto.Message) error {
	t.Helper()
	return c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, m)
}

// Hand-encoded wire bytes: the strings hold bytes that are not UTF-8, which
// protobuf-go refuses and the codec keeps exactly.
func TestInvalidUTF8IsDecodedByteExact(t *testing.T) {
	entry := func(k, v string) []byte {
		var b []byte
		b = protowire.AppendTag(b, entryKey, protowire.BytesType)
		b = protowire.AppendString(b, k)
		b = protowire.AppendTag(b, entryValue, protowire.BytesType)
		return protowire.AppendString(b, v)
	}
	var desc []byte
	desc = protowire.AppendTag(desc, descriptorEntries, protowire.BytesType)
	desc = protowire.AppendBytes(desc, entry("remote_address", "\xff\xfe"))
	desc = protowire.AppendTag(desc, descriptorEntries, protowire.BytesType)
	desc = protowire.AppendBytes(desc, entry("k\x80", "caf\xc3"))
	var req []byte
	req = protowire.AppendTag(req, requestDomain, protowire.BytesType)
	req = protowire.AppendString(req, "dom\xed\xa0\x80") // a UTF-16 surrogate, encoded
	req = protowire.AppendTag(req, requestDescriptors, protowire.BytesType)
	req = protowire.AppendBytes(req, desc)

	if err := proto.Unmarshal(req, new(rlsv3.RateLimitRequest)); err == nil {
		t.Fatal("protobuf-go accepted the request: the test shows nothing")
	}
	n := 0
	c := New(Options{InvalidUTF8: func() { n++ }})
	var m rlsv3.RateLimitRequest
	if err := unmarshal(t, c, req, &m); err != nil {
		t.Fatalf("Unmarshal: %v", err)
	}
	want := &rlsv3.RateLimitRequest{Domain: "dom\xed\xa0\x80", Descriptors: []*commonv3.RateLimitDescriptor{{
		Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "\xff\xfe"}, {Key: "k\x80", Value: "caf\xc3"}},
	}}}
	if !proto.Equal(&m, want) {
		t.Errorf("decoded %q, want %q", prototextish(&m), prototextish(want))
	}
	if n != 1 {
		t.Errorf("InvalidUTF8 called %d times, want 1", n)
	}
	// A valid request is not counted.
	b, _ := proto.Marshal(typical())
	if err := unmarshal(t, c, b, &m); err != nil || !proto.Equal(&m, typical()) || n != 1 {
		t.Errorf("valid request: err %v, equal %v, counted %d", err, proto.Equal(&m, typical()), n)
	}
}

// prototextish prints what a test compares; prototext would refuse the
// invalid strings.
func prototextish(m *rlsv3.RateLimitRequest) string {
	s := fmt.Sprintf("domain %q", m.Domain)
	for _, d := range m.Descriptors {
		s += " ["
		for _, e := range d.Entries {
			s += fmt.Sprintf("%q=%q ", e.Key, e.Value)
		}
		s += "]"
	}
	return s
}

// Messages without a decoder of their own go through the standard codec.
func TestOtherMessagesUseTheStandardCodec(t *testing.T) {
	c := New(Options{})
	b, _ := proto.Marshal(&healthpb.HealthCheckRequest{Service: "ratelimit"})
	var m healthpb.HealthCheckRequest
	if err := unmarshal(t, c, b, &m); err != nil || m.Service != "ratelimit" {
		t.Fatalf("health request: %v %q", err, m.Service)
	}
	bad := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "\xff")
	if err := unmarshal(t, c, bad, &m); err == nil {
		t.Error("the standard codec accepted invalid UTF-8 in a health request")
	}
	if c.Name() != protocodec.Name {
		t.Errorf("Name %q", c.Name())
	}
}

// A response holding a string that is not valid UTF-8 is sent repaired
// (protobuf-go would not marshal it) and reported; a valid one is sent as
// the standard codec sends it.
func TestMarshalRepairsInvalidUTF8(t *testing.T) {
	var repaired []string
	c := New(Options{Repaired: func(msg string, err error) { repaired = append(repaired, msg) }})
	meta, _ := structpb.NewStruct(map[string]any{"domain": "d"})
	meta.Fields["descriptors"] = structpb.NewStringValue("ip=\xff")
	meta.Fields["k\xfe"] = structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{structpb.NewStringValue("\x80")}})
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
			Code: rlsv3.RateLimitResponse_OK, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Name: "r\xff", RequestsPerUnit: 3},
		}},
		DynamicMetadata: meta,
	}
	if _, err := proto.Marshal(resp); err == nil {
		t.Fatal("protobuf-go marshalled invalid UTF-8: the test shows nothing")
	}
	out, err := c.Marshal(resp)
	if err != nil {
		t.Fatalf("Marshal: %v", err)
	}
	var got rlsv3.RateLimitResponse
	if err := proto.Unmarshal(out.Materialize(), &got); err != nil {
		t.Fatalf("the repaired response does not decode: %v", err)
	}
	if n := got.Statuses[0].CurrentLimit.Name; n != "r\uFFFD" {
		t.Errorf("name %q", n)
	}
	f := got.DynamicMetadata.Fields
	if f["descriptors"].GetStringValue() != "ip=\uFFFD" || f["k\uFFFD"].GetListValue().GetValues()[0].GetStringValue() != "\uFFFD" || f["domain"].GetStringValue() != "d" {
		t.Errorf("metadata %v", got.DynamicMetadata)
	}
	if resp.Statuses[0].CurrentLimit.Name != "r\xff" {
		t.Error("Marshal changed the caller's message")
	}
	if len(repaired) != 1 || repaired[0] != "envoy.service.ratelimit.v3.RateLimitResponse" {
		t.Errorf("Repaired calls %q", repaired)
	}
	// Valid: as the standard codec sends it, and not reported.
	resp.Statuses[0].CurrentLimit.Name = "r"
	delete(meta.Fields, "k\xfe")
	meta.Fields["descriptors"] = structpb.NewStringValue("ip=1")
	out, err = c.Marshal(resp)
	var back rlsv3.RateLimitResponse
	if err != nil || proto.Unmarshal(out.Materialize(), &back) != nil || !proto.Equal(&back, resp) || len(repaired) != 1 {
		t.Errorf("valid response: err %v, decodes to the same %v, repaired %d", err, proto.Equal(&back, resp), len(repaired))
	}
}

// bytesTypes is RateLimitRequest with every string field of it and of the
// messages it holds declared as bytes: protobuf-go decodes it exactly as
// the request, without the UTF-8 check, so it is the reference the
// byte-exact decoder is held to on any input.
var bytesTypes = func() protoreflect.MessageType {
	local := new(protoregistry.Files)
	files := []protoreflect.FileDescriptor{
		(&commonv3.RateLimitDescriptor{}).ProtoReflect().Descriptor().ParentFile(),
		(&rlsv3.RateLimitRequest{}).ProtoReflect().Descriptor().ParentFile(),
	}
	for _, fd := range files {
		fdp := protodesc.ToFileDescriptorProto(fd)
		var walk func([]*descriptorpb.DescriptorProto)
		walk = func(ms []*descriptorpb.DescriptorProto) {
			for _, m := range ms {
				for _, f := range m.Field {
					if f.GetType() == descriptorpb.FieldDescriptorProto_TYPE_STRING {
						f.Type = descriptorpb.FieldDescriptorProto_TYPE_BYTES.Enum()
						f.Options = nil // string rules of protoc-gen-validate
					}
				}
				walk(m.NestedType)
			}
		}
		walk(fdp.MessageType)
		f, err := protodesc.NewFile(fdp, resolver{local})
		if err != nil {
			panic(err)
		}
		if err := local.RegisterFile(f); err != nil {
			panic(err)
		}
	}
	d, err := local.FindDescriptorByName("envoy.service.ratelimit.v3.RateLimitRequest")
	if err != nil {
		panic(err)
	}
	return dynamicpb.NewMessageType(d.(protoreflect.MessageDescriptor))
}()

// resolver finds the modified files first, then the linked ones.
type resolver struct{ local *protoregistry.Files }

func (r resolver) FindFileByPath(p string) (protoreflect.FileDescriptor, error) {
	if f, err := r.local.FindFileByPath(p); err == nil {
		return f, nil
	}
	return protoregistry.GlobalFiles.FindFileByPath(p)
}

func (r resolver) FindDescriptorByName(n protoreflect.FullName) (protoreflect.Descriptor, error) {
	if d, err := r.local.FindDescriptorByName(n); err == nil {
		return d, nil
	}
	return protoregistry.GlobalFiles.FindDescriptorByName(n)
}

// asBytes copies a decoded message into the bytes-typed reference message.
func asBytes(src, dst protoreflect.Message) {
	dd := dst.Descriptor()
	conv := func(fd, dfd protoreflect.FieldDescriptor, v protoreflect.Value, newMsg func() protoreflect.Message) protoreflect.Value {
		switch {
		case fd.Kind() == protoreflect.StringKind:
			return protoreflect.ValueOfBytes([]byte(v.String()))
		case fd.Message() != nil:
			m := newMsg()
			asBytes(v.Message(), m)
			return protoreflect.ValueOfMessage(m)
		}
		return v
	}
	src.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		dfd := dd.Fields().ByNumber(fd.Number())
		if fd.IsList() {
			l := dst.Mutable(dfd).List()
			for i := range v.List().Len() {
				l.Append(conv(fd, dfd, v.List().Get(i), func() protoreflect.Message { return l.NewElement().Message() }))
			}
			return true
		}
		dst.Set(dfd, conv(fd, dfd, v, func() protoreflect.Message { return dst.NewField(dfd).Message() }))
		return true
	})
	dst.SetUnknown(src.GetUnknown())
}

// canonicalUnknown re-encodes the tags of m's unknown fields, and of the
// messages it holds, as protowire.AppendTag does: proto.Unmarshal does so
// for generated messages but keeps a dynamic message's tags as they came.
func canonicalUnknown(m protoreflect.Message) {
	if u := m.GetUnknown(); len(u) > 0 {
		var out []byte
		for len(u) > 0 {
			num, typ, n := protowire.ConsumeTag(u)
			v := protowire.ConsumeFieldValue(num, typ, u[n:])
			out = protowire.AppendTag(out, num, typ)
			out = append(out, u[n:n+v]...)
			u = u[n+v:]
		}
		m.SetUnknown(out)
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			for i := range v.List().Len() {
				canonicalUnknown(v.List().Get(i).Message())
			}
		case fd.Message() != nil && !fd.IsMap():
			canonicalUnknown(v.Message())
		}
		return true
	})
}

// FuzzRateLimitRequest holds the decoder to protobuf-go: on any input it
// fails exactly when protobuf-go fails to decode the bytes-typed request;
// otherwise it decodes the same message, and it reports invalid UTF-8
// exactly when protobuf-go refuses the request for it, giving then the same
// message as protobuf-go does for a valid one. It never panics.
func FuzzRateLimitRequest(f *testing.F) {
	seed := func(m proto.Message) {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	seed(typical())
	seed(&rlsv3.RateLimitRequest{Domain: "d", HitsAddend: 7, Descriptors: []*commonv3.RateLimitDescriptor{{
		Entries:        []*commonv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}},
		Limit:          &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_HOUR, UnitMultiplier: wrapperspb.UInt32(3)},
		HitsAddend:     wrapperspb.UInt64(1 << 40),
		IsNegativeHits: true,
	}, {}}})
	f.Add([]byte("\x0a\x02\xff\xfe\x12\x08\x0a\x06\x0a\x01\x80\x12\x01\xc3"))
	f.Add([]byte("\x12\x04\x12\x02\x08\x01\x12\x04\x12\x02\x10\x02\xa0\x06\x05\x0b\x08\x01\x0c"))
	f.Add([]byte("\x0c"))
	f.Add([]byte("\x12\x03\x0a\x01\x0c"))
	c := New(Options{})
	f.Fuzz(func(t *testing.T, data []byte) {
		ref := bytesTypes.New().Interface()
		refErr := proto.Unmarshal(data, ref)
		var got rlsv3.RateLimitRequest
		bad, err := decodeRateLimitRequest(data, &got)
		if (err == nil) != (refErr == nil) {
			t.Fatalf("decoder error %v, protobuf-go (bytes) error %v", err, refErr)
		}
		if err != nil {
			return
		}
		canonicalUnknown(ref.ProtoReflect())
		asGot := bytesTypes.New()
		asBytes(got.ProtoReflect(), asGot)
		if !proto.Equal(asGot.Interface(), ref) {
			t.Fatalf("decoded %v\nprotobuf-go (bytes) %v", asGot, ref)
		}
		var std rlsv3.RateLimitRequest
		stdErr := proto.Unmarshal(data, &std)
		if bad != (stdErr != nil) {
			t.Fatalf("invalid UTF-8 reported %v, protobuf-go error %v", bad, stdErr)
		}
		if stdErr == nil && !proto.Equal(&got, &std) {
			t.Fatalf("decoded %v\nprotobuf-go %v", &got, &std)
		}
		// Through the codec, from a buffer split in two.
		var viaCodec rlsv3.RateLimitRequest
		half := len(data) / 2
		if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(data[:half]), mem.SliceBuffer(data[half:])}, &viaCodec); err != nil {
			t.Fatalf("codec: %v", err)
		}
		asCodec := bytesTypes.New()
		asBytes(viaCodec.ProtoReflect(), asCodec)
		if !proto.Equal(asCodec.Interface(), ref) {
			t.Fatalf("codec decoded %v", asCodec)
		}
	})
}

// The codec against the standard one on Envoy's typical request: run with
// -bench Unmarshal -benchmem.
func BenchmarkUnmarshal(b *testing.B) {
	data, _ := proto.Marshal(typical())
	for _, bc := range []struct {
		name  string
		codec encoding.CodecV2
	}{
		{"proto", encoding.GetCodecV2(protocodec.Name)},
		{"grpccodec", New(Options{})},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			in := mem.BufferSlice{mem.SliceBuffer(data)}
			for b.Loop() {
				var m rlsv3.RateLimitRequest
				if err := bc.codec.Unmarshal(in, &m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// Marshalling is the standard codec's: the codec adds one failed-error
// check.
func BenchmarkMarshal(b *testing.B) {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
		{Code: rlsv3.RateLimitResponse_OK, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Name: "per-ip", RequestsPerUnit: 100, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE}, LimitRemaining: 42},
		{Code: rlsv3.RateLimitResponse_OK}, {Code: rlsv3.RateLimitResponse_OK},
	}}
	for _, bc := range []struct {
		name  string
		codec encoding.CodecV2
	}{
		{"proto", encoding.GetCodecV2(protocodec.Name)},
		{"grpccodec", New(Options{})},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				out, err := bc.codec.Marshal(resp)
				if err != nil {
					b.Fatal(err)
				}
				out.Free()
			}
		})
	}
}
