package grpccodec

import (
	"maps"
	"testing"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// report is an RLQS usage report as Envoy sends it.
func report() *rlqsv3.RateLimitQuotaUsageReports {
	return &rlqsv3.RateLimitQuotaUsageReports{Domain: "edge", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		{BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"user": "alice", "path": "/api"}}, TimeElapsed: &durationpb.Duration{Seconds: 5}, NumRequestsAllowed: 40, NumRequestsDenied: 2},
		{BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"user": "bob"}}, TimeElapsed: &durationpb.Duration{}},
	}}
}

// bytesReports is RateLimitQuotaUsageReports with its strings declared as
// bytes and BucketId's map as a list of entry messages: protobuf-go decodes
// it without the UTF-8 check, the reference of the decoder on any input.
var bytesReports = func() protoreflect.MessageType {
	local := new(protoregistry.Files)
	fdp := protodesc.ToFileDescriptorProto((&rlqsv3.BucketId{}).ProtoReflect().Descriptor().ParentFile())
	var walk func([]*descriptorpb.DescriptorProto)
	walk = func(ms []*descriptorpb.DescriptorProto) {
		for _, m := range ms {
			if m.GetOptions().GetMapEntry() {
				m.Options = nil
			}
			for _, f := range m.Field {
				if f.GetType() == descriptorpb.FieldDescriptorProto_TYPE_STRING {
					f.Type = descriptorpb.FieldDescriptorProto_TYPE_BYTES.Enum()
					f.Options = nil
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
	d, err := local.FindDescriptorByName("envoy.service.rate_limit_quota.v3.RateLimitQuotaUsageReports")
	if err != nil {
		panic(err)
	}
	return dynamicpb.NewMessageType(d.(protoreflect.MessageDescriptor))
}()

// usageView is what a decoded report says, in plain Go: the form both the
// decoder's result and the bytes reference are compared in.
type usageView struct {
	bucket           map[string]string
	id, elapsed      bool
	secs             int64
	nanos            int32
	allowed, denied  uint64
	unknown, idUnkwn string
}

func viewOf(m *rlqsv3.RateLimitQuotaUsageReports) (string, []usageView, string) {
	var us []usageView
	for _, u := range m.GetBucketQuotaUsages() {
		v := usageView{id: u.BucketId != nil, bucket: u.GetBucketId().GetBucket(), elapsed: u.TimeElapsed != nil,
			secs: u.GetTimeElapsed().GetSeconds(), nanos: u.GetTimeElapsed().GetNanos(), allowed: u.GetNumRequestsAllowed(), denied: u.GetNumRequestsDenied(),
			unknown: string(u.ProtoReflect().GetUnknown())}
		if u.BucketId != nil {
			v.idUnkwn = string(u.BucketId.ProtoReflect().GetUnknown())
		}
		us = append(us, v)
	}
	return m.GetDomain(), us, string(m.ProtoReflect().GetUnknown())
}

func viewOfRef(m protoreflect.Message) (string, []usageView, string) {
	fd := m.Descriptor().Fields()
	var us []usageView
	l := m.Get(fd.ByNumber(reportsUsages)).List()
	for i := range l.Len() {
		u := l.Get(i).Message()
		ufd := u.Descriptor().Fields()
		v := usageView{allowed: u.Get(ufd.ByNumber(usageAllowed)).Uint(), denied: u.Get(ufd.ByNumber(usageDenied)).Uint(), unknown: string(u.GetUnknown())}
		if u.Has(ufd.ByNumber(usageBucketID)) {
			v.id = true
			id := u.Get(ufd.ByNumber(usageBucketID)).Message()
			v.idUnkwn = string(id.GetUnknown())
			es := id.Get(id.Descriptor().Fields().ByNumber(bucketIDBucket)).List()
			if es.Len() > 0 {
				v.bucket = map[string]string{}
			}
			for j := range es.Len() {
				e := es.Get(j).Message()
				efd := e.Descriptor().Fields()
				v.bucket[string(e.Get(efd.ByNumber(1)).Bytes())] = string(e.Get(efd.ByNumber(2)).Bytes())
			}
		}
		if u.Has(ufd.ByNumber(usageTimeElapsed)) {
			v.elapsed = true
			d := u.Get(ufd.ByNumber(usageTimeElapsed)).Message()
			v.secs, v.nanos = d.Get(d.Descriptor().Fields().ByNumber(1)).Int(), int32(d.Get(d.Descriptor().Fields().ByNumber(2)).Int())
		}
		us = append(us, v)
	}
	return string(m.Get(fd.ByNumber(reportsDomain)).Bytes()), us, string(m.GetUnknown())
}

func sameViews(a, b []usageView) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if !maps.Equal(x.bucket, y.bucket) || x.id != y.id || x.elapsed != y.elapsed || x.secs != y.secs || x.nanos != y.nanos ||
			x.allowed != y.allowed || x.denied != y.denied || x.unknown != y.unknown || x.idUnkwn != y.idUnkwn {
			return false
		}
	}
	return true
}

// TestUsageReportsNotUTF8: a report whose domain and bucket id hold bytes
// that are not UTF-8 (protobuf-go refuses it) decodes to those bytes, is
// counted, and the response echoing the id goes out byte-exact.
func TestUsageReportsNotUTF8(t *testing.T) {
	var id []byte
	for _, kv := range [][2]string{{"user", "\xff\xfe"}, {"p\x80", "/x"}} {
		var e []byte
		e = protowire.AppendTag(e, 1, protowire.BytesType)
		e = protowire.AppendString(e, kv[0])
		e = protowire.AppendTag(e, 2, protowire.BytesType)
		e = protowire.AppendString(e, kv[1])
		id = protowire.AppendTag(id, bucketIDBucket, protowire.BytesType)
		id = protowire.AppendBytes(id, e)
	}
	var u []byte
	u = protowire.AppendTag(u, usageBucketID, protowire.BytesType)
	u = protowire.AppendBytes(u, id)
	u = protowire.AppendTag(u, usageAllowed, protowire.VarintType)
	u = protowire.AppendVarint(u, 7)
	var data []byte
	data = protowire.AppendTag(data, reportsDomain, protowire.BytesType)
	data = protowire.AppendString(data, "d\xc3")
	data = protowire.AppendTag(data, reportsUsages, protowire.BytesType)
	data = protowire.AppendBytes(data, u)

	var std rlqsv3.RateLimitQuotaUsageReports
	if err := proto.Unmarshal(data, &std); err == nil {
		t.Fatal("protobuf-go decoded it: the test proves nothing")
	}
	invalid, repaired := 0, 0
	c := New(Options{InvalidUTF8: func() { invalid++ }, Repaired: func(string, error) { repaired++ }})
	var m rlqsv3.RateLimitQuotaUsageReports
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(data)}, &m); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"user": "\xff\xfe", "p\x80": "/x"}
	if m.GetDomain() != "d\xc3" || !maps.Equal(m.BucketQuotaUsages[0].GetBucketId().GetBucket(), want) || m.BucketQuotaUsages[0].GetNumRequestsAllowed() != 7 || invalid != 1 {
		t.Fatalf("decoded %q %q, %d invalid", m.GetDomain(), m.BucketQuotaUsages[0].GetBucketId().GetBucket(), invalid)
	}
	resp := &rlqsv3.RateLimitQuotaResponse{BucketAction: []*rlqsv3.RateLimitQuotaResponse_BucketAction{{
		BucketId: m.BucketQuotaUsages[0].GetBucketId(),
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
			AssignmentTimeToLive: &durationpb.Duration{Seconds: 15},
			RateLimitStrategy:    &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}},
		}},
	}}}
	out, err := c.Marshal(resp)
	if err != nil || repaired != 0 {
		t.Fatalf("marshal: %v, %d repaired", err, repaired)
	}
	// Read it back as a report's bucket id: the same bytes.
	b := out.Materialize()
	var f field
	r := reader{b: b}
	if ok, err := r.next(&f); !ok || err != nil {
		t.Fatal(err)
	}
	ar := reader{b: f.raw}
	var af field
	if ok, err := ar.next(&af); !ok || err != nil || af.num != actionBucketID {
		t.Fatal(err)
	}
	var back rlqsv3.BucketId
	if _, err := decodeBucketID(af.raw, &back); err != nil || !maps.Equal(back.GetBucket(), want) {
		t.Fatalf("echoed %q, %v", back.GetBucket(), err)
	}
	// A valid response encoded the same way reads back equal.
	ok := &rlqsv3.RateLimitQuotaResponse{BucketAction: []*rlqsv3.RateLimitQuotaResponse_BucketAction{
		{BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"a": "1", "b": "2"}}, BucketAction: resp.BucketAction[0].BucketAction},
		{BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"a": "3"}}, BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}}},
	}}
	enc, err := encodeQuotaResponse(ok)
	if err != nil {
		t.Fatal(err)
	}
	var got rlqsv3.RateLimitQuotaResponse
	if err := proto.Unmarshal(enc, &got); err != nil || !proto.Equal(&got, ok) {
		t.Fatalf("read back %v, %v", &got, err)
	}
}

