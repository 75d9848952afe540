package grpccodec

import (
	"slices"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// The field numbers of envoy.service.rate_limit_quota.v3's usage reports
// and of the messages they hold.
const (
	reportsDomain = 1 // string
	reportsUsages = 2 // repeated BucketQuotaUsage

	usageBucketID    = 1 // BucketId
	usageTimeElapsed = 2 // google.protobuf.Duration
	usageAllowed     = 3 // uint64
	usageDenied      = 4 // uint64

	bucketIDBucket = 1 // map<string, string>, entries of key 1 and value 2

	responseActions = 1 // repeated BucketAction
	actionBucketID  = 1 // BucketId

	durationSeconds = 1 // int64
	durationNanos   = 2 // int32
)

// decodeUsageReports decodes an RLQS usage report with its domain and the
// keys and values of its bucket ids taken as the bytes they are (Envoy
// builds bucket ids from headers, which may hold any byte).
func decodeUsageReports(b []byte, m *rlqsv3.RateLimitQuotaUsageReports) (bad bool, err error) {
	r := reader{b: b}
	var f field
	for {
		ok, err := r.next(&f)
		if err != nil || !ok {
			r.done(m)
			return bad, err
		}
		switch {
		case f.num == reportsDomain && f.typ == protowire.BytesType:
			var valid bool
			m.Domain, valid = str(f.raw)
			bad = bad || !valid
		case f.num == reportsUsages && f.typ == protowire.BytesType:
			u := new(rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage)
			ubad, err := decodeUsage(f.raw, u)
			if err != nil {
				return bad, err
			}
			bad = bad || ubad
			m.BucketQuotaUsages = append(m.BucketQuotaUsages, u)
		default:
			r.skip(&f)
		}
	}
}

// decodeUsage decodes (merges) one bucket's usage into m.
func decodeUsage(b []byte, m *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage) (bad bool, err error) {
	r := reader{b: b}
	var f field
	for {
		ok, err := r.next(&f)
		if err != nil || !ok {
			r.done(m)
			return bad, err
		}
		switch {
		case f.num == usageBucketID && f.typ == protowire.BytesType:
			if m.BucketId == nil {
				m.BucketId = new(rlqsv3.BucketId)
			}
			ibad, err := decodeBucketID(f.raw, m.BucketId)
			if err != nil {
				return bad, err
			}
			bad = bad || ibad
		case f.num == usageTimeElapsed && f.typ == protowire.BytesType:
			if m.TimeElapsed == nil {
				m.TimeElapsed = new(durationpb.Duration)
			}
			if err := decodeDuration(f.raw, m.TimeElapsed); err != nil {
				return bad, err
			}
		case f.num == usageAllowed && f.typ == protowire.VarintType:
			m.NumRequestsAllowed = f.varint
		case f.num == usageDenied && f.typ == protowire.VarintType:
			m.NumRequestsDenied = f.varint
		default:
			r.skip(&f)
		}
	}
}

// decodeBucketID decodes (merges) a BucketId: each map entry's key and
// value (the last of each within an entry; a missing one is ""), the last
// entry of a key winning, as protobuf-go reads a map. Unknown fields of an
// entry are dropped, as protobuf-go drops them.
func decodeBucketID(b []byte, m *rlqsv3.BucketId) (bad bool, err error) {
	r := reader{b: b}
	var f field
	for {
		ok, err := r.next(&f)
		if err != nil || !ok {
			r.done(m)
			return bad, err
		}
		if f.num != bucketIDBucket || f.typ != protowire.BytesType {
			r.skip(&f)
			continue
		}
		var k, v string
		var s string // one copy of the entry, shared by its key and value
		er := reader{b: f.raw}
		var ef field
		for {
			ok, err := er.next(&ef)
			if err != nil {
				return bad, err
			}
			if !ok {
				break
			}
			if (ef.num == 1 || ef.num == 2) && ef.typ == protowire.BytesType {
				if s == "" {
					s = string(f.raw)
				}
				val, valid := sub(s, f.raw, ef.raw)
				bad = bad || !valid
				if ef.num == 1 {
					k = val
				} else {
					v = val
				}
			}
		}
		if m.Bucket == nil {
			m.Bucket = map[string]string{}
		}
		m.Bucket[k] = v
	}
}

// decodeDuration decodes (merges) a google.protobuf.Duration into m.
func decodeDuration(b []byte, m *durationpb.Duration) error {
	r := reader{b: b}
	var f field
	for {
		ok, err := r.next(&f)
		if err != nil || !ok {
			r.done(m)
			return err
		}
		switch {
		case f.num == durationSeconds && f.typ == protowire.VarintType:
			m.Seconds = int64(f.varint)
		case f.num == durationNanos && f.typ == protowire.VarintType:
			m.Nanos = int32(f.varint)
		default:
			r.skip(&f)
		}
	}
}

// encodeQuotaResponse encodes an RLQS response with the keys and values of
// its bucket ids written as the bytes they are; everything else (which
// holds no client bytes) is protobuf-go's encoding. Map entries go in key
// order.
func encodeQuotaResponse(r *rlqsv3.RateLimitQuotaResponse) ([]byte, error) {
	var out, act []byte
	for _, a := range r.GetBucketAction() {
		act = act[:0]
		if id := a.GetBucketId(); id != nil {
			act = protowire.AppendTag(act, actionBucketID, protowire.BytesType)
			act = protowire.AppendBytes(act, appendBucketID(nil, id))
		}
		rest, err := proto.Marshal(&rlqsv3.RateLimitQuotaResponse_BucketAction{BucketAction: a.GetBucketAction()})
		if err != nil {
			return nil, err
		}
		act = append(act, rest...)
		out = protowire.AppendTag(out, responseActions, protowire.BytesType)
		out = protowire.AppendBytes(out, act)
	}
	return out, nil
}

func appendBucketID(b []byte, id *rlqsv3.BucketId) []byte {
	keys := make([]string, 0, len(id.GetBucket()))
	for k := range id.GetBucket() {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var e []byte
	for _, k := range keys {
		e = protowire.AppendTag(e[:0], 1, protowire.BytesType)
		e = protowire.AppendString(e, k)
		e = protowire.AppendTag(e, 2, protowire.BytesType)
		e = protowire.AppendString(e, id.GetBucket()[k])
		b = protowire.AppendTag(b, bucketIDBucket, protowire.BytesType)
		b = protowire.AppendBytes(b, e)
	}
	return b
}