// FuzzUsageReports holds the report decoder to protobuf-go: what it
// accepts decodes to an equal message, and on any input the decoder errs
// exactly when protobuf-go (with bytes instead of strings) does, and
// decodes what that one decodes.
func FuzzUsageReports(f *testing.F) {
	b, _ := proto.Marshal(report())
	f.Add(b)
	f.Add([]byte("\x12\x0a\x0a\x08\x0a\x06\x0a\x01k\x12\x01\xff"))
	f.Add([]byte("\x12\x06\x0a\x04\x0a\x02\x10\x01"))                   // an entry with a varint key field
	f.Add([]byte("\x12\x0c\x0a\x0a\x0a\x03\x0a\x01a\x0a\x03\x0a\x01a")) // a key given twice
	c := New(Options{})
	f.Fuzz(func(t *testing.T, data []byte) {
		ref := bytesReports.New()
		refErr := proto.Unmarshal(data, ref.Interface())
		var got rlqsv3.RateLimitQuotaUsageReports
		bad, err := decodeUsageReports(data, &got)
		if (err == nil) != (refErr == nil) {
			t.Fatalf("decoder error %v, protobuf-go (bytes) error %v", err, refErr)
		}
		if err != nil {
			return
		}
		canonicalUnknown(ref)
		gd, gu, gx := viewOf(&got)
		rd, ru, rx := viewOfRef(ref)
		if gd != rd || gx != rx || !sameViews(gu, ru) {
			t.Fatalf("decoded %q %+v %q\nprotobuf-go (bytes) %q %+v %q", gd, gu, gx, rd, ru, rx)
		}
		var std rlqsv3.RateLimitQuotaUsageReports
		stdErr := proto.Unmarshal(data, &std)
		if bad != (stdErr != nil) {
			t.Fatalf("invalid UTF-8 reported %v, protobuf-go error %v", bad, stdErr)
		}
		if stdErr == nil && !proto.Equal(&got, &std) {
			t.Fatalf("decoded %v\nprotobuf-go %v", &got, &std)
		}
		var via rlqsv3.RateLimitQuotaUsageReports
		half := len(data) / 2
		if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(data[:half]), mem.SliceBuffer(data[half:])}, &via); err != nil {
			t.Fatalf("codec: %v", err)
		}
		if vd, vu, vx := viewOf(&via); vd != gd || vx != gx || !sameViews(vu, gu) {
			t.Fatal("the codec decodes otherwise than the decoder")
		}
	})
}
